"""Counted nouns in what users read: "1 request", "2 requests", never "1 requests"."""

from __future__ import annotations

_IRREGULAR = {"entry": "entries", "more entry": "more entries", "batch": "batches"}


def plural(n: int, noun: str) -> str:
    """The noun as it goes with n (the last word takes the plural)."""
    if n == 1:
        return noun
    return _IRREGULAR.get(noun) or noun + "s"


def count(n: int, noun: str) -> str:
    """ "1 item", "3 items", "1,323,614 tokens": thousands separated, as the dashboard shows
    them."""
    return f"{n:,} {plural(n, noun)}"
