"""The jobs whose end a Hermes user is still to hear of, kept on disk per profile.

`<profile home>/plugin-data/bulk/notices.json` (owner-only) maps each job a /bulk command set
running to the session key to post its end into ("" where Hermes gives none). A gateway
restart keeps it; `take` removes a job under the lock, so each end is told once, whichever
thread or process tells it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from ..files import private_dir

log = logging.getLogger("hermes_bulk.plugin")

FILE = "notices.json"
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _path(profile: str) -> Path:
    return Path(profile) / "plugin-data" / "bulk" / FILE


@contextlib.contextmanager
def _book(profile: str) -> Iterator[dict[str, str]]:
    """The book, read and written back under an exclusive lock (several processes may share it)."""
    path = _path(profile)
    private_dir(path.parent)
    try:
        # O_NOFOLLOW: never written through a link; O_NONBLOCK: a FIFO is refused, not waited on.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC, 0o600)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise IsADirectoryError(path)  # any kind but a regular file: handled as one below
    except OSError as exc:  # a link, a FIFO, a folder in its place: left alone, not followed
        log.warning("bulk: %s is not a regular file (%s); job ends are not kept", path, exc)
        yield {}
        return
    os.fchmod(fd, 0o600)  # owner-only, whatever made it
    with os.fdopen(fd, "r+", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        text = f.read()
        try:
            book = json.loads(text) if text.strip() else {}
        except ValueError:  # a torn or hand-edited file: start over rather than fail the reply
            log.warning("bulk: %s could not be read; starting it afresh", path)
            book = {}
        if not isinstance(book, dict):
            book = {}
        before = dict(book)
        yield book
        if book != before:
            f.seek(0)
            f.truncate()
            f.write(json.dumps(book, sort_keys=True))
            f.flush()
            os.fsync(f.fileno())


def watched(profile: str) -> dict[str, str]:
    """Job id -> session key ("" for none) of the jobs still to be told of."""
    if not _path(profile).exists():
        return {}
    with _book(profile) as book:
        return {str(k): str(v) for k, v in book.items()}


def watch(profile: str, job_id: str, session_key: str = "") -> None:
    with _book(profile) as book:
        book[job_id] = session_key


def unwatch(profile: str, job_id: str) -> None:
    if _path(profile).exists():
        with _book(profile) as book:
            book.pop(job_id, None)


def take(profile: str, job_id: str) -> bool:
    """Removes the job from the book; True for the one caller that removed it (it tells)."""
    if not _path(profile).exists():
        return False
    with _book(profile) as book:
        return book.pop(job_id, None) is not None
