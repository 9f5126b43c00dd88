"""A backend from one URL: the Huey queue, the job store and the shared limiter, together.

`sqlite:///path/bulk.db` (the embedded default: the store in that file, the Huey queues beside it
in `bulk-queue.db`) or `redis://…` / `rediss://…` / `redis+sentinel://…` (the fleet; the Huey
queues on the store's own connection pool, Sentinel's included). config/backend_url.py says
what a URL names; this is the only place that maps it to classes, and nothing above it branches
on the backend.

One Huey queue per route (endpoints.route: the kind of model client, and for HTTP jobs their
endpoint and key): a trigger goes only to workers that can call the job's model at the job's
endpoint, so a worker that cannot (the Hermes gateway's, for a job made by `hermes-bulk create`; one
configured for another endpoint) never takes it and makes it wait. Both backends key a queue by its
Huey name (Redis: in the key names; SQLite: the `queue` column of one file)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..config.backend_url import SqliteUrl, parse_backend_url
from ..errors import BackendUnavailable
from ..store.protocol import JobStore, SharedLimits
from ..store.sqlite import queue as sqlite_queue
from ..store.sqlite.database import open_database, sqlite_file_identity
from ..store.sqlite.jobs import SqliteJobStore
from ..store.sqlite.limits import SqliteLimits
from . import endpoints

if TYPE_CHECKING:  # huey is loaded with the first queue: `list` and `status` never need it
    from huey import Huey
    from huey.api import TaskWrapper

    from ..config.settings import Settings

QUEUE_NAME = "hermes-bulk"  #: the queue of jobs made by `hermes-bulk create` (client "http")
DEFAULT_CLIENT = "http"


def queue_name(client: str) -> str:
    """The Huey name of the queue for jobs of one kind of model client: `hermes-bulk` for http
    jobs (the name every release used), `hermes-bulk.<client>` for the others."""
    return QUEUE_NAME if client == DEFAULT_CLIENT else f"{QUEUE_NAME}.{client}"


@dataclass
class Backend:
    url: str
    make_queue: Callable[[str], Huey]  # a Huey queue by name, on this backend's storage
    store: JobStore
    limits: SharedLimits
    queue_errors: tuple[type[Exception], ...] = ()  # what the queue raises when the backend is gone
    unavailable: Callable[[Exception], BackendUnavailable] = lambda exc: BackendUnavailable(
        str(exc)
    )
    warnings: Callable[[], list[str]] = list  # e.g. Redis without persistence
    #: Where writes go now, one line (Redis: the primary and its replicas); None for SQLite.
    describe: Callable[[], str | None] = lambda: None
    _queues: dict[str, tuple[Huey, TaskWrapper]] = field(default_factory=dict, init=False)
    _clients: dict[str, str] = field(default_factory=dict, init=False)  # job id -> its route
    #: In a worker's process: the route of its own endpoint, which HTTP jobs that recorded no
    #: endpoint travel on from here (endpoints.route); None elsewhere.
    legacy_http_route: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def _queue(self, client: str) -> tuple[Huey, TaskWrapper]:
        from .tasks import register_process_item

        with self._lock:
            queue = self._queues.get(client)
            if queue is None:
                huey = self.make_queue(queue_name(client))
                queue = self._queues[client] = (huey, register_process_item(huey))
            return queue

    def queue(self, client: str) -> Huey:
        """The Huey queue that carries triggers of jobs whose model client is `client`."""
        return self._queue(client)[0]

    def client_of(self, job_id: str) -> str | None:
        """A job's route (endpoints.route; it never changes); None when there is no such job."""
        client = self._clients.get(job_id)
        if client is None:
            job = self.store.get_job(job_id)
            if job is None:
                return None
            client = self._clients[job_id] = endpoints.route(job.spec)
        if client == DEFAULT_CLIENT and self.legacy_http_route:
            return self.legacy_http_route
        return client

    def trigger(
        self, job_id: str, index_hint: int = 0, count: int = 1, *, client: str | None = None
    ) -> None:
        """Enqueue `count` triggers for a job (each one lets one more item start), on the queue
        of its kind of model client (looked up when not given; a deleted job gets none)."""
        client = client or self.client_of(job_id)
        if client is None:
            return
        huey, process_item = self._queue(client)
        try:
            for i in range(count):
                huey.enqueue(process_item.s(job_id, index_hint + i))
        except self.queue_errors as exc:
            raise self.unavailable(exc) from exc

    def queue_length(self, clients: Iterable[str] = (DEFAULT_CLIENT,)) -> int:
        """Triggers waiting on the queues of these kinds of model client."""
        try:
            return sum(self.queue(client).pending_count() for client in clients)
        except self.queue_errors as exc:
            raise self.unavailable(exc) from exc

    def close(self) -> None:
        self.store.close()
        with self._lock:
            queues, self._queues = list(self._queues.values()), {}
        for (
            huey,
            _,
        ) in queues:  # all at once: on SQLite they share one file (DESIGN.md invariant 10)
            close = getattr(huey.storage, "close", None)
            if close:
                close()


# One Backend per URL, and per store file for sqlite:// (however the URL spells its path), so a
# process never has two Huey queues on one file: invariant 10.
_open: dict[object, Backend] = {}
_open_lock = threading.Lock()


def open_backend(settings: Settings) -> Backend:
    """The backend for settings.backend_url; one per URL per process (connections are shared)."""
    url = settings.backend_url
    with _open_lock:
        key = _backend_key(url)
        backend = _open.get(key)
        if backend is None:
            backend = _open[key] = build_backend(url)
        return backend


def missing_database(settings: Settings) -> Path | None:
    """The SQLite store file of settings' backend when it does not exist yet (else None): what
    open_backend would make."""
    location = parse_backend_url(settings.backend_url)
    if not isinstance(location, SqliteUrl):
        return None
    return None if location.path.exists() else location.path


def _backend_key(url: str) -> object:
    location = parse_backend_url(url)
    if not isinstance(location, SqliteUrl):
        return url
    try:
        return "sqlite", sqlite_file_identity(location.path)
    except OSError:
        return url  # build_backend says what is wrong with the file


def close_all() -> None:
    with _open_lock:
        for backend in _open.values():
            backend.close()
        _open.clear()


@contextlib.contextmanager
def closing_new() -> Iterator[None]:
    """Backends first opened inside the block are closed when it ends; those open before stay
    (a command run inside a process that lives on, such as a test's)."""
    with _open_lock:
        before = set(_open)
    try:
        yield
    finally:
        with _open_lock:
            new = [key for key in _open if key not in before]
            for key in new:
                _open.pop(key).close()


def build_backend(url: str) -> Backend:
    location = parse_backend_url(url)
    if isinstance(location, SqliteUrl):
        db = open_database(location.path)
        try:
            make_queue = sqlite_queue.queue_maker(location.queue_path, db)
        except BackendUnavailable:
            db.close()
            raise
        return Backend(
            url=url,
            make_queue=make_queue,
            store=SqliteJobStore(db),
            limits=SqliteLimits(db),
            queue_errors=sqlite_queue.QUEUE_ERRORS,
            unavailable=lambda exc: sqlite_queue.unusable(location.queue_path, exc),
        )
    # Imported here: a SQLite user never loads redis-py.
    from ..store.redis import queue as redis_queue
    from ..store.redis.connection import connect_redis, describe_primary, persistence_warning
    from ..store.redis.jobs import RedisJobStore
    from ..store.redis.limits import RedisLimits

    conn = connect_redis(location)
    return Backend(
        url=url,
        make_queue=redis_queue.queue_maker(conn),
        store=RedisJobStore(conn),
        limits=RedisLimits(conn),
        queue_errors=redis_queue.QUEUE_ERRORS,
        unavailable=conn.unavailable,
        warnings=lambda: [w for w in [persistence_warning(conn)] if w],
        describe=lambda: describe_primary(conn),
    )
