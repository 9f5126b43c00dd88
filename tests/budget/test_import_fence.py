"""Only plugin/ imports Hermes, and only inside functions (a plugin imports in a bare interpreter)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "hermes_bulk"
HERMES_MODULES = ("hermes_cli", "hermes_constants", "hermes_state", "agent", "cron", "tui_gateway", "gateway",
                  "run_agent", "tools")


def hermes_imports(tree: ast.AST) -> list[tuple[int, str, bool]]:
    """(line, module, at module level) of every Hermes import in a parsed file."""
    found = []
    top_level = {id(node) for node in tree.body} if isinstance(tree, ast.Module) else set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            if name.split(".")[0] in HERMES_MODULES:
                found.append((node.lineno, name, id(node) in top_level))
    return found


def test_no_module_outside_plugin_imports_hermes_and_plugin_modules_import_it_only_in_functions():
    offenders = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC)
        for line, name, top in hermes_imports(ast.parse(path.read_text(), str(path))):
            if rel.parts[0] != "plugin" or top:
                offenders.append(f"{rel}:{line} imports {name}")
    assert offenders == []


def test_the_plugin_module_imports_in_a_bare_interpreter_without_hermes_on_the_path():
    code = (f"import sys; sys.modules.update({{m: None for m in {HERMES_MODULES!r}}}); "
            "import hermes_bulk.plugin.cron_budget as p; print(callable(p.register))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"
