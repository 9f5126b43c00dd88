"""A total deadline on an exchange with a provider (DESIGN.md invariant 17).

Socket timeouts bound one read, not a request: an answer that drips a byte a second never times
out. Two ways to bound the whole exchange (connect, sending, headers and body), one for each
HTTP library used:

- urllib3 (each item's request, transport.py): a watchdog thread shuts down the socket of a
  request past its deadline, which wakes the blocked read at once; a request only arms and
  disarms its thread's `Watch` (two attribute writes and an uncontended lock), so the hot path
  pays nothing measurable.
- httpx (the Batch APIs, a few requests a job): a network backend whose every read and write
  waits at most what is left of the calling thread's deadline (`within`), so the exchange ends
  with httpx's own timeout error once it has passed.
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import httpcore
import httpx

log = logging.getLogger("hermes_bulk.providers.deadline")

#: The watchdog looks at the armed requests at least this often: a deadline is kept to within it.
TICK_S = 0.2


class Watch:
    """One thread's request under the watchdog: the connection it uses, and its deadline."""

    __slots__ = ("__weakref__", "deadline", "fired", "lock", "sock")

    def __init__(self) -> None:
        self.deadline = math.inf
        #: The socket the request goes over, as it was connected (http.client lets go of it
        #: while a body that ends with the connection is still being read).
        self.sock: Any = None
        self.fired = False
        self.lock = threading.Lock()

    def arm(self, seconds: float) -> None:
        self.fired = False
        self.deadline = time.monotonic() + seconds
        _WATCHDOG.wake_if_idle()

    def disarm(self) -> bool:
        """Ends the watch; whether the deadline passed first (the socket was shut down)."""
        with self.lock:
            self.deadline = math.inf
            return self.fired

    def expire(self, seen: float) -> None:
        with self.lock:
            if self.deadline != seen:  # disarmed, or armed again for the next request
                return
            self.deadline, self.fired = math.inf, True
            shut_down(self.sock)


def watched(conn: Any, watch: Watch) -> Any:
    """A urllib3 connection whose socket `watch` knows each time it connects (a pool's one
    connection connects again after the server closed it)."""
    connect = conn.connect

    def watched_connect() -> None:
        try:
            connect()
        finally:
            watch.sock = conn.sock

    conn.connect = watched_connect
    return conn


def shut_down(sock: Any) -> None:
    """Both directions of a socket shut, at the file descriptor (a TLS socket's own shutdown
    would unwrap it under a thread reading it): a blocked read returns at once."""
    raw = getattr(sock, "socket", sock)  # urllib3's TLS-in-TLS wraps the socket
    if isinstance(raw, socket.socket):
        with contextlib.suppress(OSError):
            socket.socket.shutdown(raw, socket.SHUT_RDWR)


class _Watchdog:
    def __init__(self) -> None:
        self._watches: weakref.WeakSet[Watch] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._idle = True

    def watch(self) -> Watch:
        watch = Watch()
        with self._lock:
            self._watches.add(watch)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, daemon=True, name="hermes-bulk-deadlines"
                )
                self._thread.start()
        return watch

    def wake_if_idle(self) -> None:
        if self._idle:  # only the first request armed since the watchdog went idle wakes it
            self._idle = False
            self._wake.set()

    def _run(self) -> None:
        while True:
            now = time.monotonic()
            soonest = math.inf
            # Idle before the scan: a request armed during it wakes the wait below at once.
            self._idle = True
            with self._lock:
                watches = list(self._watches)
            for watch in watches:
                deadline = watch.deadline
                if deadline <= now:
                    try:
                        watch.expire(deadline)
                    except Exception:  # the watchdog serves every request: it never stops
                        log.exception("a request's deadline could not be enforced")
                else:
                    soonest = min(soonest, deadline)
            if soonest < math.inf:
                self._idle = False
            self._wake.wait(min(TICK_S, max(0.0, soonest - now)) if not self._idle else 5.0)
            self._wake.clear()


_WATCHDOG = _Watchdog()


def new_watch() -> Watch:
    """A Watch for one thread's requests (kept by it, dropped with it)."""
    return _WATCHDOG.watch()


# httpx ------------------------------------------------------------------------------------

_deadline = threading.local()


@contextlib.contextmanager
def until(at: float) -> Iterator[None]:
    """The httpx exchanges of this thread in the block end by `at` (time.monotonic())."""
    before = getattr(_deadline, "at", math.inf)
    _deadline.at = min(before, at)
    try:
        yield
    finally:
        _deadline.at = before


def passed(at: float) -> bool:
    return time.monotonic() >= at


def _left(timeout: float | None, exc: type[Exception]) -> float | None:
    at = getattr(_deadline, "at", math.inf)
    if at == math.inf:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise exc("the exchange's total deadline passed")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        left = _left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, left))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        left = _left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.connect_tcp(host, port, left, local_address, socket_options))

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        left = _left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.connect_unix_socket(path, left, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def bound_client(client: httpx.Client) -> httpx.Client:
    """The client with every transport it may use (the direct one and each proxy's) reading
    and writing within the thread's deadline (`within`)."""
    mounted = client._mounts.values()  # noqa: SLF001 - httpx has no public hook for this
    for transport in [client._transport, *(t for t in mounted if t is not None)]:  # noqa: SLF001
        pool = getattr(transport, "_pool", None)
        if pool is None or not hasattr(pool, "_network_backend"):
            raise RuntimeError("httpx's transport is not the one the deadline knows")
        pool._network_backend = _Backend(pool._network_backend)  # noqa: SLF001
    return client
