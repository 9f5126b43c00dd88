"""A backend from one URL: the Huey queue, the job store and the shared limiter, together.

`sqlite:///path/bulk.db` (the embedded default: the store in that file, the Huey queue beside it
in `bulk-queue.db`) or `redis://…` / `rediss://…` (the fleet). This is the only place that maps
a URL to classes; nothing above it branches on the backend.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from huey import Huey, SqliteHuey
from huey.api import TaskWrapper

from .config import Settings
from .errors import BackendUnavailable, ConfigError
from .store.protocol import JobStore, SharedLimits
from .store.sqlite import SqliteDatabase, SqliteJobStore, SqliteLimits
from .tasks import register_process_item

if TYPE_CHECKING:
    from .worker import WorkerRuntime

QUEUE_NAME = "hermes-bulk"


@dataclass
class Backend:
    url: str
    huey: Huey
    store: JobStore
    limits: SharedLimits
    queue_errors: tuple[type[Exception], ...] = ()  # what the queue raises when the backend is gone
    unavailable: Callable[[Exception], BackendUnavailable] = lambda exc: BackendUnavailable(str(exc))
    warnings: Callable[[], list[str]] = list  # e.g. Redis without persistence
    process_item: TaskWrapper = field(init=False)
    runtime: WorkerRuntime | None = None

    def __post_init__(self) -> None:
        self.process_item = register_process_item(self.huey, lambda: self.runtime)

    def trigger(self, job_id: str, index_hint: int = 0, count: int = 1) -> None:
        """Enqueue `count` triggers for a job (each one lets one more item start)."""
        try:
            for i in range(count):
                self.huey.enqueue(self.process_item.s(job_id, index_hint + i))
        except self.queue_errors as exc:
            raise self.unavailable(exc) from exc

    def queue_length(self) -> int:
        try:
            return self.huey.pending_count()
        except self.queue_errors as exc:
            raise self.unavailable(exc) from exc

    def close(self) -> None:
        self.store.close()
        close = getattr(self.huey.storage, "close", None)
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
    """A backend URL fit for logs and messages: the password replaced by ***."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:  # not parsable: show no more than the scheme
        return url.split("://", 1)[0] + "://…"
    if parts.password:
        netloc = parts.netloc.replace(":" + parts.password + "@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


_open: dict[str, Backend] = {}
_open_lock = threading.Lock()


def open_backend(settings: Settings) -> Backend:
    """The backend for settings.backend_url; one per URL per process (connections are shared)."""
    url = settings.backend_url
    with _open_lock:
        backend = _open.get(url)
        if backend is None:
            backend = _open[url] = _build(url)
        return backend


def close_all() -> None:
    with _open_lock:
        for backend in _open.values():
            backend.close()
        _open.clear()


def _build(url: str) -> Backend:
    scheme = url.split("://", 1)[0].lower()
    if scheme == "sqlite":
        store_path, queue_path = sqlite_paths(url)
        db = SqliteDatabase(store_path)
        huey = SqliteHuey(QUEUE_NAME, filename=str(queue_path), fsync=False, results=False, utc=True)
        queue_path.chmod(0o600)
        return Backend(url=url, huey=huey, store=SqliteJobStore(db), limits=SqliteLimits(db),
                       queue_errors=(sqlite3.OperationalError,),
                       unavailable=lambda exc: BackendUnavailable(f"The queue database {queue_path} is "
                                                                  f"unusable ({exc}); check the disk and permissions."))
    if scheme in ("redis", "rediss"):
        from .store import redis_store

        huey, store, limits, conn = redis_store.open_redis_backend_parts(url, QUEUE_NAME)
        warning = lambda: [w for w in [redis_store.persistence_warning(conn)] if w]  # noqa: E731
        return Backend(url=url, huey=huey, store=store, limits=limits, queue_errors=redis_store.QUEUE_ERRORS,
                       unavailable=conn.unavailable, warnings=warning)
    raise ConfigError(f"Invalid setting HERMES_BULK_BACKEND: unknown scheme {scheme!r}; use sqlite:// or redis://.")
