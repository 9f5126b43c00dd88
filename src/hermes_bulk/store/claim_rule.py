"""The claim rule under --max-tokens and --max-cost, declared once for both backends (no I/O).

An item reserves its worst case while it runs (records.NewItem.claim_tokens; in money,
records.reserved_cost at the price it is asked at). It is taken while what the job has spent
and reserved, plus that reservation, is at most the limit: a reservation that reaches the limit
exactly fits. When it does not fit, the claim waits while reservations are in flight (they may
settle for less), and the job pauses only when the item would not fit beside what is spent
alone.

SQLite applies `fits` and `refusal` in Python and `fits_sql` in its statements
(sqlite/claims.py, sqlite/reservations.py, sqlite/batches.py); the Redis scripts copy `fits`
once, in store/redis/lua/_job.lua, and every comparison there goes through it. The contract
suite holds both at equality and one over (tests/contract/test_reservation_rule.py).
"""

from __future__ import annotations

#: refusal: the item would fit once reservations in flight settle; the claim waits.
IN_FLIGHT = "in_flight"
#: refusal: the item does not fit beside what is spent alone; the job pauses.
LIMIT = "limit"


def fits(used: int, need: int, limit: int | None) -> bool:
    """Whether `need` fits beside `used` under `limit` (None: no limit)."""
    return limit is None or used + need <= limit


def refusal(spent: int, reserved: int, need: int, limit: int | None) -> str | None:
    """None when `need` fits beside what is spent and reserved; IN_FLIGHT when it fits beside
    what is spent alone; LIMIT otherwise."""
    if fits(spent + reserved, need, limit):
        return None
    return IN_FLIGHT if fits(spent, need, limit) else LIMIT


def fits_sql(used: str, need: str, limit: str) -> str:
    """`fits` as an SQL expression of three SQL terms (`limit` NULL: no limit)."""
    return f"({limit} IS NULL OR {used} + {need} <= {limit})"
