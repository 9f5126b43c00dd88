"""`export --output` writes only a regular file, or `-` for standard output.

`--output /dev/null` once turned /dev/null into a regular 0600 file (as root); a FIFO and a
symbolic link were replaced, and missing folders were made. Every refusal is one line, comes
before anything is written, and leaves what was at the path as it was.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from .test_cli_errors import assert_one_line_error


@pytest.fixture
def job_id(cli, tmp_path):
    src = tmp_path / "items.jsonl"
    src.write_text('"a"\n"b"\n')
    return cli.create("Do", src)


def _char_device(tmp_path: Path) -> Path:
    """A character device that is safe to lose: a private copy of /dev/null's node when root
    (so even a broken refusal clobbers nothing shared), else /dev/null itself, which a
    non-root user cannot replace anyway."""
    if os.geteuid() == 0:
        node = tmp_path / "null-device"
        os.mknod(node, stat.S_IFCHR | 0o600, os.stat("/dev/null").st_rdev)
        return node
    return Path("/dev/null")


def _fifo(p: Path) -> Path:
    os.mkfifo(p)
    return p


def _link_to_file(p: Path) -> Path:
    (p.parent / "real.md").write_text("keep me")
    p.symlink_to(p.parent / "real.md")
    return p


def _link_to_device(p: Path) -> Path:
    p.symlink_to(_char_device(p.parent))
    return p


def _dangling_link(p: Path) -> Path:
    p.symlink_to(p.parent / "nowhere" / "x.md")
    return p


def _missing_folder(p: Path) -> Path:
    return p.parent / "no-such-folder" / "out.md"


def _folder_is_a_file(p: Path) -> Path:
    (p.parent / "plain").write_text("a file")
    return p.parent / "plain" / "out.md"


def _directory(p: Path) -> Path:
    p.mkdir()
    return p


def _snapshot(path: Path):
    """What is at path (without following a link), and what a link points at."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    target = os.readlink(path) if stat.S_ISLNK(st.st_mode) else None
    content = (
        path.read_text() if stat.S_ISREG(st.st_mode) or (target and Path(path).is_file()) else None
    )
    return stat.S_IFMT(st.st_mode), st.st_ino, st.st_rdev, target, content


@pytest.mark.parametrize(
    "make, needles",
    [
        (_fifo, ["is a FIFO", "not a regular file"]),
        (_directory, ["is a directory"]),
        (lambda p: _char_device(p.parent), ["is a character device"]),
        (_link_to_file, ["symbolic link to", "real.md"]),
        (
            _link_to_device,
            ["symbolic link to", "null-device" if os.geteuid() == 0 else "/dev/null"],
        ),
        (_dangling_link, ["symbolic link to", "nowhere"]),
        (_missing_folder, ["no-such-folder does not exist"]),
        (_folder_is_a_file, ["plain is not a folder"]),
    ],
    ids=[
        "fifo",
        "directory",
        "char-device",
        "link-to-file",
        "link-to-device",
        "dangling-link",
        "missing-folder",
        "folder-is-a-file",
    ],
)
def test_export_refuses_what_is_not_a_regular_file(cli, job_id, tmp_path, make, needles):
    out = make(tmp_path / "out.md")
    before = _snapshot(out)
    parent_before = sorted(os.listdir(out.parent)) if out.parent.is_dir() else None
    proc = cli("export", job_id, "--output", str(out), check=False, timeout=30)
    assert_one_line_error(proc, 1, "Cannot write the export to", *needles)
    assert _snapshot(out) == before, "what was at the path is unchanged"
    if parent_before is not None:
        assert sorted(os.listdir(out.parent)) == parent_before, "no temporary file is left behind"
    assert not (tmp_path / "no-such-folder").exists(), "no folder was made"
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_an_empty_output_is_a_usage_error(cli, job_id):
    assert_one_line_error(
        cli("export", job_id, "--output", "", check=False), 2, "--output is empty"
    )


def test_a_regular_file_is_replaced_and_dash_is_standard_output(cli, job_id, tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text("old")
    out.chmod(0o640)
    assert cli("export", job_id, "--format", "jsonl", "--output", str(out)).stdout.strip() == str(
        out
    )
    from_file = out.read_text()
    assert [json.loads(line)["item"] for line in from_file.splitlines()] == ["line:1", "line:2"]
    # A file the user named keeps the mode it had (new files: tests/test_cli_messages.py).
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    piped = cli("export", job_id, "--format", "jsonl", "--output", "-")
    assert piped.stdout == from_file, "the same export, on standard output, and nothing else"
    assert not (tmp_path / "-").exists() and not Path("-").exists()


@pytest.mark.parametrize(
    "plant",
    [
        lambda p: os.mkfifo(p),
        lambda p: p.symlink_to("/dev/null"),
        lambda p: p.mkdir(),
        lambda p: p.write_text("old"),
    ],
    ids=["fifo", "link", "directory", "stale-file"],
)
def test_an_output_file_never_opens_what_holds_its_temporary_name(tmp_path, plant):
    """write_private (every outputs/NNNNNN.md) creates its temporary file afresh: a FIFO left at
    that name once would have blocked the worker's write forever."""
    import threading

    from hermes_bulk.files import write_private

    go, done = threading.Event(), threading.Event()
    worker = threading.Thread(
        target=lambda: (go.wait(), write_private(tmp_path / "000000.md", "answer\n"), done.set()),
        daemon=True,
    )
    worker.start()
    planted = tmp_path / f".tmp-{os.getpid()}-{worker.ident}"  # the name that thread will use
    plant(planted)
    go.set()
    worker.join(5)
    assert done.is_set(), "write_private did not finish"
    assert (tmp_path / "000000.md").read_text() == "answer\n"
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert not planted.exists() and not planted.is_symlink()
