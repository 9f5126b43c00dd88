"""WAIT after the writes a user is told about: a job created, a state they set, an answer saved.

Redis replicates asynchronously: the primary acknowledges a write before any replica has it, and
a failover promotes a replica that may lack the last few milliseconds of writes (a consistent
prefix of them: every script arrives whole or not at all). WAIT n t blocks the connection that
wrote until n replicas have everything it wrote (or t ms passed), so once it answers n, a
failover to any of those replicas keeps the write.

WAIT counts the writes of its own connection, so a confirmed write and its WAIT go on one
connection held for the two (`writing`). How many replicas: the URL's `wait_replicas=`;
by default 1 when the primary has a replica connected (INFO, re-read every REPLICAS_TTL_S), and
none without one (WAIT would only ever time out). A WAIT that times out is logged, never an
error: the write is on the primary, and only a failover in the next moments loses it; what it
loses comes back as work to redo (docs/operations.md, "What a failover costs").
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
import time
from collections.abc import Iterator

import redis

from .connection import RedisConnection, RidingClient

log = logging.getLogger("hermes_bulk.store.redis")

#: How long the primary's replica count is trusted before INFO is read again.
REPLICAS_TTL_S = 10.0
#: A shortfall is logged at most this often (one a write would flood the log).
SHORTFALL_LOG_EVERY_S = 60.0


class Durability:
    """The WAIT policy of one connection (its URL's wait_replicas= and wait_timeout_ms=)."""

    def __init__(self, conn: RedisConnection, mark_key: str) -> None:
        self.conn, self.mark_key = conn, mark_key
        self._local = threading.local()
        self._replicas: tuple[float, int] | None = None  # (read at, connected replicas)
        self._told_at = 0.0

    def replicas(self) -> int:
        """How many replicas a confirmed write waits for now (0: it is not confirmed)."""
        wanted = self.conn.wait_replicas
        if wanted is not None:
            return wanted
        now = time.monotonic()
        known = self._replicas
        if known is None or now - known[0] > REPLICAS_TTL_S:
            try:
                info = self.conn.client.info("replication")
                count = int(info.get("connected_slaves", 0))
            except redis.ResponseError:  # a managed Redis may refuse INFO: nothing to wait on
                count = 0
            known = self._replicas = (now, count)
        return min(1, known[1])

    @contextlib.contextmanager
    def writing(self) -> Iterator[redis.Redis | None]:
        """The client a confirmed write and its WAIT go on: one connection of the pool, held
        for the two (checked out as every command's is: a dead one replaced, a failover waited
        out); None when writes are not confirmed now (no replica), for the shared client."""
        if not self.replicas():
            yield None
            return
        client = getattr(self._local, "client", None)
        if client is None:
            shared = self.conn.client
            client = self._local.client = RidingClient(connection_pool=self.conn.pool)
            client.ride_out_s, client.sentinel = shared.ride_out_s, shared.sentinel
        client.connection = checkout(self.conn.pool)
        try:
            yield client
        finally:
            held, client.connection = client.connection, None
            self.conn.pool.release(held)

    def confirm(self, client: redis.Redis | None, what: str) -> int:
        """WAIT on client's connection for what it wrote; returns the replicas that have it.
        A shortfall is logged (at most once a minute), not raised."""
        if client is None:
            return 0
        wanted = self.replicas()
        got = int(client.execute_command("WAIT", wanted, self.conn.wait_timeout_ms))
        if got < wanted:
            self._replicas = None  # read INFO again: a replica gone, or a failover happened
        if got < wanted and time.monotonic() - self._told_at > SHORTFALL_LOG_EVERY_S:
            self._told_at = time.monotonic()
            log.warning(
                "Redis: %s is on the primary, but %d of %d replicas confirmed it within %d ms; "
                "a failover now would lose it (it would be done again)",
                what,
                got,
                wanted,
                self.conn.wait_timeout_ms,
            )
        return got

    def confirm_earlier(self, what: str) -> int:
        """WAIT for a write this thread made on another connection (a MULTI/EXEC pipeline): a
        write after it on the held one (mark_key) comes after it in the replication stream, so
        the replicas that have the mark have the write. A round trip more than confirm: for the
        rare writes (a job's state), not for answers."""
        with self.writing() as client:
            if client is None:
                return 0
            client.incr(self.mark_key)
            return self.confirm(client, what)


def checkout(pool: redis.ConnectionPool) -> redis.Connection:
    """A connection from the pool, as a command gets one (redis-py before 5.3 wants a command
    name there; later ones warn when given one)."""
    if _NAMED_CHECKOUT:
        return pool.get_connection("WAIT")
    return pool.get_connection()


_NAMED_CHECKOUT = (
    inspect.signature(redis.ConnectionPool.get_connection).parameters["command_name"].default
    is inspect.Parameter.empty
)
