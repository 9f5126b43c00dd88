"""Owner-only files and folders: everything hermes-bulk writes is readable by its owner alone."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path


def private_dir(path: Path) -> Path:
    """Create path and any missing parents owner-only (mkdir's mode only covers the last one)."""
    missing = []
    current = path
    while not current.exists():
        missing.append(current)
        current = current.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o700)
    return path


def write_private(path: Path, text: str) -> None:
    """Write a file owner-only, atomically (a reader never sees half a file).

    Every completed item comes through here, so it is plain os calls: the temporary name is
    this thread's own (no random names to try) and the folder is made only when missing.
    """
    tmp = os.path.join(path.parent, f".tmp-{os.getpid()}-{threading.get_ident()}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, 0o600)
    except FileNotFoundError:
        private_dir(path.parent)
        fd = os.open(tmp, flags, 0o600)
    try:
        try:
            data = memoryview(text.encode("utf-8"))
            while data:
                data = data[os.write(fd, data):]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
