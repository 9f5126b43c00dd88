"""Reading only regular files (DESIGN.md invariant 11), and telling text from what is not."""

from __future__ import annotations

import codecs
import errno
import io
import os
import stat as stat_mod
from pathlib import Path
from typing import BinaryIO

from ..errors import InputError
from ..store.sqlite.database import is_open_sqlite_file


class NotRegularFile(InputError):
    """Something other than a regular file is at a path to read; `reason` says what."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}; only regular files are read.")
        self.reason = reason


_KINDS = (
    (stat_mod.S_ISDIR, "a directory"),
    (stat_mod.S_ISFIFO, "a FIFO (named pipe)"),
    (stat_mod.S_ISCHR, "a character device"),
    (stat_mod.S_ISBLK, "a block device"),
    (stat_mod.S_ISSOCK, "a socket"),
)
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def open_file(path: Path, *, follow: bool = True) -> BinaryIO:
    """A regular file opened for reading, or NotRegularFile / InputError saying why not.

    O_NONBLOCK: opening a FIFO would otherwise wait for a writer forever (it means nothing for
    a regular file). O_NOFOLLOW (follow=False) where a link in the file's place is not what was
    found at create. fstat on the open descriptor decides, so nothing swapped in between a
    check and the open is read. Never one of this process's open SQLite files: closing any
    descriptor of it would drop this process's SQLite locks on it (invariant 10).
    """
    if is_open_sqlite_file(path):
        raise InputError(f"{path}: a hermes-bulk database in use, not a source.")
    try:
        fd = os.open(path, _OPEN_FLAGS | (0 if follow else os.O_NOFOLLOW))
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise NotRegularFile(path, "a symbolic link") from None
        raise InputError(f"{path}: cannot read it ({os_reason(exc)}).") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat_mod.S_ISREG(mode):
            raise NotRegularFile(
                path, next((name for test, name in _KINDS if test(mode)), "not a regular file")
            )
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular_file(path: Path, limit: int) -> bytes | None:
    """The bytes of a regular file (links followed), or None when it is larger than limit.

    NotRegularFile for a FIFO, device or directory; InputError when it cannot be opened.
    """
    with open_file(path) as f:
        data = f.read(limit + 1)
    return None if len(data) > limit else data


_TEXT_BOMS = (codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE, codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)


def is_binary(data: bytes) -> bool:
    """NUL bytes outside UTF-16/32 text (which starts with its byte order mark): an image, an
    archive, a program. Such a file needs another file, not a conversion (git decides the same
    way)."""
    return b"\x00" in data and not data.startswith(_TEXT_BOMS)


def file_start(f: BinaryIO, size: int = 8192) -> bytes:
    """The first bytes of a file, read without moving its position (b"" for an in-memory window)."""
    try:
        return os.pread(f.fileno(), size, 0)
    except (OSError, io.UnsupportedOperation):
        return b""


def binary_message(path: Path) -> str:
    return (
        f"{path}: a binary file (it contains NUL bytes), not UTF-8 text; give a text file, "
        "or a folder of text files."
    )


def decode_text(data: bytes) -> str | None:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None


def os_reason(exc: OSError) -> str:
    return (exc.strerror or type(exc).__name__).lower()
