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
    # O_EXCL: never open what is already there (a FIFO would block the write forever, a link
    # would be written through). The name is this thread's own, so whatever holds it is left
    # over from a crash: remove it and create the file afresh.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, 0o600)
    except FileNotFoundError:
        private_dir(path.parent)
        fd = os.open(tmp, flags, 0o600)
    except FileExistsError:
        _remove(tmp)
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


def _remove(path: str) -> None:
    """Remove a left-over file, link, FIFO or (empty or not) directory at path."""
    import shutil  # rarely needed: not loaded by every command that imports files

    try:
        os.unlink(path)
    except IsADirectoryError:
        shutil.rmtree(path)
    except PermissionError:  # Linux reports a directory to unlink() as EISDIR, others as EPERM
        if not os.path.isdir(path) or os.path.islink(path):
            raise
        shutil.rmtree(path)
