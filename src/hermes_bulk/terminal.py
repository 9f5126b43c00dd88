"""What the command line writes to a terminal: one-line messages, tables and live bars.

rich is loaded only for a table or a bar: a command that prints a line (`path`, `status JOB`,
an error) starts without it (issue 17: a command starts fast).
"""

from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console


def say(text: str, *, end: str = "\n") -> None:
    """One message on standard error, as it is: no markup, no wrapping."""
    sys.stderr.write(text + end)
    sys.stderr.flush()


@functools.cache
def stderr_console() -> Console:
    """The console live bars draw on (standard error, so standard output stays the answer)."""
    return _console_class()(stderr=True, highlight=False, soft_wrap=True)


def print_table(table) -> None:
    """A table on stdout: fitted to a terminal; at its natural width into a pipe or file, since
    no reader there has a width to fit (80 columns squeezed the counts of `list` to nothing)."""
    console_class = _console_class()
    if sys.stdout.isatty():
        console_class(highlight=False, soft_wrap=True).print(table)
        return
    width = console_class(width=100_000).measure(table).maximum
    console_class(file=sys.stdout, width=max(width, 20), highlight=False, soft_wrap=True).print(table)


@functools.cache
def _console_class() -> type[Console]:
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            """Rich exits 1 on its own; cli.main ends every closed pipe the same way (141, quietly)."""
            raise BrokenPipeError

    return _Console
