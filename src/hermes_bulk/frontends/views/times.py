"""How times and durations read: a local clock time, seconds or minutes, a list's short date."""

from __future__ import annotations

import datetime
import time


def clock(at_s: float, now_s: float | None = None) -> str:
    """A local time; with its date when that is not today (a window reopening tomorrow at 09:28)."""
    when = datetime.datetime.fromtimestamp(at_s)
    today = datetime.datetime.fromtimestamp(time.time() if now_s is None else now_s).date()
    return when.strftime("%H:%M:%S" if when.date() == today else "%Y-%m-%d %H:%M:%S")


def format_seconds(seconds: float) -> str:
    return f"{seconds:g} s" if seconds < 120 else f"{seconds / 60:g} min"


def short_time(at: float, now: float) -> str:
    """When, in as few columns as tell it apart: "14:18" today, "Dec 07" this year, else
    "2025-12-07" (at 80 columns a full date and time leave `list` no room for the instruction)."""
    when, today = datetime.datetime.fromtimestamp(at), datetime.datetime.fromtimestamp(now)
    if when.date() == today.date():
        return when.strftime("%H:%M")
    return when.strftime("%b %d" if when.year == today.year else "%Y-%m-%d")


def age(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"
