"""A backend whose clock the test moves: leases, heartbeats, 429 waits and pacing without waiting.

SQLite reads its clock through `SqliteDatabase.clock`, which the test replaces. Redis reads TIME
inside its Lua scripts; a connection made with `clock_key` (tests only) reads the time stored at
that key instead while it is set (store/redis/connection.py), in every script and in the
Python-side reads (now(), pause_state, live_workers). Production connections have no clock_key:
their scripts are the same text as without this helper, so the cost there is nil.

The clock counts whole milliseconds, so both backends see exactly the same times (Redis keeps
times as milliseconds with three decimals, SQLite as float seconds: whole milliseconds are exact
in both, and a lease that ends "at" a time ends at the same instant on each).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis

from hermes_bulk.config.backend_url import parse_backend_url
from hermes_bulk.fleet import broker


class Clock:
    """Whole milliseconds since the epoch, starting at the real time (so stored times look real)."""

    def __init__(self, start_ms: int | None = None) -> None:
        self.ms = int(time.time() * 1000) if start_ms is None else start_ms
        self._on_change = None

    def __call__(self) -> float:
        return self.ms / 1000

    def advance(self, seconds: float) -> None:
        self.set_ms(self.ms + round(seconds * 1000))

    def set_ms(self, ms: int) -> None:
        self.ms = ms
        if self._on_change is not None:
            self._on_change(ms)


@dataclass
class ClockedBackend:
    store: object
    limits: object
    clock: Clock
    close: object


def clocked_backend(kind: str, tmp_path, redis_url: str | None = None) -> ClockedBackend:
    """A store and a limiter of this kind ("sqlite" or "redis") on a Clock the caller moves."""
    clock = Clock()
    if kind == "sqlite":
        backend = broker.build_backend(f"sqlite:///{tmp_path / 'bulk.db'}")
        backend.store.db.clock = clock  # the limiter shares the database, and so the clock
        return ClockedBackend(backend.store, backend.limits, clock, backend.close)
    from hermes_bulk.store.redis.connection import connect_redis
    from hermes_bulk.store.redis.jobs import RedisJobStore
    from hermes_bulk.store.redis.limits import RedisLimits

    location = parse_backend_url(redis_url)
    key = f"{location.prefix}:test-clock"
    conn = connect_redis(location, clock_key=key)
    raw = redis.Redis(connection_pool=conn.pool)

    def write(ms: int) -> None:
        raw.set(key, ms)

    clock._on_change = write
    write(clock.ms)
    store, limits = RedisJobStore(conn), RedisLimits(conn)

    def close() -> None:
        raw.delete(key)
        conn.close()

    return ClockedBackend(store, limits, clock, close)
