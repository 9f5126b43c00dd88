"""Rooms that fit in a head: no module of hermes_bulk over 600 lines, no function over 80
(issue 48). A module that needs more is two concepts; split it along the one its name says."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "hermes_bulk"

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80  # from `def` to its last line, docstring included


def modules_over(root: Path) -> dict[str, int]:
    return {
        str(path.relative_to(root)): lines
        for path in root.rglob("*.py")
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }


def functions_over(root: Path) -> dict[str, int]:
    over = {}
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    over[f"{path.relative_to(root)}:{node.name}"] = lines
    return over


def test_no_module_is_over_600_lines_and_no_function_over_80():
    assert modules_over(SRC) == {}
    assert functions_over(SRC) == {}


def test_the_limits_are_met_at_equality_and_one_line_over_is_found(tmp_path):
    def function(lines: int) -> str:
        body = "".join(f"    x{i} = {i}\n" for i in range(lines - 1))
        return f"def f{lines}():\n{body}"

    (tmp_path / "at.py").write_text(function(80) + "\n" * (600 - 80))
    (tmp_path / "over.py").write_text(function(81) + "\n" * (601 - 81))
    (tmp_path / "async.py").write_text("async " + function(81))
    assert modules_over(tmp_path) == {"over.py": 601}
    assert functions_over(tmp_path) == {"over.py:f81": 81, "async.py:f81": 81}
