"""CSV export cells that a spreadsheet would run are neutralised: every formula start, every column.

An item's name is the user's file name, and a file may be named `=HYPERLINK(…).txt`, `@cmd.txt`,
or start with a tab or a carriage return (both legal in POSIX names): the `item` column then
starts with a formula character. A real job over such a folder is exported, and every cell is
checked as a spreadsheet reads it (OWASP's CSV-injection list: = + - @ tab CR).
"""

from __future__ import annotations

import csv

import pytest

from hermes_bulk.jobs.export import neutralise

FORMULA_STARTS = ["=", "+", "-", "@", "\t", "\r"]


@pytest.mark.parametrize("start", FORMULA_STARTS, ids=repr)
def test_each_formula_start_gets_an_apostrophe(start):
    assert neutralise(f"{start}1+1") == f"'{start}1+1"


@pytest.mark.parametrize("cell", ["plain", "1+1", " =x", "'=x", "", "ANSWER[=]"])
def test_other_cells_are_left_as_they_are(cell):
    assert neutralise(cell) == cell


def test_item_names_that_start_a_formula_are_neutralised_in_the_csv_export(cli, tmp_path):
    folder = tmp_path / "names"
    folder.mkdir()
    names = [f"{start}x{i}.txt" for i, start in enumerate(FORMULA_STARTS)] + ["plain.txt"]
    for i, name in enumerate(names):
        (folder / name).write_text(f"item {i}\n")
    job_id = cli.create("Echo", folder)
    cli("run", job_id, "--wait")
    out = tmp_path / "r.csv"
    cli("export", job_id, "--format", "csv", "--output", str(out))
    with out.open(encoding="utf-8-sig", newline="") as f:  # newline="": a CR in a cell stays a CR
        rows = list(csv.reader(f))
    cells = {row[0] for row in rows[1:]}
    assert cells == {f"'{name}" for name in names[:-1]} | {"plain.txt"}
    for row in rows[1:]:
        assert all(not cell.startswith(tuple(FORMULA_STARTS)) for cell in row), row
