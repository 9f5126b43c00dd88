"""Records in one file: CSV rows, JSONL lines, JSON array elements, streamed with byte offsets."""

from __future__ import annotations

import codecs
import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from ..errors import InputError
from .items import SourceItem
from .regular_files import binary_message, file_start, is_binary, open_file

_READ_CHUNK = 1 << 16
csv.field_size_limit(2**31 - 1)  # a CSV cell may be as large as an item may be


def too_large(path: Path, line: int, limit: int) -> InputError:
    return InputError(
        f"{path}: the record at line {line} is larger than max_item_bytes ({limit} bytes); "
        "split it, or raise HERMES_BULK_MAX_ITEM_BYTES."
    )


class _Lines:
    """Iterates decoded lines of a binary file, tracking the byte offset and line number.

    With a limit, no record (from `record_start` on) is read past it: a 50 MB cell stops the
    read at limit + 1 bytes with one line, instead of becoming an item held in memory whole.
    """

    def __init__(self, f: BinaryIO, path: Path, limit: int | None = None) -> None:
        self.f, self.path, self.limit = f, path, limit
        self.pos = f.tell()
        self.line_no = 0
        self.record_start, self.record_line = self.pos, 1

    def __iter__(self) -> _Lines:
        return self

    def start_record(self) -> None:
        self.record_start, self.record_line = self.pos, self.line_no + 1

    def __next__(self) -> str:
        if self.limit is None:
            raw = self.f.readline()
        else:
            raw = self.f.readline(self.limit + 1 - (self.pos - self.record_start))
            if self.pos + len(raw) - self.record_start > self.limit:
                raise too_large(self.path, self.record_line, self.limit)
        if not raw:
            raise StopIteration
        self.pos += len(raw)
        self.line_no += 1
        try:
            return raw.decode("utf-8-sig" if self.line_no == 1 else "utf-8")
        except UnicodeDecodeError:
            if is_binary(raw) or is_binary(
                file_start(self.f)
            ):  # a PNG's first "line" has no NUL yet
                raise InputError(binary_message(self.path)) from None
            raise InputError(
                f"{self.path}: line {self.line_no} is not UTF-8 text; convert the "
                "file to UTF-8 (for example with iconv -t UTF-8)."
            ) from None


def csv_rows(
    f: BinaryIO, path: Path, limit: int | None = None
) -> Iterator[tuple[int, list[str], _Lines]]:
    """(start offset, fields, line tracker) per record, blank lines skipped."""
    lines = _Lines(f, path, limit)
    reader = csv.reader(lines, strict=True)
    while True:
        start, start_line = lines.pos, lines.line_no + 1
        lines.start_record()
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            if (
                str(exc) == _CSV_EOF_IN_QUOTES
            ):  # found at the end of the file; the user needs where it opened
                line = _open_quote_line(f, start, start_line)
                raise InputError(
                    f"{path}: malformed CSV at line {line}: a quoted field opened on that line "
                    'is never closed; close it (a quote inside a quoted field is written "").'
                ) from None
            raise InputError(f"{path}: malformed CSV at line {lines.line_no}: {exc}.") from None
        if fields:
            yield start, fields, lines


_CSV_EOF_IN_QUOTES = (
    "unexpected end of data"  # the csv module's error for a quote still open at the end
)


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


def csv_header(names: list[str]) -> list[str]:
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


def _read_csv(f: BinaryIO, path: Path, sig: str, limit: int | None = None) -> Iterator[SourceItem]:
    rows = csv_rows(f, path, limit)
    first = next(rows, None)
    if first is None:
        raise InputError(f"{path}: the CSV file is empty; it needs a header row and data rows.")
    header = csv_header(first[1])
    n = 0
    for start, fields, lines in rows:
        if len(fields) > len(header) and any(v.strip() for v in fields[len(header) :]):
            raise InputError(
                f"{path}: malformed CSV at line {lines.line_no}: the row has "
                f"{len(fields)} fields but the header has {len(header)}."
            )
        n += 1
        yield SourceItem(f"row:{n}", render_csv_row(header, fields[: len(header)]), "", start, sig)
    if n == 0:
        raise InputError(f"{path}: the CSV file has a header row but no data rows.")


# Records are checked to be JSON, never used as values: numbers stay text, so a number past
# int()'s 4300-digit limit is a record like any other, not a ValueError.
JSON_CHECK = json.JSONDecoder(parse_int=str)
_TOO_DEEP = "nested too deeply to read"


def _read_jsonl(
    f: BinaryIO, path: Path, sig: str, limit: int | None = None
) -> Iterator[SourceItem]:
    lines = _Lines(f, path, limit)
    n = 0
    while True:
        start = lines.pos
        lines.start_record()
        line = next(lines, None)
        if line is None:
            break
        text = line.strip()
        if not text:
            continue
        try:
            JSON_CHECK.decode(text)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"{path}: line {lines.line_no} is not valid JSON "
                f"({exc.msg.removesuffix(' at')} at column {exc.colno})."
            ) from None
        except RecursionError:
            raise InputError(f"{path}: line {lines.line_no} is {_TOO_DEEP}.") from None
        n += 1
        yield SourceItem(f"line:{n}", text, "", start, sig)
    if n == 0:
        raise InputError(f"{path}: the JSONL file has no records.")


class JsonArrayReader:
    """Streams the elements of a top-level JSON array with their byte offsets.

    json has no streaming parser, so elements are cut out of a growing text buffer with
    `raw_decode`; the buffer holds one element (plus a chunk) at a time.
    """

    def __init__(self, f: BinaryIO, path: Path, limit: int | None = None) -> None:
        self.f, self.path, self.limit = f, path, limit
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.buf = ""
        self.buf_bytes = 0  # bytes read into buf (an element larger than limit stops the read)
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
        self.buf_bytes += len(chunk)
        try:
            self.buf += self.decoder.decode(chunk, final=not chunk)
        except UnicodeDecodeError:
            if is_binary(chunk):
                raise InputError(binary_message(self.path)) from None
            raise InputError(
                f"{self.path}: not UTF-8 text near line {self._line(len(self.buf))}; "
                "convert it (for example with iconv -t UTF-8)."
            ) from None
        self.eof = not chunk
        return not self.eof

    def _compact(self) -> None:
        consumed = self.buf[: self.i]
        self.byte_base += len(consumed.encode("utf-8"))
        self.buf_bytes -= len(consumed.encode("utf-8"))
        self.line_base += consumed.count("\n")
        self.buf, self.i = self.buf[self.i :], 0

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
        decoder = JSON_CHECK
        if self._skip_ws() != "[":
            raise InputError(
                f"{self.path}: the top-level JSON value is not an array; Bulk makes one "
                "item per array element (use .jsonl for one record per line)."
            )
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
                    raise InputError(
                        f"{self.path}: malformed JSON at line {self.line_base + exc.lineno - 1}: "
                        f"{_json_problem(exc)}."
                    ) from None
            except RecursionError:
                raise self._error(f"an element is {_TOO_DEEP}") from None
            if self.limit is not None and self.buf_bytes > self.limit + _READ_CHUNK:
                raise too_large(self.path, self.line_base, self.limit)
            self._fill()


def _read_json(f: BinaryIO, path: Path, sig: str, limit: int | None = None) -> Iterator[SourceItem]:
    n = 0
    for start, text in JsonArrayReader(f, path, limit).elements():
        if limit is not None and len(text.encode("utf-8")) > limit:
            raise too_large(path, _line_of(f, path, start), limit)
        n += 1
        yield SourceItem(f"record:{n}", text, "", start, sig)
    if n == 0:
        raise InputError(f"{path}: the JSON array is empty.")


def line_at(path: Path, offset: int) -> int | None:
    """The line of a file a record at byte `offset` starts on (for a message about one record);
    None when the file cannot be read now."""
    try:
        with open_file(path) as f:
            return _line_of(f, path, offset)
    except (OSError, InputError):
        return None


def _line_of(f: BinaryIO, path: Path, offset: int) -> int:
    """The line an element starts on (only for the message of one that is too large)."""
    return 1 + sum(chunk.count(b"\n") for chunk in _chunks(f, offset))


def _chunks(f: BinaryIO, end: int) -> Iterator[bytes]:
    here = f.tell()
    f.seek(0)
    try:
        while f.tell() < end:
            yield f.read(min(_READ_CHUNK, end - f.tell()))
    finally:
        f.seek(here)


RECORD_READERS = {"csv": _read_csv, "jsonl": _read_jsonl, "json": _read_json}


def _json_problem(exc: json.JSONDecodeError) -> str:
    """json's message without its dangling "at" ("Unterminated string starting at"), for a
    caller that gives the line only."""
    return exc.msg.removesuffix(" at").removesuffix(" starting")
