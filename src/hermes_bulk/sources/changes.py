"""Reading an item again, to see whether its source changed since the job was created."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import threading
from pathlib import Path
from typing import BinaryIO

from ..errors import InputError, SourceUnusable
from .items import DEFAULT_MAX_ITEM_BYTES, WHOLE_FILE, content_hash, stat_sig
from .regular_files import NotRegularFile, decode_text, open_file
from .rows import JSON_CHECK, RECORD_READERS, JsonArrayReader, csv_header, csv_rows, render_csv_row


def source_changed(
    kind: str,
    source: str,
    origin: str,
    offset: int,
    number: int,
    recorded_sig: str,
    expected_hash: str,
    *,
    max_item_bytes: int = DEFAULT_MAX_ITEM_BYTES,
) -> bool:
    """True when the item's source is readable here and now holds other content for it.

    An unreadable source (deleted, or on another machine) is not a change: the content captured
    at create is what gets processed. When the file's size and modification time are what they
    were at create, it is taken as unchanged without reading it (as make and rsync do).
    Otherwise the record at its old byte offset is checked first (the usual case: an edit
    elsewhere in the file), reading at most max_item_bytes; failing that, record `number` is
    found by parsing the file once (cached per file version), so an edit before the record
    does not make it look changed. A whole file now larger than max_item_bytes has changed
    (it was at most that at create) and is not read.

    Raises SourceUnusable when something other than a regular file is in the source's place
    (a FIFO, device, directory or symbolic link): the item fails with that reason.
    """
    # The usual case, in one system call and no pathlib (which cost twice the call): the same
    # regular file, untouched since create.
    name = os.path.join(source, origin) if kind == "directory" else source
    try:
        seen = os.lstat(name)
    except OSError:
        seen = None  # open_file below says why
    if seen is not None and stat.S_ISREG(seen.st_mode) and stat_sig(seen) == recorded_sig:
        return False
    path = Path(name)
    try:
        with open_file(path, follow=False) as f:
            st = os.fstat(f.fileno())
            sig = stat_sig(st)
            if sig == recorded_sig:
                return False
            if offset == WHOLE_FILE:
                if st.st_size > max_item_bytes:
                    return True
                return content_hash(decode_text(f.read(max_item_bytes + 1)) or "") != expected_hash
            if content_hash(_record_at(kind, f, path, offset, max_item_bytes)) == expected_hash:
                return False
    except NotRegularFile as exc:
        raise SourceUnusable(
            f"the source {path} is {exc.reason}; only regular files are read"
        ) from None
    except InputError:
        return False
    digests = record_digests(kind, path, sig)
    return number >= len(digests) // DIGEST_SIZE or digests[
        number * DIGEST_SIZE : (number + 1) * DIGEST_SIZE
    ] != bytes.fromhex(expected_hash[3:])


def bounded_window(f: BinaryIO, offset: int, size: int) -> BinaryIO:
    """At most size bytes of f from offset, in memory: one record's re-read stays bounded."""
    f.seek(offset)
    return io.BytesIO(f.read(size))


def _record_at(kind: str, f: BinaryIO, path: Path, offset: int, max_item_bytes: int) -> str:
    """The record that starts at a byte offset ("" when none parses in max_item_bytes there)."""
    try:
        if kind == "csv":
            header_row = next(csv_rows(bounded_window(f, 0, max_item_bytes), path), None)
            row = next(csv_rows(bounded_window(f, offset, max_item_bytes), path), None)
            if header_row is None or row is None:
                return ""
            header = csv_header(header_row[1])
            return render_csv_row(header, row[1][: len(header)])
        window = bounded_window(f, offset, max_item_bytes)
        if kind == "jsonl":
            return window.readline().decode("utf-8").strip()
        return JsonArrayReader(window, path)._element(JSON_CHECK)[1]
    except (InputError, UnicodeDecodeError, ValueError):
        return ""


DIGEST_SIZE = 16
_digest_cache: dict[Path, tuple[str, bytes]] = {}
digest_lock = threading.Lock()  # guards the cache only; never held while a file is read


def record_digests(kind: str, path: Path, sig: str) -> bytes:
    """The content digests of every record of one version of a file, 16 bytes each, cached.

    A million records cost 16 MB; only the newest version of each file is kept. The file is
    parsed outside the lock, so one thread's long parse never stalls the worker's others (two
    threads may parse the same new version once each; the result is the same).
    """
    with digest_lock:
        cached = _digest_cache.get(path)
    if cached and cached[0] == sig:
        return cached[1]
    out = bytearray()
    try:
        with open_file(path, follow=False) as f:
            if stat_sig(os.fstat(f.fileno())) != sig:
                return b""  # changed again since it was looked at: its records are not known
            for item in RECORD_READERS[kind](f, path, sig):
                out += hashlib.blake2b(
                    item.content.encode("utf-8"), digest_size=DIGEST_SIZE
                ).digest()
    except InputError:
        pass  # a file that no longer parses: the records past the damage count as changed
    with digest_lock:
        _digest_cache[path] = (sig, bytes(out))
    return bytes(out)
