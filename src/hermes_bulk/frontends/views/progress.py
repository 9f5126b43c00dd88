"""Watching a job run: the live bar in a terminal, a plain progress line elsewhere, and what
Ctrl-C says while answers on their way are saved."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ...durations import zoned_clock
from ...jobs.service import Jobs, JobStatus, state_label
from ...words import count
from .times import format_seconds

if TYPE_CHECKING:  # rich is loaded for a bar, not for a line of text
    from rich.console import Console


def stopping_lines(on_their_way: int, timeout_s: float) -> list[str]:
    """What the first Ctrl-C of `run --wait` says (each line fits 80 columns): that nothing new
    starts, how many answers on their way are saved first and for how long at most, and that a
    second Ctrl-C abandons them."""
    if not on_their_way:
        return ["Stopping: no new item starts, and no answer is on its way."]
    one = on_their_way == 1
    them = "the answer on its way is" if one else f"the {on_their_way:,} answers on their way are"
    return [
        f"Stopping: no new item starts; {them} saved first",
        f"(up to {format_seconds(timeout_s)}). Ctrl-C again to abandon "
        f"{'it: it' if one else 'them: they'} will be asked again.",
    ]


def stopped_line(on_their_way: int, saved: int, drained: bool, timeout_s: float) -> str:
    """How the wait for the answers on their way ended."""
    if not on_their_way:
        return "Stopped."
    of = f"{saved:,} of {count(on_their_way, 'answer')} saved"
    if not drained:
        return f"Stopped ({format_seconds(timeout_s)} passed): {of}; the rest will be asked again."
    if saved == on_their_way:
        return (
            f"Stopped: {'the answer was' if saved == 1 else f'all {saved:,} answers were'} saved."
        )
    return f"Stopped: {of} (the others failed, or will be asked again)."


def abandoned_line(on_their_way: int) -> str:
    """What the second Ctrl-C says."""
    if not on_their_way:
        return "Stopped."
    items = "its item goes" if on_their_way == 1 else f"their {on_their_way:,} items go"
    return f"Abandoned: {items} back to the queue and will be asked again."


def follow(
    jobs: Jobs,
    job_id: str,
    console: Console,
    *,
    until: Callable[[JobStatus], bool],
    interval_s: float = 0.5,
    timeout_s: float | None = None,
) -> JobStatus:
    """A live progress bar until `until(status)` or timeout_s; returns the last status."""
    deadline_s = None if timeout_s is None else time.monotonic() + timeout_s
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.table import Column as RichColumn
    from rich.text import Text

    class TwoLines(Progress):
        """The figures on a line of their own above the bar: at 80 columns nothing is cut."""

        header = Text()

        def get_renderables(self):
            yield self.header
            yield self.make_tasks_table(self.tasks)

    # Fixed widths: rich shrinks a column to "0:…" when the line is short of room. Each time
    # is followed by its word: "12/50 0:00:40 left 0:00:10 elapsed".
    columns = (
        BarColumn(bar_width=None),
        MofNCompleteColumn(table_column=RichColumn(no_wrap=True, min_width=9)),
        TimeRemainingColumn(table_column=RichColumn(no_wrap=True, min_width=7)),
        TextColumn("left"),
        TimeElapsedColumn(table_column=RichColumn(no_wrap=True, min_width=7)),
        TextColumn("elapsed"),
    )
    with TwoLines(
        *columns, console=console, transient=False, expand=console.width < 100
    ) as progress:
        task = progress.add_task(job_id, total=None)
        while True:
            st = jobs.status(job_id)
            j = st.job
            detail = (
                f"{job_id} {state_label(st.state)}: {j.failed} failed, {j.running} running, "
                f"{count(j.tokens_in + j.tokens_out, 'token')}"
            )
            if st.rate_limit:
                detail += f"\nrate limited until {zoned_clock(st.rate_limit.until)}"
            progress.header = Text(detail, no_wrap=False, overflow="fold")
            progress.update(task, total=j.total, completed=j.completed + j.failed)
            if until(st) or (deadline_s is not None and time.monotonic() >= deadline_s):
                progress.refresh()
                return st
            time.sleep(interval_s)


#: Without a terminal (a log, CI), a plain progress line this often: a bar there draws nothing
#: until the end, and then one line cut at 80 columns.
PROGRESS_LINE_EVERY_S = 5.0


def progress_line(st: JobStatus, rate_per_s: float | None) -> str:
    """One plain line of progress: done/failed/total, the rate and the time left at that rate."""
    j = st.job
    line = (
        f"job {j.job_id}: {j.completed:,}/{j.total:,} done, {j.failed:,} failed, "
        f"{state_label(st.state)}"
    )
    if rate_per_s:
        left_s = max(j.total - j.completed - j.failed, 0) / rate_per_s
        line += f", {rate_per_s:.1f} items/s, about {left_s:.0f} s left"
    if st.rate_limit:
        line += f", rate limited until {zoned_clock(st.rate_limit.until)}"
    return line


def follow_lines(
    jobs: Jobs,
    job_id: str,
    write: Callable[[str], None],
    *,
    until: Callable[[JobStatus], bool],
    every_s: float = PROGRESS_LINE_EVERY_S,
    interval_s: float = 0.5,
    timeout_s: float | None = None,
) -> JobStatus:
    """follow() without a terminal: a progress line every every_s through write (`--json` passes
    one that drops it); returns the last status."""
    start_s = time.monotonic()
    deadline_s = None if timeout_s is None else start_s + timeout_s
    next_line_s = start_s + every_s
    first = None
    while True:
        st = jobs.status(job_id)
        now_s = time.monotonic()
        settled = st.job.completed + st.job.failed
        first = first if first is not None else (now_s, settled)
        if until(st) or (deadline_s is not None and now_s >= deadline_s):
            return st
        if now_s >= next_line_s:
            elapsed_s = now_s - first[0]
            rate = (
                (settled - first[1]) / elapsed_s if elapsed_s > 0 and settled > first[1] else None
            )
            write(progress_line(st, rate))
            next_line_s = now_s + every_s
        time.sleep(interval_s)
