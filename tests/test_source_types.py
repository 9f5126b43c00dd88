"""Only regular files are read as sources, never more than max_item_bytes for one item
(DESIGN.md invariant 11).

A source replaced by a FIFO after `create` once hung its item forever; a symbolic link to
/dev/zero grew a worker to 3 GB in 2 s; a global lock held while a file was parsed stalled the
worker's other threads. Now such an item fails with the reason and the rest of the job goes on.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time
from pathlib import Path

import pytest

from hermes_bulk import sources
from hermes_bulk.errors import SourceUnusable
from hermes_bulk.sources import (
    Skipped,
    Source,
    changes,
    content_hash,
    discovery,
    source_changed,
)
from hermes_bulk.sources import (
    rows as records,
)
from hermes_bulk.testing.fake_provider import expected_answer

from .test_cli_errors import assert_one_line_error

MAX = 4096


def _within(seconds: float, fn, *args, **kwargs):
    """fn's result, or a failure if it does not return in time (a blocked open would hang)."""
    outcome: dict = {}

    def call():
        try:
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{fn.__name__} did not return within {seconds} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _char_device(folder: Path) -> Path | None:
    if os.geteuid() != 0:
        return None
    node = folder / "zero-device"
    os.mknod(node, stat.S_IFCHR | 0o600, os.stat("/dev/zero").st_rdev)
    return node


# Discovery at create ---------------------------------------------------------------------------


def test_discovery_leaves_out_fifos_devices_sockets_and_links_with_a_reason(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "ok.txt").write_text("fine")
    os.mkfifo(docs / "pipe")
    (docs / "dangling").symlink_to(tmp_path / "nowhere")
    (docs / "zero").symlink_to("/dev/zero")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(docs / "sock"))
    device = _char_device(docs)
    entries = _within(10, lambda: list(Source(docs, max_item_bytes=MAX).entries()))
    sock.close()
    found = {e.name: (e.reason if isinstance(e, Skipped) else "item") for e in entries}
    assert found.pop("ok.txt") == "item"
    assert found.pop("dangling") == found.pop("zero") == "symbolic link"
    assert found.pop("pipe") == found.pop("sock") == "not a regular file"
    if device:
        assert found.pop(device.name) == "not a regular file"
    assert found == {}


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda p: os.mkfifo(p), "not a regular file (a FIFO (named pipe))"),
        (lambda p: p.symlink_to("/dev/zero"), "not a regular file (a symbolic link)"),
        (lambda p: p.mkdir(), "not a regular file (a directory)"),
    ],
    ids=["fifo", "link-to-dev-zero", "directory"],
)
def test_a_file_swapped_after_listing_is_left_out_not_waited_on(tmp_path, make, reason):
    """The window between listing a folder and opening a file: the open itself refuses."""
    path = tmp_path / "swapped"
    make(path)
    skipped = _within(5, discovery.directory_file, path, "swapped", MAX)
    assert skipped == Skipped("swapped", reason)


@pytest.mark.parametrize(
    "make",
    [
        lambda p: os.mkfifo(p),
        lambda p: (os.mkfifo(p.with_name("real-pipe")), p.symlink_to(p.with_name("real-pipe"))),
    ],
    ids=["fifo", "link-to-fifo"],
)
def test_over_a_fifo_is_one_line_and_never_waits(cli, tmp_path, make):
    path = tmp_path / "in.jsonl"
    make(path)
    assert_one_line_error(
        cli("create", "Do", "--over", str(path), check=False, timeout=30),
        1,
        "not a regular file or directory",
    )


# The source-change check ------------------------------------------------------------------------


def _item(tmp_path: Path, name: str = "a.txt", text: str = "one"):
    (tmp_path / name).write_text(text)
    source = Source(tmp_path, max_item_bytes=MAX)
    (item,) = [e for e in source.entries() if not isinstance(e, Skipped)]
    return source, item


def _check(source, item, max_item_bytes: int = MAX) -> bool:
    return source_changed(
        source.kind,
        str(source.path),
        item.origin,
        item.offset,
        0,
        item.stat_sig,
        content_hash(item.content),
        max_item_bytes=max_item_bytes,
    )


@pytest.mark.parametrize(
    "swap, what",
    [
        (lambda p: os.mkfifo(p), "a FIFO"),
        (lambda p: p.symlink_to("/dev/zero"), "a symbolic link"),
        (lambda p: p.mkdir(), "a directory"),
    ],
    ids=["fifo", "link-to-dev-zero", "directory"],
)
def test_the_change_check_refuses_what_is_not_a_regular_file(tmp_path, swap, what):
    source, item = _item(tmp_path)
    (tmp_path / "a.txt").unlink()
    swap(tmp_path / "a.txt")
    with pytest.raises(SourceUnusable, match=what):
        _within(5, _check, source, item)


def test_the_change_check_refuses_a_device_behind_a_replaced_folder(tmp_path):
    """O_NOFOLLOW guards the last name only; fstat catches a device reached through a folder
    link."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "zero").write_text("zero")
    source = Source(tmp_path, max_item_bytes=MAX)
    (item,) = [e for e in source.entries() if not isinstance(e, Skipped)]
    assert item.origin == "sub/zero"
    (tmp_path / "sub" / "zero").unlink()
    (tmp_path / "sub").rmdir()
    (tmp_path / "sub").symlink_to("/dev")
    with pytest.raises(SourceUnusable, match="character device"):
        _within(5, _check, source, item)


def test_a_whole_file_grown_past_max_item_bytes_is_changed_without_reading_it(tmp_path):
    source, item = _item(tmp_path)
    (tmp_path / "a.txt").write_text("x" * (MAX + 1))
    assert _check(source, item) is True


def test_a_record_re_read_reads_at_most_max_item_bytes(tmp_path, monkeypatch):
    path = tmp_path / "t.jsonl"
    path.write_text('{"v": 1}\n{"v": 2}\n')
    source = Source(path, max_item_bytes=MAX)
    items = list(source.entries())
    path.write_text('{"v": 1}\n{"v": 2}\n' + "x" * (10 * MAX))  # grown: the offset check runs
    reads: list[int] = []
    real_window = changes.bounded_window
    monkeypatch.setattr(
        changes,
        "bounded_window",
        lambda f, offset, size: (reads.append(size), real_window(f, offset, size))[1],
    )
    assert (
        source_changed(
            "jsonl",
            str(path),
            "",
            items[1].offset,
            1,
            items[1].stat_sig,
            content_hash(items[1].content),
            max_item_bytes=MAX,
        )
        is False
    )
    assert reads == [MAX]


def test_no_global_lock_is_held_while_a_file_is_parsed(tmp_path, monkeypatch):
    # The reader itself asks for the lock mid-parse: it is free there, or another thread of the
    # worker would stall behind a long parse (no sampling, so no timing to lose on a busy machine).
    path = tmp_path / "big.jsonl"
    path.write_text("".join(f'{{"v": {i}}}\n' for i in range(1000)))
    sig = sources.stat_sig(path.stat())
    real_reader = records.RECORD_READERS["jsonl"]
    free_during_parse: list[bool] = []

    def reader(f, p, s):
        for n, item in enumerate(real_reader(f, p, s)):
            if n % 100 == 0:
                got = changes.digest_lock.acquire(blocking=False)
                free_during_parse.append(got)
                if got:
                    changes.digest_lock.release()
            yield item

    monkeypatch.setitem(records.RECORD_READERS, "jsonl", reader)
    digests = changes.record_digests("jsonl", path, sig)
    assert len(digests) == 1000 * changes.DIGEST_SIZE
    assert free_during_parse and all(free_during_parse), "the digest lock was held during the parse"


# Through a real worker -------------------------------------------------------------------------


def test_a_job_whose_sources_became_fifo_device_and_folder_finishes(cli, tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("a", "b", "c", "d", "e"):
        (docs / f"{name}.txt").write_text(f"text {name}")
    job_id = cli.create("Do", docs)
    for name in ("b", "c", "d"):
        (docs / f"{name}.txt").unlink()
    os.mkfifo(docs / "b.txt")
    (docs / "c.txt").symlink_to("/dev/zero")
    (docs / "d.txt").mkdir()
    started = time.monotonic()
    proc = cli("run", job_id, "--wait", check=False, timeout=90)
    assert time.monotonic() - started < 60
    assert proc.returncode == 1, proc.stderr  # completed with errors
    rows = {
        r["item"]: r
        for r in map(
            json.loads,
            cli("export", job_id, "--format", "jsonl", "--output", "-").stdout.splitlines(),
        )
    }
    assert {n: r["status"] for n, r in rows.items()} == {
        "a.txt": "completed",
        "b.txt": "failed",
        "c.txt": "failed",
        "d.txt": "failed",
        "e.txt": "completed",
    }
    assert rows["a.txt"]["result"] == expected_answer("text a")
    for name, what in (("b.txt", "a FIFO"), ("c.txt", "a symbolic link"), ("d.txt", "a directory")):
        assert rows[name]["error"].startswith("SourceUnusable: the source "), rows[name]
        assert (
            f"is {what}" in rows[name]["error"]
            and "only regular files are read" in rows[name]["error"]
        )


@pytest.mark.parametrize(
    "make, needles",
    [
        (lambda p: (os.mkfifo(p), p)[1], ["it is a FIFO (named pipe)"]),
        (lambda p: (p.symlink_to("/dev/zero"), p)[1], ["it is a character device"]),
        (lambda p: (p.mkdir(), p)[1], ["it is a directory"]),
        (lambda p: p, ["cannot read it (no such file or directory)"]),
        (lambda p: (p.write_text(" " * (1024 * 1024 + 1)), p)[1], ["larger than 1,048,576 bytes"]),
    ],
    ids=["fifo", "link-to-dev-zero", "directory", "missing", "huge"],
)
def test_a_schema_file_must_be_a_small_regular_file(cli, tmp_path, make, needles):
    src = tmp_path / "a.txt"
    src.write_text("x")
    schema = make(tmp_path / "schema.json")
    proc = cli("create", "Do", "--over", str(src), "--schema", str(schema), check=False, timeout=30)
    assert_one_line_error(proc, 1, "--schema", *needles)
