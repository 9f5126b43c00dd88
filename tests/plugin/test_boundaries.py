"""The plugin's import rules, checked on the source so they cannot erode quietly.

- Only plugin/hermes.py imports Hermes (hermes_cli, hermes_constants, agent, …) or the SDKs
  Hermes raises (openai), and only inside functions: importing hermes_bulk, or the plugin,
  needs nothing but hermes-bulk (a validator may import a plugin in a bare interpreter).
- Nothing in the core imports the plugin, except the CLI's worker, lazily, to serve jobs
  created in Hermes.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "hermes_bulk"
HERMES_MODULES = ("hermes_cli", "hermes_constants", "hermes_state", "hermes_logging", "agent", "gateway",
                  "tui_gateway", "cron", "openai")


def imports(path: Path) -> list[tuple[str, bool]]:
    """(module, at module level) for every import in a file."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, id(node) in top))
    return found


def test_only_plugin_hermes_imports_hermes_and_only_inside_functions():
    for path in SRC.rglob("*.py"):
        for module, top_level in imports(path):
            if module.split(".")[0] in HERMES_MODULES:
                assert path == SRC / "plugin" / "hermes.py", f"{path.relative_to(SRC)} imports {module}"
                assert not top_level, f"plugin/hermes.py imports {module} at module level"


def test_the_core_does_not_import_the_plugin():
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC)
        if rel.parts[0] == "plugin" or rel == Path("cli.py"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and "plugin" in node.module.split("."):
                raise AssertionError(f"{rel} imports {node.module}")


def test_the_plugin_imports_without_hermes():
    blocked = list(HERMES_MODULES)  # None in sys.modules: importing them fails
    code = (f"import sys; sys.modules.update(dict.fromkeys({blocked!r})); import hermes_bulk.plugin.bulk as b; "
            "print(callable(b.register))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "True", proc.stderr
