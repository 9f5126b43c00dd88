"""What the command line writes to a terminal: one-line messages, tables and live bars.

rich is loaded only for a bar or a table drawn on a terminal: a command that prints a line
(`path`, `status JOB`, an error) or a table into a pipe or file starts without it, so that it
starts fast (docs/benchmarks.md, row 7).
"""

from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console


def say(text: str, *, end: str = "\n") -> None:
    """One message on standard error: no markup; on a terminal, wrapped at spaces to its width."""
    width = terminal_width(sys.stderr)
    sys.stderr.write((wrap(text, width) if width and end == "\n" else text) + end)
    sys.stderr.flush()


#: Where no terminal gives a width (a /bulk or /cron-budget reply in Hermes): lines fit this many
#: columns. Not 80: Hermes' TUI shows a reply in its transcript (a gutter of 3 and a margin of 4)
#: or, when longer, in a framed pager (6 columns of frame), and wraps again whatever is wider, so
#: at 80 columns a line of 74 to 80 comes out broken twice. 72 fits both.
CHAT_WIDTH = 72
_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def terminal_width(stream) -> int | None:
    """The columns of the terminal a stream writes to; None for a pipe or a file."""
    try:
        if not stream.isatty():
            return None
        import os

        return os.get_terminal_size(stream.fileno()).columns or None
    except (AttributeError, OSError, ValueError):
        return None


def fill(paragraph: str, width: int) -> str:
    """Prose (one paragraph, its words on one line) broken at spaces into lines of width, without
    the hanging indent wrap() gives a continued line: what a help text's paragraphs are."""
    import textwrap

    return textwrap.fill(paragraph, width, break_long_words=False, break_on_hyphens=False)


def wrap(text: str, width: int) -> str:
    """Each line longer than width broken at spaces, its continuation indented as the line is
    (two more spaces for a line that is not indented): no word is cut, so no number is lost."""
    import textwrap

    out = []
    for line in text.split("\n"):
        if len(_ESCAPE.sub("", line)) <= width or _ESCAPE.search(line):
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip(" "))]
        out += textwrap.wrap(
            line,
            width,
            initial_indent="",
            subsequent_indent=indent or "  ",
            break_long_words=False,
            break_on_hyphens=False,
            drop_whitespace=True,
        ) or [line]
    return "\n".join(out)


class WrappedStdout:
    """Standard output on a terminal, each line wrapped to its width as it is written (the
    commands print plain text; tables and bars are fitted by rich already)."""

    def __init__(self, stream, width: int) -> None:
        self.stream, self.width, self.pending = stream, width, ""

    def write(self, text: str) -> int:
        self.pending += text
        if "\n" in self.pending:
            lines, self.pending = self.pending.rsplit("\n", 1)
            self.stream.write(wrap(lines, self.width) + "\n")
        return len(text)

    def flush(self) -> None:
        if self.pending:
            self.stream.write(wrap(self.pending, self.width))
            self.pending = ""
        self.stream.flush()

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


@functools.cache
def stderr_console() -> Console:
    """The console live bars draw on (standard error, so standard output stays the answer)."""
    return _console_class()(stderr=True, highlight=False, soft_wrap=True)


@dataclass(frozen=True)
class Column:
    header: str
    justify: str = "left"  #: or "right"
    max_width: int | None = (
        None  #: longer cells end in "…"; on a narrow terminal it gives way first
    )
    no_wrap: bool = True  #: on a narrow terminal, cut (True) or wrap (False) the cell
    #: a wrapping cell's word longer than the column is folded over lines, never cut (a URL, a
    #: host name: what it says is the whole of it); such a column gives way to FOLD_MIN
    fold: bool = False


@dataclass
class Table:
    """A table as data: what it says, not how it is drawn."""

    title: str
    columns: list[Column]
    rows: list[list[str]] = field(default_factory=list)


def print_table(table: Table) -> None:
    """A table on stdout: fitted to a terminal; at its natural width into a pipe or file, since no
    reader there has a width to fit. Cells are text as it is, never rich markup or emoji codes
    (a job's instruction is the user's), and never a control character: an escape sequence in an
    instruction file would otherwise reach the terminal."""
    table = shown(table)
    if sys.stdout.isatty():
        console = _console_class()(highlight=False, soft_wrap=True, markup=False, emoji=False)
        console.print(rich_table(fit_to_width(table, console.width)))
        return
    drawn = draw_plain(table)
    sys.stdout.write(drawn if drawn is not None else draw_rich(table))


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def shown(table: Table) -> Table:
    """The table with every control character made visible: tabs and line breaks as spaces,
    the rest (an ESC, a DEL) as U+FFFD."""

    def clean(text: str) -> str:
        return _CONTROL.sub(lambda m: " " if m.group() in "\t\n\r" else "\ufffd", text)

    return Table(
        clean(table.title),
        [replace(col, header=clean(col.header)) for col in table.columns],
        [[clean(cell) for cell in row] for row in table.rows],
    )


#: A column that gives way on a narrow terminal keeps at least this many characters, or goes.
FLEXIBLE_MIN = 10
#: A folding column gives way down to this many characters (or its header), its words folded.
FOLD_MIN = 20


def fit_to_width(table: Table, width: int) -> Table:
    """The table for a terminal `width` columns wide: the columns with a max_width give way
    down to FLEXIBLE_MIN (or their header), then the wrapping columns, widest first, down to
    their longest word (a folding one to FOLD_MIN, its longer words folded over lines), then
    the columns that gave way leave the table. Left to rich, a wide table loses the same share
    of every column, which cuts short columns such as the counts of `list` to "1…" or nothing."""
    from rich.cells import cell_len

    def natural(col: Column, cells: list[str]) -> int:
        widest = max(cell_len(cell) for cell in [col.header, *cells])
        return min(widest, col.max_width) if col.max_width else widest

    columns = list(table.columns)
    widths = [natural(col, [row[i] for row in table.rows]) for i, col in enumerate(columns)]
    excess = sum(widths) + 3 * len(columns) + 1 - width
    for i, col in enumerate(columns):
        floor = max(FLEXIBLE_MIN, cell_len(col.header))  # a header is never cut
        if excess > 0 and col.max_width and widths[i] > floor:
            give = min(excess, widths[i] - floor)
            columns[i] = replace(col, max_width=widths[i] - give)
            excess -= give
    # Then a wrapping column gives way down to its longest word: "completed with errors" shows
    # whole over two lines rather than cut to "completed with erro…". Only when that is not
    # enough do the columns that gave way leave, and the wrapping ones give only what is left.
    wrapping = {
        i: min(
            max(
                cell_len(word)
                for cell in [col.header, *(row[i] for row in table.rows)]
                for word in cell.split() or [""]
            ),
            max(FOLD_MIN, cell_len(col.header)) if col.fold else width,
        )
        for i, col in enumerate(columns)
        if not col.no_wrap
    }
    if excess > sum(max(widths[i] - longest, 0) for i, longest in wrapping.items()):
        keep = [i for i, col in enumerate(columns) if not col.max_width]
        excess -= sum(widths[i] + 3 for i in range(len(columns)) if i not in keep)
    else:
        keep = list(range(len(columns)))
    # The widest wrapping column gives a character at a time, so they end up alike rather than
    # the first one squeezed to its floor while the last keeps room it does not need.
    narrowed = dict.fromkeys(wrapping, 0)
    while excess > 0:
        room = [i for i, floor in wrapping.items() if widths[i] - narrowed[i] > floor]
        if not room:
            break
        narrowed[max(room, key=lambda i: widths[i] - narrowed[i])] += 1
        excess -= 1
    for i, give in narrowed.items():
        if give > 0:
            columns[i] = replace(columns[i], max_width=widths[i] - give)
    return Table(
        table.title, [columns[i] for i in keep], [[row[i] for i in keep] for row in table.rows]
    )


def draw_rich(table: Table) -> str:
    """The table as rich draws it at its natural width, without a terminal."""
    import io

    drawn, out = rich_table(table), io.StringIO()
    width = _console_class()(width=100_000, markup=False, emoji=False).measure(drawn).maximum
    _console_class()(
        file=out, width=max(width, 20), highlight=False, soft_wrap=True, markup=False, emoji=False
    ).print(drawn)
    return out.getvalue()


_PLAIN = re.compile(r"[ -~]*")  # printable ASCII: one character, one column

#: The one style of every table, however it is drawn: rich's box of this name, whose characters
#: draw_plain draws (left, fill, cross, right of each line; tests/test_terminal_tables.py holds
#: them equal to rich's).
BOX_NAME = "HEAVY_HEAD"
BOX_LINES = {"top": "┏━┳┓", "head": "┃ ┃┃", "head_row": "┡━╇┩", "row": "│ ││", "bottom": "└─┴┘"}


def draw_plain(table: Table) -> str | None:
    """The table as rich draws it at its natural width without a terminal (box HEAVY_HEAD, no
    styles), without loading rich; None where a cell is not printable ASCII, whose width on
    screen only rich knows. tests/test_terminal_tables.py holds the two drawings equal."""
    cells = (
        [table.title]
        + [c.header for c in table.columns]
        + [cell for row in table.rows for cell in row]
    )
    if not all(_PLAIN.fullmatch(cell) for cell in cells):
        return None
    if any(
        col.max_width is not None and not col.no_wrap and len(cell.rstrip()) > col.max_width
        for row in [[c.header for c in table.columns], *table.rows]
        for cell, col in zip(row, table.columns, strict=True)
    ):
        return None  # rich wraps it over lines
    headers = [col.header for col in table.columns]
    fitted = [
        [_fit(cell, col) for cell, col in zip(row, table.columns, strict=True)]
        for row in [headers, *table.rows]
    ]
    widths = [max(len(text) for text in column) for column in zip(*fitted, strict=True)]

    def line(name: str) -> str:
        left, fill, cross, right = BOX_LINES[name]
        return left + cross.join(fill * (width + 2) for width in widths) + right + "\n"

    def cells_line(name: str, texts: list[str]) -> str:
        left, _, between, right = BOX_LINES[name]
        # Right-justified text loses its trailing spaces first (the width was measured with them).
        padded = (
            _fit(text.rstrip(), col).rjust(width)
            if col.justify == "right"
            else _fit(text, col).ljust(width)
            for text, width, col in zip(texts, widths, table.columns, strict=True)
        )
        return left + between.join(f" {text} " for text in padded) + right + "\n"

    return "".join(
        [
            table.title + "\n" if table.title else "",
            line("top"),
            cells_line("head", headers),
            line("head_row"),
            *(cells_line("row", row) for row in table.rows),
            line("bottom"),
        ]
    )


def _fit(text: str, column: Column) -> str:
    """A cell cut to its column's max_width as rich cuts it: a no_wrap cell ends in "…"; a
    wrapping one (whose text fits, draw_plain checked) loses the trailing spaces that overflow."""
    width = column.max_width
    if width is None or len(text) <= width:
        return text
    if column.no_wrap:
        return text[: width - 1] + "…"
    return text[:width] if not text[width:].strip(" ") else text


def rich_table(table: Table):
    from rich import box
    from rich.table import Table as RichTable

    drawn = RichTable(title=table.title, box=getattr(box, BOX_NAME))
    for col in table.columns:
        overflow = "fold" if col.fold else "ellipsis"
        options = {"overflow": overflow, "max_width": col.max_width} if col.max_width else {}
        drawn.add_column(col.header, justify=col.justify, no_wrap=col.no_wrap, **options)
    for row in table.rows:
        drawn.add_row(*row)
    return drawn


@functools.cache
def _console_class() -> type[Console]:
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            """Rich exits 1 on its own; cli.main ends every closed pipe the same way (141,
            quietly)."""
            raise BrokenPipeError

    return _Console
