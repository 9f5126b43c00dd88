"""`hermes-bulk dashboard`: bind the address, print the URL with its token, serve with uvicorn.

The socket is bound here, before uvicorn starts, so a port in use is one line and exit 1 (uvicorn
would log and exit on its own), and `--port 0` takes a free port that the printed URL names.
uvicorn handles SIGINT and SIGTERM: open requests finish (within two seconds), then it exits.
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Callable

import uvicorn

from ...errors import InputError
from ...fleet import broker
from ...jobs.service import Jobs
from ...redact import public_url
from .access import Access, choose_token
from .app import build_app, cookie_name
from .figures import Figures


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP spelled out: asyncio turns Nagle off (TCP_NODELAY) only on sockets that say so,
    # and without it each answer on a kept-alive connection waits for the peer's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise InputError(
            f"--host {host} --port {port}: cannot listen there ({exc.strerror}); "
            "choose another port (or --port 0 for a free one)."
        ) from None
    sock.set_inheritable(True)
    return sock


def url_of(host: str, port: int) -> str:
    shown = (
        "127.0.0.1"
        if host in ("", "0.0.0.0")
        else f"[{host}]"
        if ":" in host and host != "::"
        else host
    )
    return f"http://{'[::1]' if host == '::' else shown}:{port}/"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _say(line: str) -> None:
    print(line, flush=True)  # a pipe (a test, a service log) sees the URL at once


def serve(
    jobs: Jobs, *, host: str, port: int, token: str | None, say: Callable[[str], None] = _say
) -> None:
    """Serve until SIGINT/SIGTERM. token: HERMES_BULK_DASHBOARD_TOKEN, or None (a new one)."""
    chosen, made = choose_token(token, host)
    sock = bind(host, port)
    port = sock.getsockname()[1]
    figures = Figures(jobs)
    app = build_app(jobs, figures, Access(chosen, cookie_name(port)))
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        loop="asyncio",
        http="h11",
        ws="none",
        timeout_graceful_shutdown=2,
        server_header=False,
    )
    server = uvicorn.Server(config)
    sampler = figures.start_sampling()
    url = url_of(host, port)
    say(f"hermes-bulk dashboard of {public_url(jobs.settings.backend_url)}")
    say(f"Open: {url}?token={chosen}")
    if not made:
        say("(the token is HERMES_BULK_DASHBOARD_TOKEN)")
    say("Stop it with Ctrl-C.")
    if threading.current_thread() is threading.main_thread():
        # uvicorn handles SIGINT and SIGTERM, then raises them again once it has shut down, to the
        # handler there was before it: SIGTERM's default would end the process before the
        # cleanup below. Both end as KeyboardInterrupt, caught here.
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        figures.stop()
        sampler.join(10)
        sock.close()
        # Every connection closed here, not left to the interpreter's exit: the last one to
        # close a SQLite file checkpoints it and removes its -wal and -shm (nothing left behind).
        broker.close_all()
    say("Dashboard stopped.")
