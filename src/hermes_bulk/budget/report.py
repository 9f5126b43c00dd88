"""What `hermes cron-budget status`, `/cron-budget` and `hermes-bulk budget status` print.

Plain text in a fixed-width layout, so the same block reads well in a terminal and as a chat
reply; `as_dict` is the `--json` shape (keys are only ever added).
"""

from __future__ import annotations

import datetime as dt
import textwrap

from ..words import count
from .ledger import NOT_SENT, JobCounts
from .policy import CALL_CLASSES, ENFORCE, HELD, WOULD_BLOCK
from .service import Report
from .settings import KEYS

BAR_WIDTH = 30
JOBS_SHOWN = 20


#: What each mode does, in the status block's first line
ENFORCE_DOES = "cron and bulk are held at the cap"
OBSERVE_DOES = "nothing held; would-block runs recorded"


def use_bar(used: int, limit: int, cap: int, width: int = BAR_WIDTH) -> str:
    """█ used, ░ free, with │ where background work stops (the chat reserve is to its right)."""
    limit = max(limit, 1)
    filled = min(width, round(width * used / limit))
    cells = ["█"] * filled + ["░"] * (width - filled)
    stop = min(width - 1, round(width * cap / limit))
    if 0 < stop < width and cap < limit:
        cells[stop] = "│" if cells[stop] == "░" else "┃"
    return "".join(cells)


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h {rest // 60:02d}m" if hours else f"{rest // 60}m"


def _clock(local: dt.datetime) -> str:
    return local.strftime("%Y-%m-%d %H:%M %Z")


#: The widest line status draws: it is a /cron-budget reply in Hermes too, whose TUI shows a
#: reply in a pager 6 columns narrower than the terminal (frontends/terminal.CHAT_WIDTH).
WIDTH = 72
#: A job's name in the jobs table: longer names end in "…".
NAME_WIDTH = 17


def status_text(r: Report) -> str:
    s, w = r.settings, r.window
    lines = [
        f"Cron budget: {s.mode} mode ({ENFORCE_DOES if s.mode == ENFORCE else OBSERVE_DOES})",
        f"Window: {_clock(w.start_local)} → {_clock(w.end_local)} (resets in "
        f"{_duration(w.end_s - r.now_s)})",
    ]
    if r.counts is None:
        lines.append(f"Ledger: {r.ledger} cannot be read now: {r.ledger_error}")
    else:
        c = r.counts
        pct = 100 * c.total / max(s.daily_limit, 1)
        lines.append(
            f"Used: {c.total:,} of {count(s.daily_limit, 'request')} "
            f"[{use_bar(c.total, s.daily_limit, s.background_cap)}] {pct:.0f}%"
        )
        lines.append(
            f"Cron and bulk stop at {s.background_cap:,} ({s.chat_reserve:,} kept for chat); "
            f"{max(0, s.background_cap - c.total):,} left for them"
        )
        by_class = c.by_class()
        lines.append("By class: " + ", ".join(f"{k} {by_class[k]:,}" for k in CALL_CLASSES))
        lines.append(
            f"Requests held: {c.decisions(HELD):,}, would-block: {c.decisions(WOULD_BLOCK):,}"
            + (
                f"; not sent, so not counted: {c.get(NOT_SENT):,}"  # no connection was made
                if c.get(NOT_SENT)
                else ""
            )
        )
        profiles = c.by_profile()
        if profiles:
            lines.append("By profile: " + ", ".join(f"{p} {n:,}" for p, n in profiles.items()))
        if c.get("uncounted"):
            # The globs in force when each was made decided, and they may have changed since.
            lines.append(
                f"Not counted: {count(c.get('uncounted'), 'request')}, whose model was outside "
                "the models setting at the time"
            )
        jobs = c.jobs()
        if jobs:
            lines.append("")
            lines += _jobs_table(jobs[:JOBS_SHOWN], s.job_limit)
            if len(jobs) > JOBS_SHOWN:
                lines.append(f"… and {count(len(jobs) - JOBS_SHOWN, 'more job')}")
    if r.failopen:
        lines.append("")
        lines.append(
            f"⚠ Accounting failed {count(r.failopen.calls, 'time')} in this window (last at "
            f"{w.local(r.failopen.last_at):%H:%M:%S %Z}: {r.failopen.reason}); "
            "those calls went through uncounted."
        )
    lines.append("")
    if r.settings_error:
        lines.append(
            "⚠ Settings cannot be read, so calls go through uncounted until they can: "
            f"{r.settings_error}"
        )
        lines.append(
            "Settings (defaults, not in budget.json): "
            + ", ".join(f"{k}={s.shown(k)}" for k in KEYS)
        )
    else:
        lines.append("Settings: " + ", ".join(f"{k}={s.shown(k)}" for k in KEYS))
    return fitted("\n".join(lines))


def fitted(text: str) -> str:
    """Each line of text at most WIDTH columns (what every budget command prints)."""
    return "\n".join(_fitted(line) for line in text.split("\n"))


def _fitted(line: str) -> str:
    """A line of at most WIDTH columns, broken at spaces, its continuations indented by two (a
    word longer than that, such as a path, stays whole)."""
    if len(line) <= WIDTH:
        return line
    return "\n".join(
        textwrap.wrap(
            line,
            WIDTH,
            subsequent_indent="  ",
            break_long_words=False,
            break_on_hyphens=False,
        )
    )


def _jobs_table(jobs: list[JobCounts], job_limit: int | None) -> list[str]:
    header = ("job", "name", "class", "requests", "held runs", "would-block")
    rows = [
        (
            j.job_id,
            j.name or "-",
            j.call_class or "-",
            f"{j.requests:,}/{job_limit:,}"
            if job_limit and j.call_class == "cron"
            else f"{j.requests:,}",
            f"{j.held_runs:,}",
            f"{j.would_block_runs:,}",
        )
        for j in jobs
    ]
    width = {0: 12, 1: NAME_WIDTH, 2: 9}  # a job's id, its name, its class
    rows = [
        tuple(
            cell if len(cell) <= width.get(i, 12) else cell[: width.get(i, 12) - 1] + "…"
            for i, cell in enumerate(row)
        )
        for row in rows
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    right = {3, 4, 5}

    def fmt(row: tuple[str, ...]) -> str:
        return "  ".join(
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ).rstrip()

    return [fmt(header), fmt(tuple("-" * n for n in widths)), *(fmt(row) for row in rows)]


def as_dict(r: Report) -> dict:
    """The `status --json` shape."""
    c = r.counts
    return {
        "mode": r.settings.mode,
        "window": {"start": r.window.start_s, "end": r.window.end_s, "zone": r.window.zone},
        "daily_limit": r.settings.daily_limit,
        "chat_reserve": r.settings.chat_reserve,
        "background_cap": r.settings.background_cap,
        "job_limit": r.settings.job_limit,
        "used": c.total if c else None,
        "by_class": c.by_class() if c else None,
        "by_profile": c.by_profile() if c else None,
        "held": c.decisions(HELD) if c else None,
        "would_block": c.decisions(WOULD_BLOCK) if c else None,
        "uncounted": c.get("uncounted") if c else None,
        "not_sent": c.get(NOT_SENT) if c else None,
        "jobs": [
            {
                "job_id": j.job_id,
                "name": j.name,
                "class": j.call_class,
                "requests": j.requests,
                "held": j.held,
                "held_runs": j.held_runs,
                "would_block_runs": j.would_block_runs,
            }
            for j in c.jobs()
        ]
        if c
        else None,
        "ledger": r.ledger,
        "ledger_error": r.ledger_error,
        "failed_open": {
            "calls": r.failopen.calls,
            "last_at": r.failopen.last_at,
            "reason": r.failopen.reason,
        }
        if r.failopen
        else None,
        "settings": {k: r.settings.shown(k) for k in KEYS},
        "settings_error": r.settings_error,
    }
