"""Owner-only files and folders: everything hermes-bulk writes is readable by its owner alone."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import threading
from pathlib import Path

from .errors import InputError


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


def write_private(path: Path | str, text: str) -> None:
    """Write a file owner-only, atomically (a reader never sees half a file).

    Every completed item comes through here, so it is plain os calls: the temporary name is
    this thread's own (no random names to try) and the folder is made only when missing.
    """
    folder = os.path.dirname(path)
    tmp = os.path.join(folder, f".tmp-{os.getpid()}-{threading.get_ident()}")
    # O_EXCL: never open what is already there (a FIFO would block the write forever, a link
    # would be written through). The name is this thread's own, so whatever holds it is left
    # over from a crash: remove it and create the file afresh.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, 0o600)
    except FileNotFoundError:
        private_dir(Path(folder))
        fd = os.open(tmp, flags, 0o600)
    except FileExistsError:
        _remove(tmp)
        fd = os.open(tmp, flags, 0o600)
    try:
        try:
            data = memoryview(text.encode("utf-8"))
            while data:
                data = data[os.write(fd, data) :]
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


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def os_reason(exc: OSError) -> str:
    return (exc.strerror or type(exc).__name__).lower()


def check_write_target(
    target: Path, *, what: str, flag: str, folder_must_exist: bool = True, devices: bool = False
) -> None:
    """Refuse a path a user named to write to, before anything is written, unless it is a regular
    file or a new name in an existing folder (or, with devices, a character device such as
    /dev/null). One line each, naming what is there and what to do (InputError).

    A symbolic link is refused, naming where it points: writing through it would change what it
    points at (a victim file, a device), and renaming onto it replaces the link. A FIFO would
    block the write until a reader came.
    """

    def refuse(why: str, fix: str = f"choose another {flag}") -> InputError:
        return InputError(f"Cannot write {what} to {target}: {why}; {fix}.")

    try:
        st = os.lstat(target)
    except (FileNotFoundError, NotADirectoryError):  # a new name; its folder is checked below
        st = None
    except OSError as exc:
        raise refuse(os_reason(exc)) from None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise refuse(
                f"it is a symbolic link to {os.readlink(target)}",
                f"give the real path or a new file name as {flag}",
            )
        if devices and stat.S_ISCHR(st.st_mode):
            return
        kind = next((name for test, name in _KINDS if test(st.st_mode)), None)
        if kind:
            raise refuse(f"it is {kind}, not a regular file", f"give a file name as {flag}")
        return
    if folder_must_exist:
        try:
            folder = os.stat(target.parent)
        except OSError as exc:
            missing = isinstance(exc, FileNotFoundError)
            raise refuse(
                f"the folder {target.parent} {'does not exist' if missing else os_reason(exc)}",
                f"create it first or choose another {flag}",
            ) from None
        if not stat.S_ISDIR(folder.st_mode):
            raise refuse(f"{target.parent} is not a folder")


def remove_tree(path: Path, must_be_under: Path) -> None:
    """Delete a folder the project wrote (a job's), refusing anything outside the data directory."""
    resolved = path.resolve()
    if must_be_under.resolve() not in resolved.parents:
        raise InputError(f"Refusing to delete {path}: it is outside {must_be_under}.")
    shutil.rmtree(resolved, ignore_errors=True)
