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
