"""Whatever bytes a CSV, JSON or JSONL source holds, `create` gets items or one clear error.

Hypothesis writes arbitrary bytes, and text made of the pieces that break parsers (unterminated
quotes, NULs, BOMs, mixed newlines, invalid UTF-8, huge numbers, deep nesting), to a file and
reads it the way `create` does (Source(...).entries()). The only exception allowed is
InputError, with a one-line message that names the file.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hermes_bulk.errors import InputError
from hermes_bulk.sources import Source, SourceItem

MAX_ITEM_BYTES = 1 << 20

PIECES = [
    b"[",
    b"]",
    b"{",
    b"}",
    b'"',
    b",",
    b":",
    b" ",
    b"\t",
    b"\\",
    b'\\"',
    b"\\u12",
    b"\\ud800",
    b"a",
    b"\xc3\xa9",
    b"1",
    b"-",
    b"1e999",
    b"1" * 5000,
    b"NaN",
    b"-Infinity",
    b"null",
    b"true",
    b"\n",
    b"\r",
    b"\r\n",
    b"\x00",
    b"\xef\xbb\xbf",
    b"\xff\xfe",
    b"\xff",
    b"\xc3",
    b"\xed\xa0\x80",
    b'"a,b"',
    b'""',
    b"x,y\n",
    b'{"k": [1, 2]}',
    b"[" * 3000,
    b"]" * 3000,
    b'{"a":' * 2000,
]
structured = st.lists(st.sampled_from(PIECES), max_size=40).map(b"".join)
contents = st.one_of(st.binary(max_size=400), structured)


def read(path) -> list[SourceItem]:
    """What create gets from the source: its items, or InputError."""
    return [
        e
        for e in Source(path, max_item_bytes=MAX_ITEM_BYTES).entries()
        if isinstance(e, SourceItem)
    ]


FUZZ = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.mark.parametrize("suffix", [".csv", ".json", ".jsonl"])
@FUZZ
@given(data=contents)
@example(data=b"[" * 100_000)  # deeper than Python's recursion limit
@example(data=b"[" * 100_000 + b"]" * 100_000)
@example(data=b"1" * 5000)  # past int's 4300-digit conversion limit
@example(data=b"[" + b"1" * 5000 + b"]")
@example(data=b"a\n" + b"1" * 5000 + b"\n")
@example(data=b'a\n"unterminated\n')
@example(data=b"\xef\xbb\xbf\xef\xbb\xbf[1]")
def test_any_bytes_give_items_or_one_clear_error(tmp_path, suffix, data):
    path = tmp_path / f"source{suffix}"
    path.write_bytes(data)
    try:
        got = read(path)
    except InputError as exc:
        message = str(exc)
        assert message.startswith(str(path)) and "\n" not in message and len(message) < 400, message
        return
    assert got, "no items without an error"
    for item in got:
        assert isinstance(item.content, str) and item.content
        item.content.encode("utf-8")  # storable: no lone surrogates
