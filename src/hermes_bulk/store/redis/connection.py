"""A connection to the fleet's Redis: one pinged pool per URL, and the errors users see.

Every failure is one line naming host:port, never the password: `RedisConnection.unavailable`
says it, and `map_connection_errors` makes every public method of the store and the limiter
raise it when Redis goes away mid-call.
"""

from __future__ import annotations

import functools
import inspect
import time
from dataclasses import dataclass, field

import redis

from ...config.backend_url import URL_SHAPE, RedisUrl
from ...errors import BackendUnavailable, ConfigError
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
LOADING_WAIT_S = 30.0


@dataclass(frozen=True)
class RedisConnection:
    """A pool for one Redis URL, its key prefix, and where it points (for messages)."""

    pool: redis.ConnectionPool
    client: redis.Redis
    prefix: str
    where: str  # host:port, never credentials
    setting: str  # what messages tell the user to check
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

    def close(self) -> None:
        self.pool.disconnect()


def connect_redis(
    location: RedisUrl,
    *,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    socket_timeout_s: float = SOCKET_TIMEOUT_S,
    clock_key: str | None = None,
) -> RedisConnection:
    """A pinged connection pool for a parsed redis:// or rediss:// URL (config/backend_url.py).

    clock_key: tests only (RedisConnection.clock_key).

    Raises BackendUnavailable naming host:port (never the password) when Redis cannot be used.
    """
    setting = location.setting
    try:
        # No retries: a script whose reply was lost must not run a second time (a claim would
        # take a second item). A stale pooled connection is replaced at checkout instead.
        pool = redis.ConnectionPool.from_url(
            location.client_url,
            socket_connect_timeout=connect_timeout_s,
            socket_timeout=socket_timeout_s,
            health_check_interval=HEALTH_CHECK_INTERVAL_S,
        )
    except (ValueError, TypeError):
        raise ConfigError(
            f"Invalid setting {setting}: not a redis:// or rediss:// URL ({URL_SHAPE})."
        ) from None
    conn = RedisConnection(
        pool=pool,
        client=redis.Redis(connection_pool=pool),
        prefix=location.prefix,
        where=location.where,
        setting=setting,
        clock_key=clock_key,
    )
    try:
        _ping_once_loaded(conn.client)
    except redis.ResponseError as exc:
        pool.disconnect()
        if "DB index is out of range" in str(exc):
            raise ConfigError(
                f"Invalid setting {setting}: database {location.database} is out of range for "
                f"Redis at {conn.where} (it has databases 0 to 15 unless its `databases` "
                "setting says otherwise)."
            ) from None
        raise conn.unavailable(exc, lost=False) from None
    except redis.RedisError as exc:
        pool.disconnect()
        raise conn.unavailable(exc, lost=False) from None
    except TypeError as exc:  # an option redis-py passes on to a connection that does not take it
        pool.disconnect()
        raise ConfigError(
            f"Invalid setting {setting}: an option in the URL is not one Redis connections "
            f"take ({str(exc).rsplit(' ', 1)[-1]})."
        ) from None
    return conn


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
    wrapped as generators, since their errors surface while the caller iterates.
    """
    errors = (redis.ConnectionError, redis.TimeoutError)

    def wrap(fn):
        if inspect.isgeneratorfunction(fn):

            @functools.wraps(fn)
            def gen(self, *args, **kwargs):
                try:
                    yield from fn(self, *args, **kwargs)
                except errors as exc:
                    raise self.conn.unavailable(exc) from exc

            return gen

        @functools.wraps(fn)
        def call(self, *args, **kwargs):
            try:
                return fn(self, *args, **kwargs)
            except errors as exc:
                raise self.conn.unavailable(exc) from exc

        return call

    for name, fn in list(vars(cls).items()):
        if not name.startswith("_") and inspect.isfunction(fn):
            setattr(cls, name, wrap(fn))
    return cls


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
