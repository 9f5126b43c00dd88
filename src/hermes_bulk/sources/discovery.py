"""Discovery: the items an `--over` path holds, in item order, streamed."""

from __future__ import annotations

import os
import stat as stat_mod
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from ..errors import InputError
from .items import WHOLE_FILE, Skipped, SourceItem, stat_sig
from .regular_files import (
    NotRegularFile,
    binary_message,
    decode_text,
    is_binary,
    open_file,
    os_reason,
)
from .rows import RECORD_READERS


def kind_of(path: Path) -> str:
    if path.is_dir():
        return "directory"
    return {".csv": "csv", ".json": "json", ".jsonl": "jsonl"}.get(path.suffix.lower(), "file")


class Source:
    """A validated `--over` path. `entries()` yields SourceItem and Skipped in item order."""

    def __init__(self, path: str | os.PathLike[str], *, max_item_bytes: int) -> None:
        raw = Path(path).expanduser()
        try:
            resolved = raw.resolve(strict=True)
            st = os.stat(resolved)
        except FileNotFoundError:
            raise InputError(f"--over {path}: no such file or directory.") from None
        except RuntimeError:  # Path.resolve reports a symlink loop this way
            raise InputError(
                f"--over {path}: symbolic link loop; point --over at the real path."
            ) from None
        except OSError as exc:
            raise InputError(f"--over {path}: cannot read it ({os_reason(exc)}).") from None
        if not (stat_mod.S_ISDIR(st.st_mode) or stat_mod.S_ISREG(st.st_mode)):
            raise InputError(f"--over {path}: not a regular file or directory.")
        if not os.access(resolved, os.R_OK | (os.X_OK if stat_mod.S_ISDIR(st.st_mode) else 0)):
            raise InputError(f"--over {path}: permission denied; make it readable by this user.")
        self.path = resolved
        self.kind = kind_of(resolved)
        self.max_item_bytes = max_item_bytes

    def entries(self) -> Iterator[SourceItem | Skipped]:
        if self.kind == "directory":
            yield from _walk(self.path, "", self.max_item_bytes)
            return
        with open_file(self.path, follow=False) as f:  # self.path is resolved: no link is left
            sig = stat_sig(os.fstat(f.fileno()))
            if self.kind == "file":
                yield _whole_file(self.path, f, sig, self.max_item_bytes)
            else:
                yield from RECORD_READERS[self.kind](f, self.path, sig, self.max_item_bytes)


# Directories ----------------------------------------------------------------------------------


def _walk(root: Path, rel: str, max_item_bytes: int) -> Iterator[SourceItem | Skipped]:
    directory = root / rel if rel else root
    try:
        with os.scandir(directory) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as exc:
        yield Skipped(rel + "/", f"unreadable directory ({os_reason(exc)})")
        return
    for entry in entries:
        name = f"{rel}/{entry.name}" if rel else entry.name
        if entry.name.startswith("."):
            yield Skipped(name, "hidden entry")
        elif entry.is_symlink():
            yield Skipped(name, "symbolic link")
        elif entry.is_dir(follow_symlinks=False):
            yield from _walk(root, name, max_item_bytes)
        elif not entry.is_file(follow_symlinks=False):
            yield Skipped(name, "not a regular file")
        else:
            yield directory_file(root / name, name, max_item_bytes)


def directory_file(path: Path, name: str, max_item_bytes: int) -> SourceItem | Skipped:
    try:
        with open_file(path, follow=False) as f:
            st = os.fstat(f.fileno())
            if st.st_size == 0:
                return Skipped(name, "empty file")
            data = f.read(max_item_bytes + 1)  # bounded: the file may grow after fstat
            if st.st_size > max_item_bytes or len(data) > max_item_bytes:
                return Skipped(name, f"larger than max_item_bytes ({max_item_bytes} bytes)")
    except NotRegularFile as exc:  # swapped in after the directory was listed
        return Skipped(name, f"not a regular file ({exc.reason})")
    except InputError as exc:
        return Skipped(name, str(exc).split(": ", 1)[-1].rstrip("."))
    if is_binary(data):
        return Skipped(name, "binary file (contains NUL bytes)")
    text = decode_text(data)
    if text is None:
        return Skipped(name, "not UTF-8 text")
    return SourceItem(name, text, name, WHOLE_FILE, stat_sig(st))


def _whole_file(path: Path, f: BinaryIO, sig: str, max_item_bytes: int) -> SourceItem:
    size = int(sig.split(":")[0])
    if size == 0:
        raise InputError(f"{path}: the file is empty; there is nothing to process.")
    if size > max_item_bytes:
        raise InputError(
            f"{path}: {size} bytes is more than max_item_bytes ({max_item_bytes}); "
            "split it, or raise HERMES_BULK_MAX_ITEM_BYTES."
        )
    data = f.read(max_item_bytes + 1)  # bounded: the file may grow after fstat
    if len(data) > max_item_bytes:
        raise InputError(
            f"{path}: it grew past max_item_bytes ({max_item_bytes}) while being read; "
            "try again once it is written."
        )
    if is_binary(data):
        raise InputError(binary_message(path))
    text = decode_text(data)
    if text is None:
        raise InputError(f"{path}: not UTF-8 text; convert it (for example with iconv -t UTF-8).")
    return SourceItem(path.name, text, "", WHOLE_FILE, sig)
