"""A connection to the fleet's Redis: one pinged pool per URL, and the errors users see.

Every failure is one line naming host:port, never the password: `RedisConnection.unavailable`
says it, and `map_connection_errors` makes every public method of the store and the limiter
raise it when Redis goes away mid-call.

A redis+sentinel:// URL gets redis-py's own SentinelConnectionPool: each new connection asks the
Sentinels for the primary. failover.py says which commands wait out a failover.
"""

from __future__ import annotations

import functools
import inspect
import time
from dataclasses import dataclass, field

import redis
from redis.sentinel import MasterNotFoundError, Sentinel

from ...config.backend_url import URL_SHAPE, RedisUrl
from ...errors import BackendUnavailable, ConfigError
from .failover import (
    FAILOVER_WAIT_S,
    Demoted,
    RidingClient,
    SentinelPool,
    TooFewReplicas,
    connection_class,
)
from .scripts import Scripts

#: Connecting must fail fast when Redis is down; reads may wait on a busy server. Keep
#: socket_timeout well above RedisHuey's 1 s BRPOP, or popped tasks are lost
#: (reference/huey-probe.md §6).
CONNECT_TIMEOUT_S = 5.0
SOCKET_TIMEOUT_S = 30.0
#: PING a pooled connection idle this long before reusing it.
HEALTH_CHECK_INTERVAL_S = 30
#: A restarted Redis answers LOADING until it has read its data back: a command that connects
#: then waits up to this long (a PING has no effects to repeat), then says what is going on.
LOADING_WAIT_S = FAILOVER_WAIT_S


@dataclass(frozen=True)
class RedisConnection:
    """A pool for one Redis URL, its key prefix, and where it points (for messages)."""

    pool: redis.ConnectionPool
    client: redis.Redis
    prefix: str
    where: str  # host:port (or the Sentinel service), never credentials
    setting: str  # what messages tell the user to check
    #: redis+sentinel://: redis-py's Sentinel client, which names the primary; None otherwise.
    sentinel: Sentinel | None = None
    service: str = ""
    #: WAIT after the writes a user is told about (durability.py): replicas (None: 1 when the
    #: primary has one), and the most it waits.
    wait_replicas: int | None = None
    wait_timeout_ms: int = 1000
    #: Tests only: a key holding the time (float ms since the epoch) that scripts and now_s()
    #: read instead of Redis TIME while it is set, so a test moves leases, pauses and pacing
    #: forward without waiting. None in production: the scripts are then exactly _clock.lua's.
    clock_key: str | None = None
    #: Per provider key: this process's last turn (acquire, or one taken with a claim) saw no
    #: backoff step and no 429 was seen here since; clear_backoff then skips its round trip.
    backoff_clean: dict[str, bool] = field(default_factory=dict, compare=False)

    def unavailable(self, exc: Exception, *, lost: bool = True) -> BackendUnavailable:
        """The one-line, credential-free error for a Redis that cannot be used."""
        if isinstance(exc, redis.AuthenticationError):
            return BackendUnavailable(
                f"Redis at {self.where} did not accept the credentials (authentication failed or "
                f"required); check the username and password in {self.setting}."
            )
        if isinstance(exc, redis.BusyLoadingError):
            return BackendUnavailable(
                f"Redis at {self.where} is loading its data (it has just restarted); "
                "try again in a moment."
            )
        if isinstance(exc, MasterNotFoundError):
            return BackendUnavailable(
                f"No Redis primary for {self.where} (no Sentinel answered, or they name none: a "
                "failover that did not end?); check the Sentinels, or try again in a moment."
            )
        if isinstance(exc, Demoted):
            return BackendUnavailable(
                f"Redis at {self.where} is a replica now (a failover); no new primary answered "
                "in time. Try again in a moment."
            )
        if isinstance(exc, TooFewReplicas):
            return BackendUnavailable(
                f"Redis at {self.where} refuses writes: fewer replicas in sync than its "
                "min-replicas-to-write, for longer than the failover wait. Check the replicas."
            )
        what = "Lost the connection to" if lost else "Cannot reach"
        return BackendUnavailable(
            f"{what} Redis at {self.where} ({self._reason(exc)}). Start it, or "
            "use the sqlite:// backend for a single machine."
        )

    def _reason(self, exc: Exception) -> str:
        """A few words on why: redis-py's "Error 111 connecting to host:port. Connection refused."
        ends with the reason; anything else is named by its type only."""
        if isinstance(exc, redis.TimeoutError):
            return "timed out"
        text, marker = str(exc), f"{self.where}. "
        if marker in text:
            return text.split(marker, 1)[1].rstrip(".").lower()[:80]
        return type(exc).__name__

    @functools.cached_property
    def lua(self) -> Scripts:
        return Scripts(self.client, self.clock_key)

    def now_s(self) -> float:
        """The backend's clock, in seconds since the epoch (Redis TIME, or the test's time)."""
        if not self.clock_key:
            seconds, micros = self.client.time()
            return seconds + micros / 1e6
        pipe = self.client.pipeline(transaction=False)
        n = self.queue_clock(pipe)
        return self.time_of(pipe.execute()[:n])

    def queue_clock(self, pipe) -> int:
        """Queue the clock's reads on a pipeline; returns how many replies they are (time_of)."""
        pipe.time()
        if self.clock_key:
            pipe.get(self.clock_key)
            return 2
        return 1

    @staticmethod
    def time_of(replies: list) -> float:
        """The clock, in seconds, from the replies of queue_clock's reads."""
        if len(replies) > 1 and replies[1] is not None:
            return float(replies[1]) / 1000
        seconds, micros = replies[0]
        return seconds + micros / 1e6

    def primary(self) -> tuple[str, int, int]:
        """The primary this connection writes to now (host, port) and how many replicas are
        connected to it (INFO replication; 0 when a managed Redis refuses INFO)."""
        if self.sentinel is not None:
            host, port = self.sentinel.discover_master(self.service)
        else:
            kwargs = self.pool.connection_kwargs
            host, port = kwargs.get("host", "localhost"), int(kwargs.get("port", 6379))
        try:
            replicas = int(self.client.info("replication").get("connected_slaves", 0))
        except redis.ResponseError:
            replicas = 0
        return str(host), int(port), replicas

    def close(self) -> None:
        self.pool.disconnect()
        if self.sentinel is not None:
            for client in self.sentinel.sentinels:
                client.close()


def connect_redis(
    location: RedisUrl,
    *,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    socket_timeout_s: float = SOCKET_TIMEOUT_S,
    clock_key: str | None = None,
    failover_wait_s: float = FAILOVER_WAIT_S,
) -> RedisConnection:
    """A pinged connection pool for a parsed redis://, rediss:// or redis+sentinel:// URL
    (config/backend_url.py).

    clock_key: tests only (RedisConnection.clock_key). failover_wait_s: how long a command that
    did not run waits out a failover (did_not_run) once the first PING has answered; 0 fails at
    once (the budget ledger, which fails open instead).

    Raises BackendUnavailable naming host:port (never the password) when Redis cannot be used.
    """
    setting = location.setting
    try:
        pool, sentinel = _pool(location, connect_timeout_s, socket_timeout_s)
    except (ValueError, TypeError):
        shape = URL_SHAPE if not location.sentinels else "redis+sentinel://"
        raise ConfigError(
            f"Invalid setting {setting}: not a redis:// or rediss:// URL ({shape})."
        ) from None
    client = RidingClient(connection_pool=pool)
    client.sentinel = sentinel is not None
    conn = RedisConnection(
        pool=pool,
        client=client,
        prefix=location.prefix,
        where=location.where,
        setting=setting,
        clock_key=clock_key,
        sentinel=sentinel,
        service=location.service,
        wait_replicas=location.wait_replicas,
        wait_timeout_ms=location.wait_timeout_ms,
    )
    try:
        _ping_once_loaded(conn.client)
    except redis.ResponseError as exc:
        conn.close()
        if "DB index is out of range" in str(exc):
            raise ConfigError(
                f"Invalid setting {setting}: database {location.database} is out of range for "
                f"Redis at {conn.where} (it has databases 0 to 15 unless its `databases` "
                "setting says otherwise)."
            ) from None
        raise conn.unavailable(exc, lost=False) from None
    except redis.RedisError as exc:
        conn.close()
        raise conn.unavailable(exc, lost=False) from None
    except TypeError as exc:  # an option redis-py passes on to a connection that does not take it
        conn.close()
        raise ConfigError(
            f"Invalid setting {setting}: an option in the URL is not one Redis connections "
            f"take ({str(exc).rsplit(' ', 1)[-1]})."
        ) from None
    # From now on a failover is waited out: at start, an unreachable Redis is said at once.
    client.ride_out_s = failover_wait_s
    if isinstance(pool, SentinelPool):
        pool.ride_out_s = failover_wait_s
    return conn


def _pool(
    location: RedisUrl, connect_timeout_s: float, socket_timeout_s: float
) -> tuple[redis.ConnectionPool, Sentinel | None]:
    """The connection pool of a URL, and for redis+sentinel:// the Sentinel client behind it.

    No retries: a script whose reply was lost must not run a second time (a claim would take a
    second item). A stale pooled connection is replaced at checkout instead."""
    options = redis.connection.parse_url(location.client_url)
    tls = options.pop("connection_class", None) is redis.SSLConnection
    options.update(
        socket_connect_timeout=connect_timeout_s,
        socket_timeout=socket_timeout_s,
        health_check_interval=HEALTH_CHECK_INTERVAL_S,
    )
    if not location.sentinels:
        return redis.ConnectionPool(connection_class=connection_class(tls, False), **options), None
    del options["host"], options["port"]
    # The Sentinels: their own credentials (sentinel_password=), the same TLS as Redis.
    sentinel_options = {
        k: v
        for k, v in options.items()
        if k.startswith(("socket_", "ssl_")) and k != "socket_keepalive_options"
    }
    if tls:
        sentinel_options["ssl"] = True
    if location.sentinel_password:
        sentinel_options["password"] = location.sentinel_password
        if location.sentinel_username:
            sentinel_options["username"] = location.sentinel_username
    sentinel = Sentinel(list(location.sentinels), sentinel_kwargs=sentinel_options)
    pool = SentinelPool(
        location.service, sentinel, connection_class=connection_class(tls, True), **options
    )
    return pool, sentinel


def _ping_once_loaded(client: redis.Redis) -> None:
    """PING, waiting out a Redis that is still loading its data (LOADING_WAIT_S at most)."""
    deadline = time.monotonic() + LOADING_WAIT_S
    while True:
        try:
            client.ping()
            return
        except redis.BusyLoadingError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def map_connection_errors(cls):
    """Every public method of cls raises BackendUnavailable when Redis goes away mid-call.

    One wrapper for the whole class, so no method can forget it; generators (iter_items) are
    wrapped as generators, since their errors surface while the caller iterates. Only the methods
    cls defines are wrapped: each part a store is built from carries the decorator itself.
    """
    errors = (redis.ConnectionError, redis.TimeoutError)  # Demoted and MasterNotFound too

    def wrap(fn):
        if inspect.isgeneratorfunction(fn):

            @functools.wraps(fn)
            def gen(self, *args, **kwargs):
                try:
                    yield from fn(self, *args, **kwargs)
                except errors as exc:
                    raise self.conn.unavailable(exc) from exc

            gen.maps_connection_errors = True
            return gen

        @functools.wraps(fn)
        def call(self, *args, **kwargs):
            try:
                return fn(self, *args, **kwargs)
            except errors as exc:
                raise self.conn.unavailable(exc) from exc

        call.maps_connection_errors = True
        return call

    for name, fn in list(vars(cls).items()):
        if not name.startswith("_") and inspect.isfunction(fn):
            setattr(cls, name, wrap(fn))
    return cls


def describe_primary(conn: RedisConnection) -> str:
    """Where writes go now, for `doctor` and a worker's first line: "Redis primary
    127.0.0.1:6380 (Sentinel service hermes), 1 replica". Raises BackendUnavailable."""
    try:
        host, port, replicas = conn.primary()
    except redis.RedisError as exc:
        raise conn.unavailable(exc) from None
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    service = f" (Sentinel service {conn.service})" if conn.sentinel is not None else ""
    return f"Redis primary {shown}{service}, {replicas} replica{'' if replicas == 1 else 's'}"


def persistence_warning(conn: RedisConnection) -> str | None:
    """A warning when this Redis would lose jobs on restart (no AOF), else None.

    Jobs live in Redis: without the append-only file a restart (or a crash) forgets them.
    Managed Redis may refuse INFO; then nothing can be said.
    """
    try:
        info = conn.client.info("persistence")
    except redis.RedisError:
        return None
    if str(info.get("aof_enabled", "1")) == "1":
        return None
    return (
        f"Redis at {conn.where} does not persist with an append-only file (appendonly no): a Redis "
        "restart would lose jobs. Turn it on: redis-server --appendonly yes (docker/compose.yaml "
        "does)."
    )
