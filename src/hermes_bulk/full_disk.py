"""A full disk, told apart from a bug: the one line a user sees instead of "internal error".

SQLite says "database or disk is full" (SQLITE_FULL) and the OS says ENOSPC or EDQUOT, often
as the cause of another error; either way the traceback file is on the same full disk, so
pointing at it helps nobody. What was being written is rolled back (a transaction) or never
renamed into place (an export), so running the command again after freeing space is safe.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

SQLITE_FULL = 13  #: sqlite3's result code for "database or disk is full"


def disk_full_at(exc: BaseException, home: Path | None) -> Path | None:
    """The folder whose disk ran out of space, if that is what exc (or what it was raised from)
    says: an OSError names its file; SQLite's error is the data directory's disk."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            if isinstance(current.filename, str | bytes):
                return Path(os.path.dirname(os.path.abspath(os.fsdecode(current.filename))))
            return home or Path.cwd()
        if getattr(
            current, "sqlite_errorcode", None
        ) == SQLITE_FULL or "database or disk is full" in str(current):
            return home or Path.cwd()
        current = current.__cause__ or current.__context__
    return None


#: Less free space than this is full: SQLite needs room for a journal page and its WAL index.
NEARLY_FULL_BYTES = 64 * 1024


def disk_is_full(folder: Path) -> bool:
    """Whether the disk of folder (or of its nearest existing parent) has no room left to write."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        st = os.statvfs(folder)
    except OSError:
        return False
    # f_blocks 0: a file system with no blocks to fill (/proc, sysfs) is never "full".
    return st.f_blocks > 0 and st.f_bavail * st.f_frsize < NEARLY_FULL_BYTES
