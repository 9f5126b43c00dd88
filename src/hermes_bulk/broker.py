"""A backend from one URL: the Huey queue, the job store and the shared limiter, together.

`sqlite:///path/bulk.db` (the embedded default: the store in that file, the Huey queues beside it
in `bulk-queue.db`) or `redis://…` / `rediss://…` (the fleet). This is the only place that maps
a URL to classes; nothing above it branches on the backend.

One Huey queue per kind of model client (job.spec.client): a trigger goes only to workers that
can call the job's model, so a worker that cannot (the Hermes gateway's, for a job made by
`hermes-bulk create`) never takes it and makes it wait. Both backends key a queue by its Huey
name (Redis: in the key names; SQLite: the `queue` column of one file).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from huey import Huey, SqliteHuey
from huey.api import TaskWrapper

from .config import Settings
from .errors import BackendUnavailable, ConfigError
from .redact import public_url, register_url
from .store.protocol import JobStore, SharedLimits
from .store.sqlite import SqliteJobStore, SqliteLimits, open_database, sqlite_file_identity
from .tasks import register_process_item

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
    unavailable: Callable[[Exception], BackendUnavailable] = lambda exc: BackendUnavailable(str(exc))
    warnings: Callable[[], list[str]] = list  # e.g. Redis without persistence
    _queues: dict[str, tuple[Huey, TaskWrapper]] = field(default_factory=dict, init=False)
    _clients: dict[str, str] = field(default_factory=dict, init=False)  # job id -> its client kind
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        self._queue(DEFAULT_CLIENT)

    def _queue(self, client: str) -> tuple[Huey, TaskWrapper]:
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
        """A job's kind of model client (it never changes); None when there is no such job."""
        client = self._clients.get(job_id)
        if client is None:
            job = self.store.get_job(job_id)
            if job is None:
                return None
            client = self._clients[job_id] = job.spec.client
        return client

    def trigger(self, job_id: str, index_hint: int = 0, count: int = 1, *, client: str | None = None) -> None:
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
        for huey, _ in queues:  # all at once: on SQLite they share one file (DESIGN.md invariant 10)
            close = getattr(huey.storage, "close", None)
            if close:
                close()


def sqlite_paths(url: str) -> tuple[Path, Path]:
    """(store file, queue file) of a sqlite:// URL (three slashes + relative, or four + absolute)."""
    parts = urlsplit(url)
    raw = parts.path[1:] if parts.path.startswith("/") else parts.path
    if parts.netloc or not raw:
        raise ConfigError(f"Invalid setting HERMES_BULK_BACKEND: {url!r} is not sqlite:///path/to/bulk.db.")
    store = Path(raw).expanduser()
    return store, store.with_name(store.stem + "-queue.db")


def redacted_url(url: str) -> str:
    """A backend URL fit for logs and messages: the password replaced by *** (redact.public_url);
    an unparsable one shows no more than its scheme."""
    try:
        urlsplit(url).port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        return url.split("://", 1)[0] + "://…"
    return public_url(url)


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
            backend = _open[key] = _build(url)
        return backend


def _backend_key(url: str) -> object:
    if url.split("://", 1)[0].lower() != "sqlite":
        return url
    store_path, _ = sqlite_paths(url)
    try:
        return "sqlite", sqlite_file_identity(store_path)
    except OSError:
        return url  # _build says what is wrong with the file


def close_all() -> None:
    with _open_lock:
        for backend in _open.values():
            backend.close()
        _open.clear()


def _build(url: str) -> Backend:
    register_url(url)  # a Redis error or a log line may quote the URL, password and all
    scheme = url.split("://", 1)[0].lower()
    if scheme == "sqlite":
        store_path, queue_path = sqlite_paths(url)
        db = open_database(store_path)
        try:
            # Made owner-only before Huey's SQLite opens it (its -wal/-shm take its mode); an
            # older, wider queue file is narrowed by path (chmod opens no descriptor).
            sqlite_file_identity(queue_path)
            queue_path.chmod(0o600)
            db.companions.append(queue_path)  # so nothing in this process reads it (is_open_sqlite_file)
        except OSError as exc:
            db.close()
            raise BackendUnavailable(f"The queue database {queue_path} is unusable ({exc}); check the "
                                     "disk and permissions.") from None
        made: list[str] = []

        def make_queue(name: str) -> Huey:
            # The first queue creates the tables; the others share them: SqliteStorage keys
            # every row by queue name.
            try:
                huey = SqliteHuey(name, filename=str(queue_path), fsync=False, results=False, utc=True,
                                  create_tables=not made)
            except sqlite3.Error as exc:
                raise BackendUnavailable(f"The queue database {queue_path} is unusable ({exc}); check "
                                         "the disk and permissions.") from None
            made.append(name)
            return huey

        return Backend(url=url, make_queue=make_queue, store=SqliteJobStore(db), limits=SqliteLimits(db),
                       queue_errors=(sqlite3.OperationalError,),
                       unavailable=lambda exc: BackendUnavailable(f"The queue database {queue_path} is "
                                                                  f"unusable ({exc}); check the disk and permissions."))
    if scheme in ("redis", "rediss"):
        from .store import redis_store

        make_queue, store, limits, conn = redis_store.open_redis_backend_parts(url)
        warning = lambda: [w for w in [redis_store.persistence_warning(conn)] if w]  # noqa: E731
        return Backend(url=url, make_queue=make_queue, store=store, limits=limits, queue_errors=redis_store.QUEUE_ERRORS,
                       unavailable=conn.unavailable, warnings=warning)
    raise ConfigError(f"Invalid setting HERMES_BULK_BACKEND: unknown scheme {scheme!r}; use sqlite:// or redis://.")
