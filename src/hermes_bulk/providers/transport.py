"""How a model client's request reaches the provider: one kept-alive connection per worker thread.

urllib3, not httpx, on this path: every item is one POST, and urllib3 spends about half the
CPU httpx does on one, where a request is a large share of an item's CPU (`bench/http_clients.py`
compares them; benchmarks, row 13). The batch APIs and `doctor`, a few requests a job, use httpx.

What httpx does by itself is done here too: HTTP(S)_PROXY, ALL_PROXY and NO_PROXY are honoured (as
`trust_env`), the same certificate store is used (httpx.create_ssl_context: certifi, or
SSL_CERT_FILE / SSL_CERT_DIR), gzip answers are decoded (in bounded steps: urllib3 2.6 caps
what one read decompresses), redirects are not followed, nothing is retried here (the pipeline
decides), and every failure is one of the errors in `errors.py`.

The request timeout bounds the whole request, not one read (DESIGN.md invariant 17): a
watchdog (deadline.py) shuts down the socket of a request past it, so an answer that drips a
byte at a time gives up at the timeout. A SOCKS proxy is refused (`proxy_refusal`).
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import threading
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import urllib3
from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    NewConnectionError,
    ProxyError,
    SSLError,
)
from urllib3.exceptions import TimeoutError as Urllib3Timeout

from ..errors import ClientUnavailable, EndpointUnreachable, TransientModelError
from . import deadline

log = logging.getLogger("hermes_bulk.providers.transport")

#: How much of the answer one read asks for (decoded bytes).
READ_CHUNK = 64 * 1024


@dataclass(frozen=True, slots=True)
class Reply:
    """An HTTP answer: its status, headers, and body (decoded), or `whole=False` and no body
    when the body passed the limit the caller set for that status."""

    status: int
    headers: Any  # a case-insensitive mapping (urllib3's HTTPHeaderDict)
    body: bytearray
    whole: bool


def environment_proxy(url: str) -> str | None:
    """The proxy the environment names for url (HTTPS_PROXY, HTTP_PROXY, ALL_PROXY, in either
    case), unless NO_PROXY exempts its host, as httpx's trust_env does."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass_environment(parts.hostname or "", proxies):
        return None
    return proxy if "://" in proxy else "http://" + proxy


#: The proxies a request can go through: a SOCKS proxy is refused (docs/decisions.md, "Proxies").
PROXY_SCHEMES = frozenset({"http", "https"})


def proxy_refusal(url: str) -> str | None:
    """One line naming the variable and what to do, when the proxy the environment names for
    url is not one the requests can go through (SOCKS); else None."""
    proxy = environment_proxy(url)
    scheme = urlsplit(proxy).scheme.lower() if proxy else ""
    if proxy is None or scheme in PROXY_SCHEMES:
        return None
    target = urlsplit(url).scheme
    names = [f"{target}_proxy", f"{target.upper()}_PROXY", "all_proxy", "ALL_PROXY"]
    name = next((n for n in names if os.environ.get(n, "").strip()), "ALL_PROXY")
    return (
        f"{name} names a {scheme} proxy, which hermes-bulk does not support: unset {name} (or "
        f"add the endpoint's host to NO_PROXY), or name an HTTP proxy there (http://host:port)."
    )


class JsonPoster:
    """POSTs JSON to one URL; each thread has a connection of its own, kept alive, and at most
    max_connections requests are in flight at once (one shared pool would scan its connections
    on every request: benchmarks, row 2)."""

    def __init__(
        self,
        url: str,
        *,
        endpoint: str,
        headers: dict[str, str],
        timeout_s: float,
        max_connections: int,
    ) -> None:
        self.url = url
        self.endpoint = endpoint  # as logged: no secrets
        parts = urlsplit(url)
        refusal = proxy_refusal(url)
        if refusal is not None:  # checked at start (frontends/cli.py); an item never fails for it
            raise ClientUnavailable(refusal)
        self._proxy = environment_proxy(url)
        # A forwarding proxy (plain HTTP) takes the absolute URL; a direct connection or a
        # CONNECT tunnel (HTTPS) the path.
        forwarded = self._proxy is not None and parts.scheme == "http"
        path = urlunsplit(("", "", parts.path or "/", parts.query, ""))
        self._target = url if forwarded else path
        self._headers = {
            "Content-Type": "application/json",
            "Accept-Encoding": "gzip, deflate",
            **headers,
        }
        self._timeout = urllib3.Timeout(connect=min(timeout_s, 10.0), read=timeout_s)
        #: The whole request's bound (connect, send, headers, body): a read timeout alone lets
        #: an answer that drips a byte at a time hold the request for ever.
        self._total_s = timeout_s
        # The certificate store httpx used (certifi, or SSL_CERT_FILE / SSL_CERT_DIR); slow to
        # build, so once for every thread.
        self._ssl = httpx.create_ssl_context() if parts.scheme == "https" else None
        self._slots = threading.BoundedSemaphore(max_connections)
        self._local = threading.local()
        self._pools: list[urllib3.HTTPConnectionPool] = []
        self._lock = threading.Lock()

    def _pool(self) -> urllib3.HTTPConnectionPool:
        """This thread's connection pool (of one connection)."""
        pool = getattr(self._local, "pool", None)
        if pool is None:
            options: dict[str, Any] = {
                "maxsize": 1,
                "block": False,
                "timeout": self._timeout,
                "retries": False,
            }
            if self._ssl is not None:
                options["ssl_context"] = self._ssl
            if self._proxy is not None:
                proxied = urllib3.ProxyManager(self._proxy, num_pools=1, **options)
                pool = proxied.connection_from_url(self.url)
            else:
                pool = urllib3.connection_from_url(self.url, **options)
            self._local.watch = watch = deadline.new_watch()
            new_conn = pool._new_conn
            pool._new_conn = lambda: deadline.watched(new_conn(), watch)  # type: ignore[method-assign]
            self._local.pool = pool
            with self._lock:
                self._pools.append(pool)
        return pool

    def post(self, body: dict[str, Any], *, limit: Callable[[int], int]) -> Reply:
        """One POST of body as JSON; `limit(status)`: the most body bytes read for that status.

        Raises EndpointUnreachable when no connection was made (nothing reached the endpoint),
        TransientModelError for a timeout or a connection lost on the way."""
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        pool = self._pool()
        watch: deadline.Watch = self._local.watch
        with self._slots:
            watch.arm(self._total_s)
            try:
                reply = self._exchange(pool, data, limit)
            except EndpointUnreachable:
                watch.disarm()
                raise
            except Exception:
                if watch.disarm():  # the watchdog cut it: whatever broke, the deadline passed
                    raise self._timed_out() from None
                raise
            if watch.disarm():  # a body without a length ends at the shutdown: not the whole
                raise self._timed_out()
        return reply

    def _timed_out(self) -> TransientModelError:
        log.warning("no whole answer from %s within %s s", self.endpoint, self._total_s)
        return TransientModelError(
            f"the request timed out (no whole answer within {self._total_s:g} s)"
        )

    def _exchange(
        self, pool: urllib3.HTTPConnectionPool, data: bytes, limit: Callable[[int], int]
    ) -> Reply:
        try:
            response = pool.urlopen(
                "POST",
                self._target,
                body=data,
                headers=self._headers,
                retries=False,
                redirect=False,
                assert_same_host=False,
                preload_content=False,
                decode_content=True,
            )
            raw, whole = bytearray(), False
            try:
                raw, whole = _read_bounded(response, limit(response.status))
            finally:
                if not whole:  # unread bytes may be left on it: it cannot carry another request
                    response.close()
                response.release_conn()
        except (NewConnectionError, ConnectTimeoutError, ProxyError, SSLError) as exc:
            # Before the other timeouts: no connection means nothing reached the endpoint (a TLS
            # handshake refused is one too, as httpx counted it).
            log.warning("cannot connect to %s: %r", self.endpoint, exc)
            raise EndpointUnreachable(
                f"cannot connect to {self.endpoint} ({type(exc).__name__})"
            ) from None
        except Urllib3Timeout:
            raise TransientModelError("the request timed out") from None
        except (HTTPError, http.client.HTTPException, OSError) as exc:
            # A dropped connection, a body cut short or that is not valid gzip …
            log.warning("connection error talking to %s: %r", self.endpoint, exc)
            raise TransientModelError(f"connection error ({type(exc).__name__})") from None
        return Reply(response.status, response.headers, raw, whole)

    def close(self) -> None:
        with self._lock:
            pools, self._pools = self._pools, []
        for pool in pools:
            pool.close()


def _read_bounded(response: urllib3.BaseHTTPResponse, limit: int) -> tuple[bytearray, bool]:
    """The (decoded) body, and True; or nothing and False once it passes `limit` bytes."""
    length = response.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:  # compressed, it decodes to more still
        return bytearray(), False
    body = bytearray()
    for chunk in response.stream(READ_CHUNK):
        body += chunk
        if len(body) > limit:
            return bytearray(), False
    return body, True
