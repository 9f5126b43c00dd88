"""The import rules, checked on the source so they cannot erode quietly.

- Only the plugin's fence modules import Hermes (hermes_cli, hermes_constants, agent, …) or the
  SDK Hermes raises and validates (openai), and only inside functions: importing hermes_bulk,
  or a plugin, needs nothing but hermes-bulk (a validator may import a plugin in a bare
  interpreter).
- Nothing in the core imports the plugin, not even lazily: the CLI's worker finds the kinds of
  model client the plugin adds by entry-point group (runtime/client_kinds.py), never by name.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "hermes_bulk"
HERMES_MODULES = (
    "hermes_cli",
    "hermes_constants",
    "hermes_state",
    "hermes_logging",
    "agent",
    "gateway",
    "tui_gateway",
    "cron",
    "run_agent",
    "tools",
    "openai",
)
#: /bulk's Hermes APIs (ctx.llm; the profile's config), the cron budget's, and the provider-shaped
#: answers a held cron call returns.
FENCE = {
    Path("plugin/hermes.py"),
    Path("plugin/hermes_config.py"),
    Path("plugin/hermes_budget.py"),
    Path("plugin/held_response.py"),
}


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


def plugin_imports(path: Path, src: Path = SRC) -> list[str]:
    """Every import of hermes_bulk.plugin in a file, at any depth and in any spelling: `from .plugin
    import x`, `from . import plugin`, `import hermes_bulk.plugin.x`, `from hermes_bulk import
    plugin`, and a module name given to importlib as a string."""
    package = path.relative_to(src.parent).with_suffix("").parts[:-1]  # ("hermes_bulk", …)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if _is_plugin(a.name)]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1] if node.level else ())
            module = ".".join(p for p in (base, node.module or "") if p)
            if _is_plugin(module) or any(_is_plugin(f"{module}.{a.name}") for a in node.names):
                found.append(
                    f"{node.lineno}: from {'.' * node.level}{node.module or ''} import "
                    + ", ".join(a.name for a in node.names)
                )
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and _is_plugin(node.value)
        ):
            found.append(f"{node.lineno}: names {node.value!r}")
    return found


def _is_plugin(module: str) -> bool:
    return module == "hermes_bulk.plugin" or module.startswith("hermes_bulk.plugin.")


def test_the_core_does_not_import_the_plugin():
    offenders = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC)
        if rel.parts[0] != "plugin":
            offenders += [f"{rel}:{line}" for line in plugin_imports(path)]
    assert offenders == []


def test_every_spelling_of_importing_the_plugin_is_seen(tmp_path):
    module = tmp_path / "hermes_bulk" / "store" / "probe.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "from ..plugin import bulk\ndef later():\n    from .. import plugin\n    import "
        "hermes_bulk.plugin.hermes\n    from hermes_bulk import plugin as p\n    import importlib; "
        "importlib.import_module('hermes_bulk.plugin.background')\nfrom .. import jobs, "
        "views\nfrom . import plugin_like\n"
    )
    found = plugin_imports(module, tmp_path / "hermes_bulk")
    assert [f.split(":")[0] for f in found] == ["1", "3", "4", "5", "6"], found


@pytest.mark.parametrize("module", ["hermes_bulk.plugin.bulk", "hermes_bulk.plugin.cron_budget"])
def test_each_plugin_imports_without_hermes(module):
    blocked = list(HERMES_MODULES)  # None in sys.modules: importing them fails
    code = (
        f"import sys; sys.modules.update(dict.fromkeys({blocked!r})); import {module} as p; "
        "print(callable(p.register))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "True", proc.stderr
