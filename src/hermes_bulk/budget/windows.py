"""Quota windows: the daily window that opens at `reset` (local time) in an IANA zone. Pure.

A provider's daily quota reopens at one wall-clock time in one zone (OpenRouter: 00:00 UTC).
A window runs from one reset instant to the next, so across a DST change it is 23 or 25
hours long, never off by an hour.

The DST rule, where the reset time is not an ordinary local time on the day of a change:
- skipped (spring forward, e.g. 02:30 on a day clocks jump 02:00 → 03:00): the window opens
  the gap's length later on the new clock (03:30), as Python's `fold=0` resolves it;
- repeated (fall back, e.g. 01:30 on a day clocks go 02:00 → 01:00): it opens at the first
  01:30, so there is one reset that day, not two.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from zoneinfo import ZoneInfo

_DAY = dt.timedelta(days=1)


@dataclass(frozen=True, slots=True)
class Window:
    """One quota window, [start_s, end_s) in seconds since the epoch, in its zone."""

    start_s: int
    end_s: int
    zone: str

    @property
    def length_s(self) -> int:
        return self.end_s - self.start_s

    def contains(self, instant_s: float) -> bool:
        return self.start_s <= instant_s < self.end_s

    def local(self, instant_s: float) -> dt.datetime:
        return dt.datetime.fromtimestamp(instant_s, ZoneInfo(self.zone))

    @property
    def start_local(self) -> dt.datetime:
        return self.local(self.start_s)

    @property
    def end_local(self) -> dt.datetime:
        return self.local(self.end_s)


class ZonedInstant(float):
    """Seconds since the epoch, and the zone a reader sees them in (the budget's): a float to all
    that computes with it or stores it, a time with its zone's name when shown."""

    __slots__ = ("zone",)
    zone: str

    def __new__(cls, at_s: float, zone: str) -> ZonedInstant:
        instant = super().__new__(cls, at_s)
        instant.zone = zone
        return instant

    def shown(self, now_s: float | None = None) -> str:
        """ "09:00 JST"; with the date when that is not today in the zone: "2026-12-04 09:00
        JST"."""
        zone = ZoneInfo(self.zone)
        local = dt.datetime.fromtimestamp(float(self), zone)
        today = dt.datetime.fromtimestamp(time.time() if now_s is None else now_s, zone).date()
        return local.strftime("%H:%M %Z" if local.date() == today else "%Y-%m-%d %H:%M %Z")


def reset_instant(day: dt.date, reset: dt.time, zone: ZoneInfo) -> int:
    """The epoch second at which the window that opens on local `day` opens (the DST rule above)."""
    local = dt.datetime.combine(day, reset.replace(tzinfo=None, fold=0), tzinfo=zone)
    # Round-tripping through UTC is what turns a skipped local time into the later real one.
    return int(local.astimezone(dt.UTC).timestamp())


def window_at(instant_s: float, reset: dt.time, zone: ZoneInfo) -> Window:
    """The window containing instant_s: from the latest reset at or before it to the next one."""
    day = dt.datetime.fromtimestamp(instant_s, zone).date()
    start = reset_instant(day, reset, zone)
    if start > instant_s:
        day -= _DAY
        start = reset_instant(day, reset, zone)
    end = reset_instant(day + _DAY, reset, zone)
    return Window(start_s=start, end_s=end, zone=zone.key)


def next_window(window: Window, reset: dt.time) -> Window:
    """The window that follows `window` (same reset and zone)."""
    return window_at(window.end_s, reset, ZoneInfo(window.zone))
