"""Huey's queues on the embedded backend: SqliteHuey, every queue in one file beside the store's
(bulk.db -> bulk-queue.db; SqliteStorage keys each row by queue name)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import BackendUnavailable
from .database import SqliteDatabase, sqlite_file_identity

if TYPE_CHECKING:
    from huey import SqliteHuey

QUEUE_ERRORS = (
    sqlite3.OperationalError,
)  #: what Huey's SqliteStorage raises when the file is unusable


def unusable(path: Path, exc: Exception) -> BackendUnavailable:
    return BackendUnavailable(
        f"The queue database {path} is unusable ({exc}); check the disk and permissions."
    )


def queue_maker(path: Path, db: SqliteDatabase) -> Callable[[str], SqliteHuey]:
    """A maker of Huey queues by name, all in the file at path, which lives as long as db."""
    try:
        # Made owner-only before Huey's SQLite opens it (its -wal/-shm take its mode); an
        # older, wider queue file is narrowed by path (chmod opens no descriptor).
        identity = sqlite_file_identity(path)
        path.chmod(0o600)
    except OSError as exc:
        raise unusable(path, exc) from None
    db.companions.append(
        (path, identity)
    )  # so nothing in this process reads it (is_open_sqlite_file)
    made: list[str] = []

    def make_queue(name: str) -> SqliteHuey:
        from huey import SqliteHuey  # with the first queue, not with the store

        # The first queue creates the tables; the others share them.
        try:
            huey = SqliteHuey(
                name,
                filename=str(path),
                fsync=False,
                results=False,
                utc=True,
                create_tables=not made,
            )
        except sqlite3.Error as exc:
            raise unusable(path, exc) from None
        made.append(name)
        return huey

    return make_queue
