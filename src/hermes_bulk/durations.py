"""Durations as people write them: 90s, 30m, 6h, 2d, or plain seconds (--batch-deadline,
HERMES_BULK_BATCH_WINDOW)."""

from __future__ import annotations

import re

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float | None:
    """Seconds in "90s", "30m", "24h", "2d" or a plain number of seconds; None if it is none of
    them."""
    m = _DURATION.match(text or "")
    return float(m.group(1)) * _UNIT_S[m.group(2)] if m else None


def zoned_clock(at_s: float, now_s: float | None = None) -> str:
    """A wait's end as this machine's local time with its zone's name, "11:38:56 CET" (with the
    date when not today): a reader elsewhere on a fleet, or a log read later, can place it, as
    the budget's window names its zone."""
    import datetime
    import time

    when = datetime.datetime.fromtimestamp(at_s).astimezone()
    today = datetime.datetime.fromtimestamp(time.time() if now_s is None else now_s).date()
    return when.strftime("%H:%M:%S %Z" if when.date() == today else "%Y-%m-%d %H:%M:%S %Z")
