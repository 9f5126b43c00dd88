"""What of a CSV row or a JSON record is sent: `create --template TEXT` builds each item from
named fields, `create --fields a,b` sends only those fields. Without either, the whole row (as a
JSON object) or the whole record goes.

The store keeps every item's content as read (so `export --with-input` gives the row back as
itself); the template is applied when a request is made (jobs/prompt.py item_text), and the answer
key is made from what is sent, so two rows that send the same text are one question.

Template syntax: `{name}` is the field's value, `{{` and `}}` are braces, `\\n`, `\\t` and `\\\\`
are a newline, a tab and a backslash (so `--template "Title: {title}\\n{body}"` works in any
shell). A name is everything between the braces, spaces trimmed, so a column named `first name`
is `{first name}`. A text value goes in as itself; any other JSON value (a number, true, null, an
array, an object) as its JSON text.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import string
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import InputError, UsageError

#: The longest template and the most fields: a template is the shared part of a request, not data.
MAX_TEMPLATE_CHARS = 20_000
MAX_FIELDS = 200
#: Kinds of source whose items have named fields.
FIELDED_SOURCES = frozenset({"csv", "json", "jsonl"})

#: What string.Formatter reads as a format spec, a conversion or an index; a name's own here.
_NAME_MARKS = ":!["
_ESCAPE = re.compile(r"\\([nt\\])")
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


class _Number(str):
    """A JSON number as it was written (1.10 stays 1.10; 10**5000 stays itself)."""


def _dumps(value: Any) -> str:
    """JSON text of a parsed record value, numbers as written."""
    if isinstance(value, _Number):
        return str(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_dumps(k)}: {_dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_dumps(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def _record(content: str) -> dict[str, Any] | None:
    """The item's named fields (None when the record is not a JSON object)."""
    try:
        value = json.loads(content, parse_int=_Number, parse_float=_Number)
    except (json.JSONDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


@dataclass(frozen=True, slots=True)
class Shape:
    """A job's --template (parts: literal texts and field names, alternating, starting with a
    literal) or --fields (names), compiled once."""

    parts: tuple[str, ...] | None
    fields: tuple[str, ...] | None

    @property
    def names(self) -> tuple[str, ...]:
        """The fields the shape reads, in order, each once."""
        names = self.fields if self.parts is None else self.parts[1::2]
        return tuple(dict.fromkeys(names or ()))

    def missing(self, content: str) -> tuple[str, ...] | None:
        """The fields an item lacks ((): none); None when it has no named fields at all."""
        record = _record(content)
        if record is None:
            return None
        return tuple(name for name in self.names if name not in record)

    def render(self, content: str, limit: int | None = None) -> str:
        """What is sent for an item (create checked that it has every field; an item that lost
        one since, which a source-change check catches first, gets an empty value). With a
        limit (bytes of UTF-8), TooLarge as soon as the text would be longer: a template that
        repeats a large field stops there, never builds the whole text."""
        record = _record(content) or {}
        if self.parts is None:
            chosen = {name: record.get(name, "") for name in self.fields or ()}
            text = _dumps(chosen)
            if limit is not None and _utf8_len(text) > limit:
                raise TooLarge(limit)
            return text
        out, size = [], 0
        for i, part in enumerate(self.parts):
            if i % 2 == 0:
                piece = part
            else:
                value = record.get(part, "")
                piece = value if type(value) is str else _dumps(value)
            if limit is not None:
                size += _utf8_len(piece)
                if size > limit:
                    raise TooLarge(limit)
            out.append(piece)
        return "".join(out)


class TooLarge(ValueError):
    """A rendered item over its limit (bytes)."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def too_large_error(flag: str, item: str, line: int | None, limit: int, setting: str) -> InputError:
    """The create-time error for an item whose rendered text is over max_item_bytes."""
    where = f"{item} (line {line})" if line else item
    return InputError(
        f"{flag}: {where} makes a request text larger than max_item_bytes ({limit:,} bytes); "
        f"name fewer or shorter fields in {flag}, or raise {setting}."
    )


def parse_template(text: str) -> tuple[str, ...]:
    """A --template's parts, or UsageError saying what is wrong with it."""
    if not text.strip():
        raise UsageError("--template is empty; name the fields to send, e.g. '{title}: {body}'.")
    if len(text) > MAX_TEMPLATE_CHARS:
        raise UsageError(
            f"--template is {len(text):,} characters; at most {MAX_TEMPLATE_CHARS:,} "
            "(put long shared text in the instruction or --system)."
        )
    text = _ESCAPE.sub(lambda m: _ESCAPES[m.group(1)], text)
    parts, literal = [], []
    for piece, name in _pieces(text):
        literal.append(piece)
        if name is None:
            continue
        if not (name := name.strip()):
            raise UsageError("--template: {} names no field; write {name}, e.g. {title}.")
        parts += ["".join(literal), name]
        literal = []
    parts.append("".join(literal))
    if len(parts) == 1:
        raise UsageError(
            "--template names no field; write {name} where a field's value goes, e.g. "
            "'Title: {title}'."
        )
    if len(set(parts[1::2])) > MAX_FIELDS:
        raise UsageError(f"--template names more than {MAX_FIELDS} fields.")
    return tuple(parts)


def _pieces(text: str) -> Iterator[tuple[str, str | None]]:
    """(literal text, field name or None) as string.Formatter parses a format string, except
    that a name is everything between its braces: `:`, `!` and `[` are a column's own characters
    (`{Q1: revenue}`), not a format spec, a conversion or an index. A lone brace is a UsageError
    naming it and where it is."""
    hidden = _unused(text, len(_NAME_MARKS))
    mask = str.maketrans(dict(zip(_NAME_MARKS, hidden, strict=True)))
    unmask = str.maketrans(dict(zip(hidden, _NAME_MARKS, strict=True)))
    done = 0  # characters of text parsed so far
    try:
        for literal, name, _, _ in string.Formatter().parse(text.translate(mask)):
            escaped = name is None and literal[-1:] in ("{", "}")  # `{{` or `}}` ended it
            done += len(literal) + (len(name) + 2 if name is not None else int(escaped))
            yield literal.translate(unmask), None if name is None else name.translate(unmask)
    except ValueError:
        at = min(i for i in (text.find("{", done), text.find("}", done)) if i >= 0)
        raise UsageError(
            f"--template: a lone {text[at]!r} at character {at + 1}; write {{{{ or }}}} "
            "for a brace, {name} for a field."
        ) from None


def _unused(text: str, n: int) -> list[str]:
    """n characters of Unicode's private use areas that text does not hold (a template is far
    shorter than those areas are long)."""
    used = set(text)
    areas = itertools.chain(range(0xE000, 0xF900), range(0xF0000, 0xFFFFE))
    return list(itertools.islice((chr(c) for c in areas if chr(c) not in used), n))


def parse_fields(text: str) -> tuple[str, ...]:
    """--fields a,b as names, or UsageError."""
    names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    if not names:
        raise UsageError("--fields names no field; give column names, e.g. --fields title,body.")
    if len(names) > MAX_FIELDS:
        raise UsageError(f"--fields names more than {MAX_FIELDS} fields.")
    return names


def checked(
    template: str | None, fields: str | None, source_kind: str
) -> tuple[str | None, tuple[str, ...] | None]:
    """The template (as given) and field names a job records, checked; (None, None) for neither."""
    if template is None and fields is None:
        return None, None
    flag = "--template" if template is not None else "--fields"
    if template is not None and fields is not None:
        raise UsageError(
            "Give --template or --fields, not both: a template sends the fields it names."
        )
    if source_kind not in FIELDED_SOURCES:
        raise UsageError(
            f"{flag} is for CSV, JSON and JSONL sources, whose items have named fields; this "
            f"source is a {source_kind}."
        )
    if template is not None:
        parse_template(template)
        return template, None
    return None, parse_fields(fields or "")


@functools.lru_cache(maxsize=64)
def shape(template: str | None, fields: tuple[str, ...] | None) -> Shape | None:
    """The compiled shape of a job's template or fields (None: the whole item is sent)."""
    if template is None and not fields:
        return None
    return Shape(parse_template(template) if template is not None else None, fields)


def missing_field_error(
    flag: str, item: str, line: int | None, missing: tuple[str, ...] | None, content: str
) -> InputError:
    """The create-time error for an item without a field the template or --fields names."""
    where = f"{item} (line {line})" if line else item
    if missing is None:
        return InputError(
            f"{flag}: {where} is not a JSON object, so it has no named fields; {flag} needs "
            "every record to be an object."
        )
    record = _record(content) or {}
    available = ", ".join(record) or "(none)"
    return InputError(
        f"{flag}: {where} has no field {', '.join(repr(n) for n in missing)}; its fields are: "
        f"{available}."
    )
