"""Owner-only files and folders: everything hermes-bulk writes is readable by its owner alone."""

from __future__ import annotations

import contextlib
import os
import tempfile
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
    """Write a file owner-only, atomically (a reader never sees half a file)."""
    private_dir(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
