"""Tables into a pipe are drawn without rich, exactly as rich draws them, and a
cell is always the text as it is: never rich markup or an emoji code (an instruction is the
user's words, `[name]` included)."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import struct
import subprocess
import sys
import termios

from hypothesis import example, given, settings
from hypothesis import strategies as st
from rich.cells import cell_len
from rich.console import Console

from hermes_bulk.frontends.terminal import (
    Column,
    Table,
    draw_plain,
    draw_rich,
    fit_to_width,
    rich_table,
    shown,
)
from hermes_bulk.frontends.views import jobs_table

ASCII = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=50)
TRICKY = st.sampled_from(
    ["", " ", "[bold]x[/bold]", "[/]", "[name]", ":smile:", "\\[x]", "a  b", "~" * 60]
)
CELLS = st.one_of(ASCII, TRICKY)


@st.composite
def tables(draw, cells=CELLS):
    columns = [
        Column(
            draw(st.one_of(ASCII, TRICKY)),
            draw(st.sampled_from(["left", "right"])),
            draw(st.one_of(st.none(), st.integers(2, 45))),
            draw(st.booleans()),
        )
        for _ in range(draw(st.integers(1, 7)))
    ]
    rows = [[draw(cells) for _ in columns] for _ in range(draw(st.integers(0, 6)))]
    return Table(draw(st.one_of(ASCII, TRICKY)), columns, rows)


@settings(max_examples=300, deadline=None)
@given(tables())
@example(
    Table(
        "Bulk jobs (newest first)",
        [Column("job"), Column("done", "right"), Column("instruction", max_width=40)],
        [["abc123", "100000", "Summarize " * 8], ["[b]x[/b]", "0", ":thumbs_up: [/]"]],
    )
)
def test_a_plain_drawing_is_rich_s_drawing(table):
    plain = draw_plain(table)
    if all(col.no_wrap for col in table.columns):
        assert plain is not None, (
            "every printable-ASCII table that rich would not wrap is drawn without rich"
        )
    if plain is not None:
        assert plain == draw_rich(table)


@settings(max_examples=100, deadline=None)
@given(
    tables(
        cells=st.sampled_from(["é [bold]x[/bold]", "日本語 :smile:", "tab\there", "[red]ü[/red]"])
    )
)
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
    env = {
        "HERMES_BULK_HOME": str(tmp_path / "home"),
        "HOME": str(tmp_path),
        "PATH": os.environ["PATH"],
        "HERMES_BULK_MODEL": "m",
    }
    (tmp_path / "a.txt").write_text("hello")
    instruction = "Extract [name], [b]x[/b] :smile:"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "hermes_bulk",
            "create",
            instruction,
            "--over",
            str(tmp_path / "a.txt"),
        ],
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )
    code = (
        "import json, sys\nfrom hermes_bulk.frontends import cli\nstatus = cli.main(['list'])\n"
        "print(json.dumps(sorted(sys.modules)), file=sys.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert instruction in proc.stdout, proc.stdout
    assert not any(
        m.split(".")[0] == "rich" for m in __import__("json").loads(proc.stderr.splitlines()[-1])
    )


def _on_terminal(table: Table, width: int) -> list[str]:
    """The lines print_table shows on a terminal `width` columns wide, styles taken out."""
    out = io.StringIO()
    Console(
        file=out,
        width=width,
        force_terminal=True,
        highlight=False,
        soft_wrap=True,
        markup=False,
        emoji=False,
    ).print(rich_table(fit_to_width(shown(table), width)))
    return re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue()).splitlines()


STATES = st.sampled_from(
    ["not started", "running", "paused", "awaiting recovery", "completed_with_errors"]
)


@st.composite
def job_rows(draw):
    return [
        [
            draw(st.text("0123456789abcdef", min_size=12, max_size=12)),
            draw(STATES),
            f"{draw(st.integers(0, 10**7))}/{draw(st.integers(0, 10**7))}",
            str(draw(st.integers(0, 10**7))),
            draw(st.sampled_from(["?", "$0.00", "$0.0042", "$12.35", "$1,234,567.89"])),
            "2026-12-02 04:42",
            # No box-drawing characters: the test splits a row on its borders (│).
            draw(
                st.text(
                    st.characters(
                        min_codepoint=32,
                        max_codepoint=0x30FF,
                        exclude_characters="".join(map(chr, range(0x2500, 0x2580))),
                    ),
                    max_size=90,
                )
            ),
        ]
        for _ in range(draw(st.integers(1, 5)))
    ]


@settings(max_examples=150, deadline=None)
@given(job_rows(), st.integers(60, 240))
def test_list_on_a_terminal_keeps_every_count_whole(rows, width):
    """On a terminal wide enough for a job's id, state, counts, cost and date (80 columns, for
    counts up to five digits), `list` shows them whole: the instruction gives way, down to its
    header's 11 characters, then goes. Never a line wider than the terminal."""
    table = Table(
        "Bulk jobs (newest first)",
        [
            Column("job"),
            Column("state"),
            Column("done", "right"),
            Column("failed", "right"),
            Column("cost", "right"),
            Column("created"),
            Column("instruction", max_width=40),
        ],
        rows,
    )
    lines = _on_terminal(table, width)
    assert all(cell_len(line) <= width for line in lines), lines
    fixed = (
        sum(
            max(len(c.header), *(len(row[i]) for row in rows))
            for i, c in enumerate(table.columns[:6])
        )
        + 19
    )
    if width < fixed:
        return  # too narrow for the fixed columns: rich cuts them all alike
    body = lines[4 : 4 + len(rows)]
    for row, line in zip(rows, body, strict=True):
        cells = [cell.strip() for cell in line.strip("│").split("│")]
        assert cells[:6] == row[:6], (cells, row)
        assert (len(cells) == 7) == (width >= fixed + 14), (
            "the instruction shows wherever 10 characters of it (and its header) fit"
        )


def test_the_list_table_is_the_one_measured():
    """jobs_table's columns are the ones the test above fits (a changed column must change it
    too)."""
    assert [(c.header, c.justify, c.max_width) for c in jobs_table([]).columns] == [
        ("job", "left", None),
        ("state", "left", None),
        ("done", "right", None),
        ("failed", "right", None),
        ("cost", "right", None),
        ("created", "left", None),
        ("instruction", "left", 40),
    ]


def test_list_in_an_80_column_terminal_shows_the_counts(tmp_path):
    """`hermes-bulk list` in a real pseudo-terminal of 80 columns: rich alone cut the done,
    failed and total columns to nothing there."""
    env = {
        "HERMES_BULK_HOME": str(tmp_path / "home"),
        "HOME": str(tmp_path),
        "PATH": os.environ["PATH"],
        "HERMES_BULK_MODEL": "m",
        "TERM": "xterm-256color",
    }
    for i in range(3):
        (tmp_path / f"{i}.txt").write_text(f"text {i}")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "hermes_bulk",
            "create",
            "Summarize each of these texts in a line",
            "--over",
            str(tmp_path),
        ],
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )
    master, terminal = pty.openpty()  # a terminal of 24 rows and 80 columns
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "hermes_bulk", "list"],
        env=env,
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        start_new_session=True,
    )
    os.close(terminal)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the command closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert proc.wait(timeout=60) == 0
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode()).splitlines()
    assert all(len(line) <= 80 for line in screen), screen
    row = next(line for line in screen if "not started" in line)
    assert [cell.strip() for cell in row.strip("│").split("│")][2:5] == ["0/3", "0", "?"], screen


def test_a_control_character_never_reaches_the_terminal():
    """An instruction (from --instruction-file) may hold an ESC or a DEL: a table shows U+FFFD,
    and tabs and line breaks as spaces, on both drawings."""
    table = shown(Table("t", [Column("instruction")], [["a\x1b[2Jb\x7fc\td\ne\x9b"]]))
    assert table.rows == [["a\ufffd[2Jb\ufffdc d e\ufffd"]]
    assert "\x1b" not in draw_rich(table) and draw_plain(table) is None


def test_the_plain_drawing_uses_the_characters_of_richs_box_of_the_one_style():
    from rich import box

    from hermes_bulk.frontends.terminal import BOX_LINES, BOX_NAME

    b = getattr(box, BOX_NAME)
    assert {
        "top": b.top_left + b.top + b.top_divider + b.top_right,
        "head": b.head_left + " " + b.head_vertical + b.head_right,
        "head_row": b.head_row_left + b.head_row_horizontal + b.head_row_cross + b.head_row_right,
        "row": b.mid_left + " " + b.mid_vertical + b.mid_right,
        "bottom": b.bottom_left + b.bottom + b.bottom_divider + b.bottom_right,
    } == BOX_LINES
