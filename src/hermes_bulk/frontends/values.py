"""The values the command line takes: the range of every number, and the argparse types that
check a value and say that range when it is out of it (shown in --help and docs/cli.md too).

The upper bounds keep a typo from reaching the store as a value it cannot hold (SQLite's 64-bit
integers, Lua's 2**53) or from starting a billion threads; each is far above real use.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from decimal import Decimal, InvalidOperation

from ..durations import parse_duration
from ..store.records import MAX_COST_USD, NANO_PER_USD

MAX_CONCURRENCY = 1024  #: as the max_concurrency setting's own bound (config/settings.py)
MAX_RETRIES = 20  #: as the max_retries setting's bound
MAX_TOKENS = 10**12  #: --max-tokens: a trillion tokens
MAX_RPM = 1_000_000  #: --rpm, as the rpm setting's bound
MAX_TPM = 1_000_000_000  #: --tpm, as the tpm setting's bound
MAX_LISTED = 10_000  #: --limit, --events
MAX_PORT = 65_535
MAX_WAIT_S = 3600.0  #: worker polling delays
MAX_SHUTDOWN_S = 86_400.0
MAX_BACKOFF = 10.0
MAX_OUTPUT_TOKENS = 1_000_000  #: --max-output-tokens, as the max_output_tokens setting's bound
#: The most items `run --sample` takes: a look before paying for all (each claim walks the
#: sample for its next pending item).
MAX_SAMPLE = 1000
MAX_DURATION_S = 30 * 86400  #: --batch-deadline


def whole(minimum: int, maximum: int) -> Callable[[str], int]:
    """An argparse type: a whole number from minimum to maximum, with a message that says so."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not minimum <= value <= maximum:
            shown = (
                f"{value:,}"
                if len(str(value)) <= 24
                else f"{str(value)[:12]}… ({len(str(value))} digits)"
            )
            raise argparse.ArgumentTypeError(
                f"{shown} is out of range; use {minimum:,} to {maximum:,}"
            )
        return value

    return parse


def number(minimum: float, maximum: float, *, above_minimum: bool = True) -> Callable[[str], float]:
    """An argparse type: a finite number in (minimum, maximum] (or [minimum, maximum])."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        low_ok = value > minimum if above_minimum else value >= minimum
        if not (math.isfinite(value) and low_ok and value <= maximum):
            low = f"more than {minimum:g}" if above_minimum else f"from {minimum:g}"
            raise argparse.ArgumentTypeError(f"{text} is out of range; use {low} up to {maximum:g}")
        return value

    return parse


def span(minimum: float, maximum: float) -> str:
    """A range as help shows it: 1-1,024 for whole numbers, 0-2 for the others."""
    return f"{minimum:,}-{maximum:,}" if isinstance(minimum, int) else f"{minimum:g}-{maximum:g}"


def usd(text: str) -> int:
    """--max-cost: US dollars (more than 0, at most MAX_COST_USD), as nano-USD."""
    try:
        value = Decimal(text.strip().removeprefix("$").replace(",", ""))
    except (InvalidOperation, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not an amount in US dollars") from None
    if not (value.is_finite() and 0 < value <= MAX_COST_USD):
        raise argparse.ArgumentTypeError(
            f"{text} is out of range; use more than 0 up to {MAX_COST_USD:,} (US dollars)"
        )
    nusd = int(value * NANO_PER_USD)  # a fraction of a nano-dollar is dropped: never above it
    if nusd <= 0:
        raise argparse.ArgumentTypeError(f"{text} is less than a nano-dollar; give more")
    return nusd


def duration(text: str) -> float:
    """--batch-deadline: 90s, 30m, 6h, 2d, … up to 30 days, in seconds."""
    length = parse_duration(text)
    if length is None or not 0 < length <= MAX_DURATION_S:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration such as 90s, 30m, 6h or 2d (at most 30d)"
        )
    return length


concurrency = whole(1, MAX_CONCURRENCY)
retries = whole(0, MAX_RETRIES)
max_tokens = whole(1, MAX_TOKENS)
listed, events = whole(1, MAX_LISTED), whole(0, MAX_LISTED)
seconds = number(0, MAX_WAIT_S)
