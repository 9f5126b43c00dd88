"""The small files a flag names (`--schema`, `--instruction-file`, `--system`), read with one-line
errors.

Read as sources are (regular files only, bounded), and never one of this process's open SQLite
files (invariant 10).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import InputError, UsageError
from ..store.sqlite.database import is_open_sqlite_file

#: The largest --schema file read (a schema is a few kilobytes; /dev/zero is endless).
MAX_SCHEMA_BYTES = 1024 * 1024


def _read_flag_file(
    path: Path, flag: str, kind: str, error: type[InputError | UsageError]
) -> bytes:
    """The bytes of a small file a flag names (a --schema, an --instruction-file); one line if
    not."""
    from ..sources import NotRegularFile, read_regular_file

    if is_open_sqlite_file(path.expanduser()):  # reading it would drop this process's SQLite locks
        raise error(f"{flag} {path}: a hermes-bulk database in use, not {kind}.")
    try:
        data = read_regular_file(path.expanduser(), MAX_SCHEMA_BYTES)
    except NotRegularFile as exc:
        raise error(f"{flag} {path}: it is {exc.reason}; give {kind}.") from None
    except InputError as exc:  # "<path>: cannot read it (<reason>)."
        raise error(f"{flag} {exc}") from None
    if data is None:
        raise error(
            f"{flag} {path}: larger than {MAX_SCHEMA_BYTES:,} bytes; give {kind} of a few "
            "kilobytes."
        )
    return data


def read_schema(path: Path) -> str:
    """A --schema file as compact JSON text: a JSON schema of an object with "properties"."""
    data = _read_flag_file(path, "--schema", "a JSON file", InputError)
    try:
        schema = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"--schema {path}: not a JSON file ({exc}).") from None
    except RecursionError:
        raise InputError(f"--schema {path}: nested too deeply to be a schema.") from None
    if (
        not isinstance(schema, dict)
        or schema.get("type", "object") != "object"
        or not isinstance(schema.get("properties"), dict)
    ):
        raise InputError(f'--schema {path}: give a JSON schema of an object with "properties".')
    from ..providers.answers import schema_problem

    if problem := schema_problem(schema):
        raise InputError(f"--schema {path}: {problem}.")
    return json.dumps(schema)


def read_instruction(path: Path) -> str:
    """An --instruction-file as text: a regular, non-empty UTF-8 file of at most MAX_SCHEMA_BYTES.
    Its errors are usage errors (exit 2), as a bad flag's are; --schema's predate that (exit 1)."""
    return _read_text(path, "--instruction-file", "the instruction")


def read_system(path: Path) -> str:
    """A --system file as text, read as an --instruction-file is."""
    return _read_text(path, "--system", "the system prompt")


def _read_text(path: Path, flag: str, what: str) -> str:
    data = _read_flag_file(path, flag, "a text file", UsageError)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(
            f"{flag} {path}: not UTF-8 text; convert it, e.g. iconv -t UTF-8."
        ) from None
    if not text.strip():
        raise UsageError(f"{flag} {path}: the file is empty; write {what} in it.")
    return text.strip()
