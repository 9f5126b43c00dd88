"""A failover is a wait, not an error: which commands are sent again, and for how long.

A command that surely did not run is sent again, for up to FAILOVER_WAIT_S, once the first PING
of its connection has answered (an unreachable Redis at start is said at once): the server
refused it (READONLY, because a failover demoted it to a replica; LOADING, a replica or a
restarted server reading its data), or, through Sentinel, no connection could be made or the
Sentinels name no primary yet (the primary is gone and another is being elected). The waits are
redis-py's: its SentinelConnectionPool asks the Sentinels for the primary on every new
connection; nothing here discovers one.

A command whose reply was lost in flight is not sent again: it may have run (a claim would take a
second item, an answer be saved twice), and the caller decides, as after a restart (the pipeline
saves an outcome again, which the store refuses once done; a lost claim's lease runs out). A read
(READS; a pipeline of nothing else) is sent again then too, within the same wait: it changed
nothing, so an export, a status or a list cut by a failover goes on on the new primary.

NOREPLICAS (the primary's min-replicas-to-write: too few replicas in sync) is a refusal too,
waited on the same way: a replica that reconnects, or a failover's new primary that gains one,
ends it.

READONLY reaches these rules from a plain redis:// URL too (a managed endpoint that fails over by
itself): the connection is dropped, and the next one finds whatever the endpoint names now. A
refused connection on a plain URL is not waited on: that is a Redis down, said at once.
"""

from __future__ import annotations

import logging
import threading
import time

import redis
from redis.sentinel import (
    MasterNotFoundError,
    SentinelConnectionPool,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)

log = logging.getLogger("hermes_bulk.store.redis")

#: A failover (a demoted primary, no primary yet, a replica loading) is waited out this long,
#: as a restarted Redis's LOADING is (connection.LOADING_WAIT_S). Sentinel's
#: down-after-milliseconds plus its election must fit in it (docs/operations.md: 5 s in
#: docker/compose.sentinel.yaml; Sentinel's own default is 30 s, too long for it).
FAILOVER_WAIT_S = 30.0
#: Between tries while waiting out a failover: the first pause, doubling up to the longest.
RIDE_FIRST_WAIT_S, RIDE_LONGEST_WAIT_S = 0.05, 0.5


class Demoted(redis.ConnectionError):
    """The server answered READONLY: a failover made it a replica. The command did not run."""


class TooFewReplicas(redis.ConnectionError):
    """The primary answered NOREPLICAS: fewer replicas than its min-replicas-to-write are in
    sync (one is gone, or a failover left the new primary without one). The write did not run
    (a script is refused at its first write, before any effect)."""


#: Commands that only read (no effect to repeat): one whose reply was lost is sent again. What
#: the store, the ledger and Huey read; a command not named here is taken for a write.
READS = frozenset(
    {
        *("PING", "ECHO", "TIME", "INFO", "DBSIZE", "EXISTS", "TYPE", "TTL", "PTTL", "SCAN"),
        *("GET", "MGET", "STRLEN", "GETRANGE"),
        *("HGET", "HMGET", "HGETALL", "HKEYS", "HVALS", "HLEN", "HEXISTS", "HSTRLEN", "HSCAN"),
        *("LLEN", "LRANGE", "LINDEX"),
        *("SCARD", "SMEMBERS", "SISMEMBER", "SMISMEMBER", "SSCAN"),
        *("ZCARD", "ZCOUNT", "ZLEXCOUNT", "ZSCORE", "ZMSCORE", "ZRANK", "ZREVRANK", "ZSCAN"),
        *("ZRANGE", "ZRANGEBYLEX", "ZRANGEBYSCORE", "ZREVRANGE", "ZREVRANGEBYLEX"),
        *("ZREVRANGEBYSCORE", "XRANGE", "XREVRANGE", "XLEN"),
    }
)


def is_read(args: tuple) -> bool:
    """Whether a command (its name and arguments, as redis-py sends them) only reads."""
    name = args[0] if args else ""
    if isinstance(name, bytes):
        name = name.decode("ascii", "replace")
    return isinstance(name, str) and name.upper() in READS


def read_rides(exc: Exception, *, sentinel: bool) -> bool:
    """Whether a read that raised exc is sent again: whatever did_not_run sends again, and a
    reply lost in flight (a closed or reset connection, a read that timed out), which a write's
    is not. A refused connection on a plain URL is still a Redis down, said at once."""
    if did_not_run(exc, sentinel=sentinel):
        return True
    return isinstance(exc, redis.ConnectionError | redis.TimeoutError) and not never_sent(exc)


def did_not_run(exc: Exception, *, sentinel: bool) -> bool:
    """Whether a command that raised exc surely had no effect, so sending it again is safe: the
    server refused it (READONLY, LOADING, NOREPLICAS), or (through Sentinel, where a refused
    connection means the primary is gone and another is coming) it never reached a server."""
    if isinstance(exc, Demoted | TooFewReplicas | redis.BusyLoadingError):
        return True
    return sentinel and never_sent(exc)


def never_sent(exc: Exception) -> bool:
    """The error of a connection that could not be made (redis-py's "Error 111 connecting to
    host:port", "Timeout connecting to server"), or of Sentinels that name no primary."""
    if isinstance(exc, MasterNotFoundError):
        return True
    if isinstance(exc, redis.TimeoutError):
        return str(exc) == "Timeout connecting to server"
    return isinstance(exc, redis.ConnectionError) and " connecting to " in str(exc)


class _Demotable:
    """A connection that turns READONLY into Demoted, after dropping itself: the next command
    connects again, to whatever the endpoint (or the Sentinels) name now. redis-py's Sentinel
    connection already drops itself, with a ConnectionError of its own, renamed here. NOREPLICAS
    becomes TooFewReplicas (the connection stays: the server is still the primary)."""

    def read_response(self, *args, **kwargs):
        try:
            return super().read_response(*args, **kwargs)
        except redis.ReadOnlyError:
            self.disconnect()
            raise Demoted("the server is a replica now (READONLY)") from None
        except redis.ResponseError as exc:
            if not str(exc).startswith("NOREPLICAS"):
                raise
            raise TooFewReplicas(
                "the primary refuses writes: too few replicas in sync (NOREPLICAS)"
            ) from None
        except redis.ConnectionError as exc:
            if "previous master is now a slave" not in str(exc):
                raise
            raise Demoted("the server is a replica now (READONLY)") from None


class _Connection(_Demotable, redis.Connection):
    pass


class _SSLConnection(_Demotable, redis.SSLConnection):
    pass


class _Rediscovering:
    """A Sentinel connection that asks the Sentinels for the primary whenever it connects.
    redis-py's connect() does, but a connection that lost its socket while held (a command on
    it failed) is connected again by send_packed_command through connect_check_health, at the
    address it had: the dead primary's, refused until the failover wait ran out."""

    _addressing = False

    def connect_to(self, address):
        self._addressing = True
        try:
            return super().connect_to(address)
        finally:
            self._addressing = False

    def connect_check_health(self, *args, **kwargs):
        if self._sock is None and not self._addressing:
            return self.connect()  # through the Sentinels, to connect_to
        return super().connect_check_health(*args, **kwargs)


class _SentinelConnection(_Demotable, _Rediscovering, SentinelManagedConnection):
    pass


class _SentinelSSLConnection(_Demotable, _Rediscovering, SentinelManagedSSLConnection):
    pass


class _Episode:
    """One failover as this process's log tells it: a line when the first command starts to
    wait, one when the first command gets through again (with how long it took), not one a
    thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.since: float | None = None

    def waiting(self, exc: Exception, ride_out_s: float) -> None:
        with self.lock:
            if self.since is not None:
                return
            self.since = time.monotonic()
        log.warning(
            "Redis: %s; waiting up to %.0f s (a failover or a restart)", reason(exc), ride_out_s
        )

    def through(self) -> None:
        with self.lock:
            since, self.since = self.since, None
        if since is not None:
            log.info("Redis answers again, after %.1f s", time.monotonic() - since)


_EPISODE = _Episode()


def reason(exc: Exception) -> str:
    """Why a command waits, in a few words: redis-py's own text ("Error 111 connecting to
    127.0.0.1:6380. Connection refused"), but for Sentinels that name no primary, whose text
    holds the repr of every Sentinel client and its error (kilobytes of it)."""
    if isinstance(exc, MasterNotFoundError):
        return "the Sentinels name no primary"
    return str(exc).splitlines()[0].rstrip(".")[:120] if str(exc) else type(exc).__name__


def _ride(call, ride_out_s: float, sentinel: bool, rides):
    """call(), sent again while it fails in a way `rides` says did not run, for up to ride_out_s
    from the first failure (0: never)."""
    deadline, pause = None, RIDE_FIRST_WAIT_S
    while True:
        try:
            result = call()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if not ride_out_s or not rides(exc):
                raise
            now = time.monotonic()
            if deadline is None:
                deadline = now + ride_out_s
                _EPISODE.waiting(exc, ride_out_s)
            if now >= deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, RIDE_LONGEST_WAIT_S)
            continue
        if deadline is not None:
            _EPISODE.through()
        return result


class SentinelPool(SentinelConnectionPool):
    """redis-py's Sentinel pool, whose checkout waits out a failover (ride_out_s, set once the
    first PING answered): every user of the pool, Huey's queues included, waits rather than fails
    while the Sentinels elect a new primary."""

    ride_out_s = 0.0

    def get_connection(self, *args, **kwargs):
        get = super().get_connection
        return _ride(lambda: get(*args, **kwargs), self.ride_out_s, True, never_sent)


class RidingClient(redis.Redis):
    """A client whose commands (scripts included) that surely did not run, and reads whose reply
    was lost, are sent again while a failover lasts (did_not_run, read_rides; ride_out_s, 0
    until the first PING answered). Its pipelines of reads alone do the same."""

    ride_out_s = 0.0
    sentinel = False

    def execute_command(self, *args, **options):
        send = super().execute_command
        read = is_read(args)
        return _ride(
            lambda: send(*args, **options),
            self.ride_out_s,
            self.sentinel,
            lambda exc: self._rides(exc, read=read),
        )

    def _rides(self, exc: Exception, *, read: bool = False) -> bool:
        if isinstance(exc, Demoted):
            # The other idle connections reach the demoted server too: drop them, so that a
            # script loaded after NOSCRIPT is loaded where it then runs (the new primary).
            self.connection_pool.disconnect(inuse_connections=False)
        if read:
            return read_rides(exc, sentinel=self.sentinel)
        return did_not_run(exc, sentinel=self.sentinel)

    def pipeline(self, transaction=True, shard_hint=None) -> redis.client.Pipeline:
        pipe = _RidingPipeline(
            self.connection_pool, self.response_callbacks, transaction, shard_hint
        )
        pipe.ride_out_s, pipe.sentinel = self.ride_out_s, self.sentinel
        return pipe


class _RidingPipeline(redis.client.Pipeline):
    """A pipeline that, holding reads alone and no transaction, is sent again as a read is
    (read_rides); any other is sent once, as redis-py sends it."""

    ride_out_s = 0.0
    sentinel = False

    def execute(self, raise_on_error: bool = True) -> list:
        stack = list(self.command_stack)
        reads = not (self.transaction or self.explicit_transaction or self.watching) and all(
            is_read(args) for args, _ in stack
        )
        if not (reads and stack and self.ride_out_s):
            return super().execute(raise_on_error)
        send = super().execute

        def again() -> list:
            self.command_stack = list(stack)  # a failed execute() reset the pipeline
            return send(raise_on_error)

        return _ride(
            again,
            self.ride_out_s,
            self.sentinel,
            lambda exc: read_rides(exc, sentinel=self.sentinel),
        )


def connection_class(tls: bool, sentinel: bool) -> type[redis.Connection]:
    """The connection class of a pool: Demoted on READONLY, over TLS or not, through Sentinel or
    not."""
    if sentinel:
        return _SentinelSSLConnection if tls else _SentinelConnection
    return _SSLConnection if tls else _Connection
