"""Combined exports (Markdown, CSV, JSONL) in input order.

An export only reads the store and writes the one file asked for (DESIGN.md invariant 13); the
per-item outputs/NNNNNN.md are the worker's, written on its own disk as it completes an item
(runtime/pipeline.py). Exports stream items from the store in batches, so a million results export
in flat memory, and are written to a temporary file then renamed over the target: running export
again replaces the file whole. Only a regular file (or a new name in an existing folder) is ever
replaced: a device, FIFO, directory or symbolic link at the target is refused, and so is a missing
folder for an `--output` the user named (DESIGN.md invariant 11). No model calls.

CSV cells that hermes-bulk or the model wrote and that a spreadsheet would run as a formula
(starting with =, +, -, @, tab or carriage return) get a leading apostrophe; a number the model
answered (-10, +3) is left a number. The cells of the user's own CSV that `--with-input` gives
back are theirs, and come back as they were."""

from __future__ import annotations

import csv
import errno
import functools
import json
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from ..errors import InputError, UsageError
from ..files import check_write_target, os_reason, private_dir
from ..redact import public_url
from ..store.protocol import COMPLETED, FAILED, ItemRecord, JobRecord, JobStore
from ..store.records import NANO_PER_USD

FORMATS = ("md", "csv", "jsonl")
#: The answer's column (CSV) and key (JSONL) unless `--column` names it.
RESULT = "result"
#: The names export writes beside the answer, which `--column` may not take.
OUR_CSV_COLUMNS = ("item", "status", "error", "tokens_in", "tokens_out", "cost_usd")
OUR_JSONL_KEYS = (
    "item",
    "index",
    "status",
    "error",
    "tokens_in",
    "tokens_out",
    "cost_usd",
    "provider",
    "model",
    "reused_from",
    "data",
    "input",
    "path",
)
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def neutralise(cell: str) -> str:
    """Keep a spreadsheet from running a cell as a formula (OWASP's CSV-injection advice)."""
    return "'" + cell if cell.startswith(_FORMULA_START) else cell


def neutralise_answer(cell: str) -> str:
    """As neutralise, except that an answer that is a plain number stays one: -10 runs nothing."""
    return cell if _NUMBER.fullmatch(cell) else neutralise(cell)


def describe_error(item: ItemRecord) -> str:
    if item.status == COMPLETED or not item.error_type:
        return ""
    status = f" (HTTP {item.http_status})" if item.http_status else ""
    return f"{item.error_type}{status}: {item.error_message or ''}".rstrip(": ")


def export(
    store: JobStore,
    job: JobRecord,
    fmt: str,
    target: Path,
    *,
    make_folder: bool = False,
    private: bool = True,
    with_input: bool = False,
    only: str | None = None,
    column: str | None = None,
) -> None:
    """Write the export to target, and nothing else.

    make_folder: create target's folder when missing (the job's own folder); a folder the user
    named must exist, so a typo in --output is not silently made into a tree of folders.
    private: owner-only (inside the data directory); else a new file is owner-only too and a
    replaced one keeps its mode.
    """
    writer = _writer(fmt, with_input, column, job)
    check_target(target, folder_must_exist=not make_folder)
    # A CSV given back with its own columns begins as the user's file did, with a BOM or not.
    own_csv = with_input and job.spec.source_kind == "csv"
    bom = not own_csv or job.spec.source_bom
    with replace_atomically(target, private=private, bom=bom) as f:
        writer(f, job, _items(store, job, only, with_input))


def export_to_stream(
    store: JobStore,
    job: JobRecord,
    fmt: str,
    stream: TextIO,
    *,
    with_input: bool = False,
    only: str | None = None,
    column: str | None = None,
) -> None:
    """`--output -`: the export on standard output (no BOM: it is piped, not opened by Excel)."""
    _writer(fmt, with_input, column, job)(stream, job, _items(store, job, only, with_input))
    stream.flush()


#: export --only: the item states an export may be limited to (every item by default).
ONLY = (COMPLETED, FAILED)


def default_name(fmt: str, *, only: str | None = None, with_input: bool = False) -> str:
    """The file an export writes in the job's folder without --output: one per variant of
    which items and what of them it holds (results.csv, results-failed.csv,
    results-with-input.csv, results-failed-with-input.csv), so no variant replaces another."""
    parts = ["results", *([only] if only else []), *(["with-input"] if with_input else [])]
    return f"{'-'.join(parts)}.{fmt}"


def _items(
    store: JobStore, job: JobRecord, only: str | None, with_content: bool
) -> Iterator[ItemRecord]:
    """The job's items in index order, streamed (with their captured content for --with-input);
    with only, those in that state."""
    if only is not None and only not in ONLY:
        raise InputError(f"--only {only}: use one of {', '.join(ONLY)}.")
    items = store.iter_items(job.job_id, with_content=with_content)
    return items if only is None else (item for item in items if item.status == only)


def _writer(
    fmt: str, with_input: bool = False, column: str | None = None, job: JobRecord | None = None
):
    """The writer of a format; column: `--column`, the answer's name (default RESULT)."""
    if fmt not in FORMATS:
        raise InputError(f"--format {fmt}: use one of {', '.join(FORMATS)}.")
    if column is not None:
        check_column(fmt, column, job)
    if with_input:
        if fmt == "md":  # a report, not a table: the inputs have no place of their own in it
            raise UsageError("--with-input needs --format csv or --format jsonl.")
        writer = {"csv": _write_csv_with_input, "jsonl": _write_jsonl_with_input}[fmt]
    else:
        writer = {"md": _write_md, "csv": write_csv, "jsonl": write_jsonl}[fmt]
    return writer if fmt == "md" else functools.partial(writer, column=column or RESULT)


def check_column(fmt: str, column: str, job: JobRecord | None) -> None:
    """`--column NAME`: a CSV column or JSONL key of its own, named in printable text."""
    if fmt == "md":
        raise UsageError("--column names a CSV column or a JSONL key; use --format csv or jsonl.")
    if not column.strip() or not column.isprintable():
        raise UsageError(f"--column {column!r}: give the answer column a name (printable text).")
    taken = OUR_CSV_COLUMNS if fmt == "csv" else OUR_JSONL_KEYS
    fields = schema_fields(job) if job is not None and fmt == "csv" else []
    if column in taken or column in fields:
        raise UsageError(
            f"--column {column}: the export has a {column!r} of its own; choose another."
        )


def check_target(target: Path, *, folder_must_exist: bool) -> None:
    """Refuse an export target that is not a regular file or a new name, before anything is written
    (files.check_write_target; `-` for standard output is the CLI's)."""
    check_write_target(
        target, what="the export", flag="--output", folder_must_exist=folder_must_exist
    )


def _reason(exc: OSError) -> str:
    return os_reason(exc)


def _write_md(f: TextIO, job: JobRecord, items: Iterator[ItemRecord]) -> None:
    spec = job.spec
    f.write(f"# Bulk job {spec.job_id}\n\n")
    f.write(f"- Instruction: {spec.instruction}\n- Source: {spec.source}\n")
    f.write(
        f"- Items: {job.completed} completed, {job.failed} failed, "
        f"{job.total - job.completed - job.failed} unfinished, of {job.total}\n\n"
    )
    for item in items:
        f.write(f"## {item.name}\n\n")
        if item.status == COMPLETED:
            f.write((item.result or "").rstrip("\n") + "\n\n")
        elif item.status == FAILED:
            f.write(f"_Failed: {describe_error(item)}_\n\n")
        else:
            f.write(f"_Not processed yet ({item.status})._\n\n")


def schema_fields(job: JobRecord) -> list[str]:
    """The top-level fields of a --schema job: one export column each."""
    if not job.spec.schema:
        return []
    return list((json.loads(job.spec.schema).get("properties") or {}).keys())


def _fields_of(item: ItemRecord) -> dict:
    if item.status != COMPLETED or not item.result:
        return {}
    try:
        data = json.loads(item.result)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _cell(value) -> str:
    return (
        value
        if isinstance(value, str)
        else ""
        if value is None
        else json.dumps(value, ensure_ascii=False)
    )


def _answer_header(job: JobRecord, column: str = RESULT) -> list[str]:
    return [
        "item",
        "status",
        column,
        "error",
        "tokens_in",
        "tokens_out",
        "cost_usd",
        *schema_fields(job),
    ]


def cost_usd(job: JobRecord, item: ItemRecord) -> str:
    """What the item was billed at the job's price, in USD and exactly (nano-USD as a decimal,
    its kept answer and the attempts not kept); "" when the job has no price."""
    if job.spec.price is None:
        return ""
    whole, frac = divmod(item.cost_nusd, NANO_PER_USD)
    return f"{whole}.{frac:09d}".rstrip("0").rstrip(".")


def _answer_cells(job: JobRecord, item: ItemRecord, fields: list[str]) -> list[str]:
    result = item.result if item.status == COMPLETED and item.result is not None else ""
    data = _fields_of(item) if fields else {}
    return [
        neutralise(item.name),
        item.status,
        neutralise_answer(result),
        neutralise(describe_error(item)),
        str(item.tokens_in),
        str(item.tokens_out),
        cost_usd(job, item),
        *(neutralise_answer(_cell(data.get(name))) for name in fields),
    ]


def write_csv(
    f: TextIO, job: JobRecord, items: Iterator[ItemRecord], *, column: str = RESULT
) -> None:
    fields = schema_fields(job)
    w = csv.writer(f)
    w.writerow(_answer_header(job, column))
    for item in items:
        w.writerow(_answer_cells(job, item, fields))


#: --with-input: the column (CSV) or key (JSONL) holding the input of a job whose source is not a
#: CSV.
INPUT_KEY = {"csv": None, "json": "input", "jsonl": "input", "directory": "path", "file": "path"}


def _input_value(job: JobRecord, item: ItemRecord):
    """A JSON record as its value (or its text, when Python cannot hold it); a file as its path."""
    if INPUT_KEY.get(job.spec.source_kind) == "path":
        return item.name
    try:
        return json.loads(item.content or "null")
    except ValueError:  # a number past int()'s digit limit: the record as stored
        return item.content


def _write_csv_with_input(
    f: TextIO, job: JobRecord, items: Iterator[ItemRecord], *, column: str = RESULT
) -> None:
    """The source's own columns, then the answer's. A CSV row is stored as a JSON object keyed by
    the (de-duplicated) column names in order, each row with every column (sources.py)."""
    fields = schema_fields(job)
    w = csv.writer(f)
    key = INPUT_KEY.get(job.spec.source_kind, "input")
    columns: list[str] | None = None
    for item in items:
        if key is None:
            row = json.loads(item.content or "{}")
            if columns is None:
                columns = list(row)
                w.writerow([*columns, *_answer_header(job, column)])  # the source's own names
            inputs = [_cell(row.get(c)) for c in columns]
        else:
            if columns is None:
                columns = [key]
                w.writerow([key, *_answer_header(job, column)])
            value = _input_value(job, item)
            inputs = [_cell(value)]
        w.writerow([*inputs, *_answer_cells(job, item, fields)])  # the user's cells, as they were


def write_jsonl(
    f: TextIO,
    job: JobRecord,
    items: Iterator[ItemRecord],
    *,
    with_input: bool = False,
    column: str = RESULT,
) -> None:
    structured = bool(job.spec.schema)
    key = INPUT_KEY.get(job.spec.source_kind, "input") or "input"
    for item in items:
        row = {key: _input_value(job, item)} if with_input else {}
        row |= {
            "item": item.name,
            "index": item.index,
            "status": item.status,
            column: item.result if item.status == COMPLETED else None,
            "error": describe_error(item) or None,
            # What the item was billed: its kept answer and its attempts that were not kept.
            "tokens_in": item.tokens_in,
            "tokens_out": item.tokens_out,
            "cost_usd": item.cost_nusd / NANO_PER_USD if job.spec.price is not None else None,
            # Who answered: with Hermes' fallbacks it may not be the configured provider.
            # public_url again: items completed before endpoints were stored masked still hold them.
            "provider": public_url(item.provider) if item.provider else None,
            "model": item.model,
        }
        if item.reused_from is not None:  # answered by an earlier job of this store (reuse)
            row["reused_from"] = {"job_id": item.reused_from[0], "item": item.reused_from[1] + 1}
        if structured:
            row["data"] = _fields_of(item) or None
        f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _write_jsonl_with_input(
    f: TextIO, job: JobRecord, items: Iterator[ItemRecord], *, column: str = RESULT
) -> None:
    """Each line the seed's keys after "input" (the record, a CSV row as its object) or "path"."""
    write_jsonl(f, job, items, with_input=True, column=column)


@contextmanager
def replace_atomically(target: Path, *, private: bool = True, bom: bool = True) -> Iterator[TextIO]:
    """A temp file beside target, renamed over it on success (owner-only; see replaced_mode); a
    .csv target begins with a byte-order mark when bom.

    The target is checked again just before the rename: what appeared there while the export
    was written (a FIFO, a link) is refused, not replaced.
    """
    try:
        private_dir(target.parent)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".export-")
        if not private:
            os.fchmod(fd, replaced_mode(target))
    except OSError as exc:
        raise InputError(
            f"Cannot write {target} ({_reason(exc)}); choose another --output."
        ) from None
    # utf-8-sig: Excel reads a BOM-less CSV as the local code page and garbles non-ASCII text.
    encoding = "utf-8-sig" if bom and target.suffix.lower() == ".csv" else "utf-8"
    try:
        with os.fdopen(fd, "w", encoding=encoding, newline="") as f:
            yield f
        check_target(target, folder_must_exist=True)
        os.replace(tmp, target)
    except OSError as exc:
        os.unlink(tmp)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # the file it would replace is left as it was
            raise InputError(
                f"Cannot write the export to {target}: the disk is full there; free some "
                "space or choose another --output."
            ) from None
        raise
    except BaseException:
        os.unlink(tmp)
        raise


def replaced_mode(target: Path) -> int:
    """The mode of the regular file being replaced (the user chose it), else owner-only: a new
    export holds answers and contents, so it is made as everything else hermes-bulk writes."""
    try:
        st = os.lstat(target)
        if stat.S_ISREG(st.st_mode):
            return stat.S_IMODE(st.st_mode)
    except OSError:
        pass
    return 0o600
