"""The import rules, checked on the source so they cannot erode quietly.

- Only the plugin's fence modules import Hermes (hermes_cli, hermes_constants, agent, …) or the
  SDK Hermes raises and validates (openai), and only inside functions: importing hermes_bulk,
  or a plugin, needs nothing but hermes-bulk (a validator may import a plugin in a bare
  interpreter).
- Nothing in the core imports the plugin, except the CLI, lazily, to serve jobs created in Hermes.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "hermes_bulk"
HERMES_MODULES = ("hermes_cli", "hermes_constants", "hermes_state", "hermes_logging", "agent", "gateway",
                  "tui_gateway", "cron", "run_agent", "tools", "openai")
#: /bulk's Hermes APIs, the cron budget's, and the provider-shaped answers a held cron call returns.
FENCE = {Path("plugin/hermes.py"), Path("plugin/hermes_budget.py"), Path("plugin/held_response.py")}


def imports(path: Path) -> list[tuple[int, str, bool]]:
    """(line, module, at module level) for every absolute import in a file."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module, id(node) in top))
    return found


def test_only_the_fence_modules_import_hermes_and_only_inside_functions():
    offenders = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC)
        for line, module, top_level in imports(path):
            if module.split(".")[0] in HERMES_MODULES and (rel not in FENCE or top_level):
                offenders.append(f"{rel}:{line} imports {module}")
    assert offenders == []


def test_the_core_does_not_import_the_plugin():
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC)
        if rel.parts[0] == "plugin" or rel == Path("cli.py"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and "plugin" in node.module.split("."):
                raise AssertionError(f"{rel} imports {node.module}")


@pytest.mark.parametrize("module", ["hermes_bulk.plugin.bulk", "hermes_bulk.plugin.cron_budget"])
def test_each_plugin_imports_without_hermes(module):
    blocked = list(HERMES_MODULES)  # None in sys.modules: importing them fails
    code = (f"import sys; sys.modules.update(dict.fromkeys({blocked!r})); import {module} as p; "
            "print(callable(p.register))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "True", proc.stderr
