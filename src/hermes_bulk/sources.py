"""Finding items in a source, and reading one item again to see whether it changed.

| source                         | one item per        | item name             |
|--------------------------------|---------------------|-----------------------|
| directory, searched recursively| UTF-8 text file     | relative path         |
| `.csv` with a header row       | data row            | row:1, row:2, …       |
| `.json` with a top-level array | array element       | record:1, record:2, … |
| `.jsonl`                       | non-blank line      | line:1, line:2, …     |
| any other file                 | the whole file      | the file name         |

Discovery streams: records are parsed one at a time from a binary file, and each item remembers
the byte offset where its record starts, so a worker can re-read just that record to check that
the source has not changed (DESIGN.md invariant 4). Content is never truncated.

Only regular files are read (DESIGN.md invariant 11): every open is non-blocking and checked
with fstat before a byte is read, so a FIFO, device or directory put in a file's place is
refused with a reason instead of hanging or filling memory.
"""

from __future__ import annotations

import codecs
import csv
import errno
import hashlib
import io
import json
import os
import stat as stat_mod
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .errors import InputError, SourceUnusable
from .store.sqlite.database import is_open_sqlite_file

WHOLE_FILE = -1  # offset of an item that is a whole file
DEFAULT_MAX_ITEM_BYTES = 4 * 1024 * 1024  # the max_item_bytes setting's default
_READ_CHUNK = 1 << 16
csv.field_size_limit(2**31 - 1)  # a CSV cell may be as large as an item may be


@dataclass(frozen=True, slots=True)
class SourceItem:
    """One item found at create time, with what is needed to find it again."""

    name: str
    content: str
    origin: str  # path relative to a directory source; "" when the source is one file
    offset: int  # byte offset of the record in its file; WHOLE_FILE for whole files
    stat_sig: str  # "size:mtime_ns" of the file when the item was read


@dataclass(frozen=True, slots=True)
class Skipped:
    """An entry left out of a directory source, with the reason (recorded as a job event)."""

    name: str
    reason: str


def content_hash(text: str) -> str:
    """The content-address of an item: `b2:` + BLAKE2b-128 of its UTF-8 bytes, in hex."""
    return "b2:" + hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def stat_sig(st: os.stat_result) -> str:
    return f"{st.st_size}:{st.st_mtime_ns}"


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
            raise InputError(f"--over {path}: symbolic link loop; point --over at the real path.") from None
        except OSError as exc:
            raise InputError(f"--over {path}: cannot read it ({_reason(exc)}).") from None
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
        with _open_file(self.path, follow=False) as f:  # self.path is resolved: no link is left
            sig = stat_sig(os.fstat(f.fileno()))
            if self.kind == "file":
                yield _whole_file(self.path, f, sig, self.max_item_bytes)
            else:
                yield from _RECORD_READERS[self.kind](f, self.path, sig)


# Directories ----------------------------------------------------------------------------------


def _walk(root: Path, rel: str, max_item_bytes: int) -> Iterator[SourceItem | Skipped]:
    directory = root / rel if rel else root
    try:
        with os.scandir(directory) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as exc:
        yield Skipped(rel + "/", f"unreadable directory ({_reason(exc)})")
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
            yield _directory_file(root / name, name, max_item_bytes)


def _directory_file(path: Path, name: str, max_item_bytes: int) -> SourceItem | Skipped:
    try:
        with _open_file(path, follow=False) as f:
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
    text = _decode_text(data)
    if text is None:
        return Skipped(name, "not UTF-8 text")
    return SourceItem(name, text, name, WHOLE_FILE, stat_sig(st))


def _whole_file(path: Path, f: BinaryIO, sig: str, max_item_bytes: int) -> SourceItem:
    size = int(sig.split(":")[0])
    if size == 0:
        raise InputError(f"{path}: the file is empty; there is nothing to process.")
    if size > max_item_bytes:
        raise InputError(f"{path}: {size} bytes is more than max_item_bytes ({max_item_bytes}); "
                         "split it, or raise HERMES_BULK_MAX_ITEM_BYTES.")
    data = f.read(max_item_bytes + 1)  # bounded: the file may grow after fstat
    if len(data) > max_item_bytes:
        raise InputError(f"{path}: it grew past max_item_bytes ({max_item_bytes}) while being read; "
                         "try again once it is written.")
    if is_binary(data):
        raise InputError(_binary_message(path))
    text = _decode_text(data)
    if text is None:
        raise InputError(f"{path}: not UTF-8 text; convert it (for example with iconv -t UTF-8).")
    return SourceItem(path.name, text, "", WHOLE_FILE, sig)


# Records --------------------------------------------------------------------------------------


class _Lines:
    """Iterates decoded lines of a binary file, tracking the byte offset and line number."""

    def __init__(self, f: BinaryIO, path: Path) -> None:
        self.f, self.path = f, path
        self.pos = f.tell()
        self.line_no = 0

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        raw = self.f.readline()
        if not raw:
            raise StopIteration
        self.pos += len(raw)
        self.line_no += 1
        try:
            return raw.decode("utf-8-sig" if self.line_no == 1 else "utf-8")
        except UnicodeDecodeError:
            if is_binary(raw) or is_binary(_file_start(self.f)):  # a PNG's first "line" has no NUL yet
                raise InputError(_binary_message(self.path)) from None
            raise InputError(f"{self.path}: line {self.line_no} is not UTF-8 text; convert the "
                             "file to UTF-8 (for example with iconv -t UTF-8).") from None


def _csv_rows(f: BinaryIO, path: Path) -> Iterator[tuple[int, list[str], _Lines]]:
    """(start offset, fields, line tracker) per record, blank lines skipped."""
    lines = _Lines(f, path)
    reader = csv.reader(lines, strict=True)
    while True:
        start, start_line = lines.pos, lines.line_no + 1
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            if str(exc) == _CSV_EOF_IN_QUOTES:  # found at the end of the file; the user needs where it opened
                line = _open_quote_line(f, start, start_line)
                raise InputError(f"{path}: malformed CSV at line {line}: a quoted field opened on that line "
                                 'is never closed; close it (a quote inside a quoted field is written "").') from None
            raise InputError(f"{path}: malformed CSV at line {lines.line_no}: {exc}.") from None
        if fields:
            yield start, fields, lines


_CSV_EOF_IN_QUOTES = "unexpected end of data"  # the csv module's error for a quote still open at the end


def _open_quote_line(f: BinaryIO, start: int, start_line: int) -> int:
    """The line where the quote left open at the end of the file opened, in the record at start.

    Every quote character toggles quoting (an escaped "" toggles twice), so the parity of each
    line's quotes is enough; the rest of the file is read once more, only on this error.
    """
    f.seek(start)
    quoted, opened = False, start_line
    for line_no, raw in enumerate(f, start_line):
        if raw.count(b'"') % 2:
            quoted = not quoted
            if quoted:
                opened = line_no
    return opened


def _csv_header(names: list[str]) -> list[str]:
    """Column names made unique and non-empty, so every value keeps a name."""
    seen: dict[str, int] = {}
    header = []
    for i, name in enumerate(names, 1):
        name = name.strip() or f"column_{i}"
        if name in seen:
            seen[name] += 1
            name = f"{name}_{seen[name]}"
        seen.setdefault(name, 1)
        header.append(name)
    return header


def render_csv_row(header: list[str], fields: list[str]) -> str:
    """A row as a JSON object, so the model sees each value with its column name."""
    values = fields + [""] * (len(header) - len(fields))
    return json.dumps(dict(zip(header, values, strict=True)), ensure_ascii=False)


def _read_csv(f: BinaryIO, path: Path, sig: str) -> Iterator[SourceItem]:
    rows = _csv_rows(f, path)
    first = next(rows, None)
    if first is None:
        raise InputError(f"{path}: the CSV file is empty; it needs a header row and data rows.")
    header = _csv_header(first[1])
    n = 0
    for start, fields, lines in rows:
        if len(fields) > len(header) and any(v.strip() for v in fields[len(header):]):
            raise InputError(f"{path}: malformed CSV at line {lines.line_no}: the row has "
                             f"{len(fields)} fields but the header has {len(header)}.")
        n += 1
        yield SourceItem(f"row:{n}", render_csv_row(header, fields[: len(header)]), "", start, sig)
    if n == 0:
        raise InputError(f"{path}: the CSV file has a header row but no data rows.")


# Records are checked to be JSON, never used as values: numbers stay text, so a number past
# int()'s 4300-digit limit is a record like any other, not a ValueError.
_JSON_CHECK = json.JSONDecoder(parse_int=str)
_TOO_DEEP = "nested too deeply to read"


def _read_jsonl(f: BinaryIO, path: Path, sig: str) -> Iterator[SourceItem]:
    lines = _Lines(f, path)
    n = 0
    while True:
        start = lines.pos
        line = next(lines, None)
        if line is None:
            break
        text = line.strip()
        if not text:
            continue
        try:
            _JSON_CHECK.decode(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}: line {lines.line_no} is not valid JSON "
                             f"({exc.msg.removesuffix(' at')} at column {exc.colno}).") from None
        except RecursionError:
            raise InputError(f"{path}: line {lines.line_no} is {_TOO_DEEP}.") from None
        n += 1
        yield SourceItem(f"line:{n}", text, "", start, sig)
    if n == 0:
        raise InputError(f"{path}: the JSONL file has no records.")


class _JsonArrayReader:
    """Streams the elements of a top-level JSON array with their byte offsets.

    json has no streaming parser, so elements are cut out of a growing text buffer with
    `raw_decode`; the buffer holds one element (plus a chunk) at a time.
    """

    def __init__(self, f: BinaryIO, path: Path) -> None:
        self.f, self.path = f, path
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.buf = ""
        self.i = 0  # position in buf
        self.byte_base = f.tell()  # bytes before buf[0]
        self.line_base = 1  # line number of buf[0]
        self.eof = False
        if self.byte_base == 0 and f.read(3) != codecs.BOM_UTF8:
            f.seek(0)
        self.byte_base = f.tell()

    def _fill(self) -> bool:
        """Append the next chunk to the buffer; False at the end of the file."""
        if self.eof:
            return False
        chunk = self.f.read(_READ_CHUNK)
        try:
            self.buf += self.decoder.decode(chunk, final=not chunk)
        except UnicodeDecodeError:
            if is_binary(chunk):
                raise InputError(_binary_message(self.path)) from None
            raise InputError(f"{self.path}: not UTF-8 text near line {self._line(len(self.buf))}; "
                             "convert it (for example with iconv -t UTF-8).") from None
        self.eof = not chunk
        return not self.eof

    def _compact(self) -> None:
        consumed = self.buf[: self.i]
        self.byte_base += len(consumed.encode("utf-8"))
        self.line_base += consumed.count("\n")
        self.buf, self.i = self.buf[self.i:], 0

    def _line(self, pos: int) -> int:
        return self.line_base + self.buf.count("\n", 0, pos)

    def _skip_ws(self) -> str:
        while True:
            while self.i < len(self.buf) and self.buf[self.i] in " \t\r\n":
                self.i += 1
            if self.i < len(self.buf):
                return self.buf[self.i]
            self._compact()
            if not self._fill() and not self.buf:
                return ""

    def _error(self, what: str) -> InputError:
        return InputError(f"{self.path}: malformed JSON at line {self._line(self.i)}: {what}.")

    def elements(self) -> Iterator[tuple[int, str]]:
        decoder = _JSON_CHECK
        if self._skip_ws() != "[":
            raise InputError(f"{self.path}: the top-level JSON value is not an array; Bulk makes one "
                             "item per array element (use .jsonl for one record per line).")
        self.i += 1
        first = True
        while True:
            ch = self._skip_ws()
            if ch == "]":
                self.i += 1
                if self._skip_ws():
                    raise self._error("unexpected data after the closing ]")
                return
            if not first:
                if ch != ",":
                    raise self._error("expected , or ] between elements")
                self.i += 1
                self._skip_ws()
            first = False
            yield self._element(decoder)

    def _element(self, decoder: json.JSONDecoder) -> tuple[int, str]:
        self._compact()
        while True:
            try:
                _, end = decoder.raw_decode(self.buf, 0)
                # A number at the end of the buffer may continue in the next chunk.
                if end < len(self.buf) or self.eof:
                    start_byte = self.byte_base
                    self.i = end
                    return start_byte, self.buf[:end]
            except json.JSONDecodeError as exc:
                if self.eof:  # the buffer starts at the element: its lines count from line_base
                    raise InputError(f"{self.path}: malformed JSON at line {self.line_base + exc.lineno - 1}: "
                                     f"{_json_problem(exc)}.") from None
            except RecursionError:
                raise self._error(f"an element is {_TOO_DEEP}") from None
            self._fill()


def _read_json(f: BinaryIO, path: Path, sig: str) -> Iterator[SourceItem]:
    n = 0
    for start, text in _JsonArrayReader(f, path).elements():
        n += 1
        yield SourceItem(f"record:{n}", text, "", start, sig)
    if n == 0:
        raise InputError(f"{path}: the JSON array is empty.")


_RECORD_READERS = {"csv": _read_csv, "jsonl": _read_jsonl, "json": _read_json}


# Reading an item again ------------------------------------------------------------------------


def source_changed(kind: str, source: str, origin: str, offset: int, number: int, recorded_sig: str,
                   expected_hash: str, *, max_item_bytes: int = DEFAULT_MAX_ITEM_BYTES) -> bool:
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
    path = Path(source) / origin if kind == "directory" else Path(source)
    try:
        with _open_file(path, follow=False) as f:
            st = os.fstat(f.fileno())
            sig = stat_sig(st)
            if sig == recorded_sig:
                return False
            if offset == WHOLE_FILE:
                if st.st_size > max_item_bytes:
                    return True
                return content_hash(_decode_text(f.read(max_item_bytes + 1)) or "") != expected_hash
            if content_hash(_record_at(kind, f, path, offset, max_item_bytes)) == expected_hash:
                return False
    except NotRegularFile as exc:
        raise SourceUnusable(f"the source {path} is {exc.reason}; only regular files are read") from None
    except InputError:
        return False
    digests = _record_digests(kind, path, sig)
    return number >= len(digests) // _DIGEST_SIZE or \
        digests[number * _DIGEST_SIZE:(number + 1) * _DIGEST_SIZE] != bytes.fromhex(expected_hash[3:])


def _window(f: BinaryIO, offset: int, size: int) -> BinaryIO:
    """At most size bytes of f from offset, in memory: one record's re-read stays bounded."""
    f.seek(offset)
    return io.BytesIO(f.read(size))


def _record_at(kind: str, f: BinaryIO, path: Path, offset: int, max_item_bytes: int) -> str:
    """The record that starts at a byte offset ("" when none parses in max_item_bytes there)."""
    try:
        if kind == "csv":
            header_row = next(_csv_rows(_window(f, 0, max_item_bytes), path), None)
            row = next(_csv_rows(_window(f, offset, max_item_bytes), path), None)
            if header_row is None or row is None:
                return ""
            header = _csv_header(header_row[1])
            return render_csv_row(header, row[1][: len(header)])
        window = _window(f, offset, max_item_bytes)
        if kind == "jsonl":
            return window.readline().decode("utf-8").strip()
        return _JsonArrayReader(window, path)._element(_JSON_CHECK)[1]
    except (InputError, UnicodeDecodeError, ValueError):
        return ""


_DIGEST_SIZE = 16
_digest_cache: dict[Path, tuple[str, bytes]] = {}
_digest_lock = threading.Lock()  # guards the cache only; never held while a file is read


def _record_digests(kind: str, path: Path, sig: str) -> bytes:
    """The content digests of every record of one version of a file, 16 bytes each, cached.

    A million records cost 16 MB; only the newest version of each file is kept. The file is
    parsed outside the lock, so one thread's long parse never stalls the worker's others (two
    threads may parse the same new version once each; the result is the same).
    """
    with _digest_lock:
        cached = _digest_cache.get(path)
    if cached and cached[0] == sig:
        return cached[1]
    out = bytearray()
    try:
        with _open_file(path, follow=False) as f:
            if stat_sig(os.fstat(f.fileno())) != sig:
                return b""  # changed again since it was looked at: its records are not known
            for item in _RECORD_READERS[kind](f, path, sig):
                out += hashlib.blake2b(item.content.encode("utf-8"), digest_size=_DIGEST_SIZE).digest()
    except InputError:
        pass  # a file that no longer parses: the records past the damage count as changed
    with _digest_lock:
        _digest_cache[path] = (sig, bytes(out))
    return bytes(out)


# Helpers --------------------------------------------------------------------------------------


class NotRegularFile(InputError):
    """Something other than a regular file is at a path to read; `reason` says what."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}; only regular files are read.")
        self.reason = reason


_KINDS = ((stat_mod.S_ISDIR, "a directory"), (stat_mod.S_ISFIFO, "a FIFO (named pipe)"),
          (stat_mod.S_ISCHR, "a character device"), (stat_mod.S_ISBLK, "a block device"),
          (stat_mod.S_ISSOCK, "a socket"))
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def _open_file(path: Path, *, follow: bool = True) -> BinaryIO:
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
        raise InputError(f"{path}: cannot read it ({_reason(exc)}).") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat_mod.S_ISREG(mode):
            raise NotRegularFile(path, next((name for test, name in _KINDS if test(mode)), "not a regular file"))
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular_file(path: Path, limit: int) -> bytes | None:
    """The bytes of a regular file (links followed), or None when it is larger than limit.

    NotRegularFile for a FIFO, device or directory; InputError when it cannot be opened.
    """
    with _open_file(path) as f:
        data = f.read(limit + 1)
    return None if len(data) > limit else data


_TEXT_BOMS = (codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE, codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)


def is_binary(data: bytes) -> bool:
    """NUL bytes outside UTF-16/32 text (which starts with its byte order mark): an image, an
    archive, a program. Such a file needs another file, not a conversion (git decides the same way)."""
    return b"\x00" in data and not data.startswith(_TEXT_BOMS)


def _file_start(f: BinaryIO, size: int = 8192) -> bytes:
    """The first bytes of a file, read without moving its position (b"" for an in-memory window)."""
    try:
        return os.pread(f.fileno(), size, 0)
    except (OSError, io.UnsupportedOperation):
        return b""


def _binary_message(path: Path) -> str:
    return (f"{path}: a binary file (it contains NUL bytes), not UTF-8 text; give a text file, "
            "or a folder of text files.")


def _json_problem(exc: json.JSONDecodeError) -> str:
    """json's message without its dangling "at" ("Unterminated string starting at"), for a
    caller that gives the line only."""
    return exc.msg.removesuffix(" at").removesuffix(" starting")


def _decode_text(data: bytes) -> str | None:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None


def _reason(exc: OSError) -> str:
    return (exc.strerror or type(exc).__name__).lower()
