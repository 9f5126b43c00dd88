"""Tables into a pipe are drawn without rich, exactly as rich draws them (issue 17.9), and a
cell is always the text as it is: never rich markup or an emoji code (an instruction is the
user's words, `[name]` included)."""

from __future__ import annotations

import os
import subprocess
import sys

from hypothesis import example, given, settings
from hypothesis import strategies as st

from hermes_bulk.terminal import Column, Table, draw_plain, draw_rich

ASCII = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=50)
TRICKY = st.sampled_from(["", " ", "[bold]x[/bold]", "[/]", "[name]", ":smile:", "\\[x]", "a  b", "~" * 60])
CELLS = st.one_of(ASCII, TRICKY)


@st.composite
def tables(draw, cells=CELLS):
    columns = [Column(draw(st.one_of(ASCII, TRICKY)), draw(st.sampled_from(["left", "right"])),
                      draw(st.one_of(st.none(), st.integers(2, 45))), draw(st.booleans()))
               for _ in range(draw(st.integers(1, 7)))]
    rows = [[draw(cells) for _ in columns] for _ in range(draw(st.integers(0, 6)))]
    return Table(draw(st.one_of(ASCII, TRICKY)), columns, rows)


@settings(max_examples=300, deadline=None)
@given(tables())
@example(Table("Bulk jobs (newest first)", [Column("job"), Column("done", "right"), Column("instruction", max_width=40)],
               [["abc123", "100000", "Summarize " * 8], ["[b]x[/b]", "0", ":thumbs_up: [/]"]]))
def test_a_plain_drawing_is_rich_s_drawing(table):
    plain = draw_plain(table)
    if all(col.no_wrap for col in table.columns):
        assert plain is not None, "every printable-ASCII table that rich would not wrap is drawn without rich"
    if plain is not None:
        assert plain == draw_rich(table)


@settings(max_examples=100, deadline=None)
@given(tables(cells=st.sampled_from(["é [bold]x[/bold]", "日本語 :smile:", "tab\there", "[red]ü[/red]"])))
def test_cells_rich_must_draw_stay_text(table):
    if not table.rows:
        return
    assert draw_plain(table) is None, "a cell rich measures is rich's to draw"
    drawn = draw_rich(table)
    for row in table.rows:
        for cell, column in zip(row, table.columns, strict=True):
            if column.max_width is None and "\t" not in cell:
                assert cell in drawn, (cell, drawn)


def test_list_into_a_pipe_shows_an_instruction_as_typed_without_rich(tmp_path):
    """The whole path: `hermes-bulk list` into a pipe prints the user's brackets and colons, and
    loads no rich to do it."""
    env = {"HERMES_BULK_HOME": str(tmp_path / "home"), "HOME": str(tmp_path), "PATH": os.environ["PATH"],
           "HERMES_BULK_MODEL": "m"}
    (tmp_path / "a.txt").write_text("hello")
    instruction = "Extract [name], [b]x[/b] :smile:"
    subprocess.run([sys.executable, "-m", "hermes_bulk", "create", instruction, "--over", str(tmp_path / "a.txt")],
                   env=env, check=True, capture_output=True, timeout=60)
    code = ("import json, sys\nfrom hermes_bulk import cli\nstatus = cli.main(['list'])\n"
            "print(json.dumps(sorted(sys.modules)), file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert instruction in proc.stdout, proc.stdout
    assert not any(m.split(".")[0] == "rich" for m in __import__("json").loads(proc.stderr.splitlines()[-1]))
