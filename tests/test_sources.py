"""Discovery of items from every kind of source, and reading one item again."""

from __future__ import annotations

import json
import os
import tracemalloc

import pytest

from hermes_bulk.errors import InputError
from hermes_bulk.sources import Skipped, Source, SourceItem, content_hash, source_changed

MAX = 1024 * 1024


def entries(path, max_item_bytes=MAX):
    return list(Source(path, max_item_bytes=max_item_bytes).entries())


def items(path, **kw):
    return [e for e in entries(path, **kw) if isinstance(e, SourceItem)]


def test_a_directory_is_searched_recursively_and_leaves_out_what_the_seed_says(tmp_path):
    root = tmp_path / "src"
    (root / "2026").mkdir(parents=True)
    (root / "2026" / "q1.txt").write_text("first quarter", encoding="utf-8")
    (root / "a.md").write_text("alpha ü", encoding="utf-8")
    (root / ".hidden").write_text("secret")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("x")
    (root / "empty.txt").write_text("")
    (root / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (root / "nul.bin").write_bytes(b"abc\x00def")
    (root / "big.txt").write_text("x" * 2000)
    (root / "link.txt").symlink_to(root / "a.md")
    (root / "loop").symlink_to(root / "loop")  # a symlink loop is left out, not followed
    (root / "dirlink").symlink_to(root / "2026", target_is_directory=True)
    os.mkfifo(root / "fifo")

    found = entries(root, max_item_bytes=1000)
    got = {e.name: e for e in found}
    assert [e.name for e in found if isinstance(e, SourceItem)] == ["2026/q1.txt", "a.md"]
    assert got["2026/q1.txt"].content == "first quarter"
    assert got["a.md"].content == "alpha ü"
    reasons = {e.name: e.reason for e in found if isinstance(e, Skipped)}
    assert reasons == {
        ".git": "hidden entry",
        ".hidden": "hidden entry",
        "empty.txt": "empty file",
        "latin1.txt": "not UTF-8 text",
        "nul.bin": "binary file (contains NUL bytes)",
        "big.txt": "larger than max_item_bytes (1000 bytes)",
        "link.txt": "symbolic link",
        "loop": "symbolic link",
        "dirlink": "symbolic link",
        "fifo": "not a regular file",
    }


def test_content_is_never_truncated(tmp_path):
    text = "line\n" * 200_000
    (tmp_path / "long.txt").write_text(text)
    (one,) = items(tmp_path / "long.txt")
    assert one.content == text and one.name == "long.txt"


def test_csv_rows_keep_their_column_names_quoted_newlines_and_commas(tmp_path):
    path = tmp_path / "people.csv"
    path.write_bytes(
        "\ufeffname,comment,,name\r\n"
        '"Smith, Jane","line one\nline two",x,dup\r\n'
        "\r\n"
        'Bob,"said ""hi""",,\r\n'
        "Short\r\n".encode("utf-8")
    )
    rows = items(path)
    assert [r.name for r in rows] == ["row:1", "row:2", "row:3"]
    assert json.loads(rows[0].content) == {
        "name": "Smith, Jane",
        "comment": "line one\nline two",
        "column_3": "x",
        "name_2": "dup",
    }
    assert json.loads(rows[1].content)["comment"] == 'said "hi"'
    assert json.loads(rows[2].content) == {
        "name": "Short",
        "comment": "",
        "column_3": "",
        "name_2": "",
    }


@pytest.mark.parametrize(
    "body, where",
    [
        ('a,b\n1,2\n"unterminated,3\n', "line 3"),
        ("a,b\n1,2\n1,2,3\n", "line 3"),
        ('a,b\n1,"x"y\n', "line 2"),
    ],
)
def test_malformed_csv_names_the_line(tmp_path, body, where):
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(InputError, match=f"malformed CSV at {where}"):
        entries(path)


def test_non_utf8_csv_names_the_line(tmp_path):
    path = tmp_path / "latin.csv"
    path.write_bytes(b"a,b\n1,2\ncaf\xe9,3\n")
    with pytest.raises(InputError, match="line 3 is not UTF-8"):
        entries(path)


def test_json_array_elements_become_records(tmp_path):
    path = tmp_path / "r.json"
    data = [{"id": 1, "text": "a ] tricky, [string"}, 12345678901234567890, "plain", [1, [2]], None]
    path.write_text(json.dumps(data, indent=2))
    recs = items(path)
    assert [r.name for r in recs] == [f"record:{i}" for i in range(1, 6)]
    assert [json.loads(r.content) for r in recs] == data


def test_json_records_stream_across_chunk_boundaries(tmp_path):
    path = tmp_path / "many.json"
    data = [{"n": i, "pad": "é" * (i % 50)} for i in range(20_000)] + [123456789]
    path.write_text(json.dumps(data))
    recs = items(path)
    assert len(recs) == len(data)
    assert json.loads(recs[-1].content) == 123456789  # a number at the very end is read whole
    assert json.loads(recs[9_999].content) == data[9_999]


@pytest.mark.parametrize(
    "body, message",
    [
        ('{"a": 1}', "not an array"),
        ('[1, 2,\n {"a": }]', "malformed JSON at line 2"),
        ("[1, 2", "malformed JSON"),
        ("[1 2]", "expected , or ]"),
        ("[1] [2]", "unexpected data after"),
        ("[]", "empty"),
    ],
)
def test_malformed_json_is_a_clear_error(tmp_path, body, message):
    path = tmp_path / "bad.json"
    path.write_text(body)
    with pytest.raises(InputError, match=message):
        entries(path)


def test_jsonl_skips_blank_lines_and_names_malformed_ones(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"a": 1}\n\n   \n{"a": 2}\n')
    recs = items(path)
    assert [(r.name, json.loads(r.content)) for r in recs] == [
        ("line:1", {"a": 1}),
        ("line:2", {"a": 2}),
    ]
    path.write_text('{"a": 1}\n{"a": \n')
    with pytest.raises(InputError, match="line 2 is not valid JSON"):
        entries(path)


def test_any_other_file_is_one_item(tmp_path):
    path = tmp_path / "notes.TXT"
    path.write_text("hello")
    assert [(i.name, i.content) for i in items(path)] == [("notes.TXT", "hello")]


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda p: None, "no such file or directory"),
        (lambda p: p.write_text(""), "the file is empty"),
        (lambda p: p.write_bytes(b"\xff\xfe\x00"), "not UTF-8 text"),
        (lambda p: p.write_text("x" * 50), "more than max_item_bytes"),
        (lambda p: p.symlink_to(p), "symbolic link loop"),
    ],
)
def test_bad_single_sources_are_clear_errors(tmp_path, setup, message):
    path = tmp_path / "input.txt"
    setup(path)
    with pytest.raises(InputError, match=message):
        entries(path, max_item_bytes=10)


def test_a_million_row_csv_is_not_held_in_memory(tmp_path):
    path = tmp_path / "big.csv"
    with open(path, "w") as f:
        f.write("id,name,score\n")
        for i in range(200_000):
            f.write(f"{i},name {i},{i % 97}\n")
    tracemalloc.start()
    count = sum(1 for _ in Source(path, max_item_bytes=MAX).entries())
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert count == 200_000
    assert peak < 5 * 1024 * 1024, f"peak {peak} bytes: discovery must stream"


# Reading an item again -------------------------------------------------------------------------


def _changed(source: Source, item: SourceItem, number: int) -> bool:
    return source_changed(
        source.kind,
        str(source.path),
        item.origin,
        item.offset,
        number,
        item.stat_sig,
        content_hash(item.content),
    )


@pytest.mark.parametrize(
    "name, body",
    [
        ("t.csv", "a,b\n1,x\n2,y\n3,z\n"),
        ("t.jsonl", '{"v": 1}\n{"v": 2}\n{"v": 3}\n'),
        ("t.json", '[{"v": 1}, {"v": 2}, {"v": 3}]'),
    ],
)
def test_only_the_edited_record_counts_as_changed(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(body)
    source = Source(path, max_item_bytes=MAX)
    recs = items(path)
    assert [_changed(source, r, n) for n, r in enumerate(recs)] == [False, False, False]
    # The first record grows, so every later record moves: only the first has changed.
    path.write_text(body.replace("1", "1111", 1))
    os.utime(path, ns=(1, 1))
    assert [_changed(source, r, n) for n, r in enumerate(recs)] == [True, False, False]
    # The last record goes away.
    path.write_text(
        body.replace("1", "1111", 1)
        .replace("3", "")
        .replace(', {"v": }', "")
        .replace('{"v": }\n', "")
    )
    os.utime(path, ns=(2, 2))
    assert _changed(source, recs[2], 2) is True


def test_a_directory_file_changes_and_an_unreadable_one_does_not(tmp_path):
    (tmp_path / "a.txt").write_text("one")
    source = Source(tmp_path, max_item_bytes=MAX)
    (item,) = items(tmp_path)
    os.utime(tmp_path / "a.txt", ns=(5, 5))
    assert _changed(source, item, 0) is False, "a new mtime with the same content is no change"
    (tmp_path / "a.txt").write_text("two!")
    assert _changed(source, item, 0) is True
    (tmp_path / "a.txt").unlink()
    assert _changed(source, item, 0) is False, "an unreadable source is not a change"
