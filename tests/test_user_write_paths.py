"""Every path a user names to write to (`worker -l FILE`, `export --output PATH`) meets one check
(files.check_write_target) against every kind of thing that can be at a path.

A symbolic link is refused and what it points at is left as it was (mode and content: `-l` once
appended log lines to a victim file and made it 0600); a FIFO is refused at once, never waited
on; a directory, a missing folder and a dangling link are one line each, never an internal
error. A regular file (appended to, or replaced) and a new name work; `-l` also takes a
character device such as /dev/null.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hermes_bulk.errors import InputError
from hermes_bulk.files import remove_tree

from .test_cli_errors import assert_one_line_error


def _victim(d: Path) -> Path:
    victim = d / "victim.txt"
    victim.write_text("keep me\n")
    victim.chmod(0o644)
    return victim


def _link_to_victim(d: Path) -> Path:
    (d / "link").symlink_to(_victim(d))
    return d / "link"


def _dangling(d: Path) -> Path:
    (d / "dangling").symlink_to(d / "nowhere" / "x.log")
    return d / "dangling"


def _fifo(d: Path) -> Path:
    os.mkfifo(d / "fifo")
    return d / "fifo"


def _directory(d: Path) -> Path:
    (d / "folder").mkdir()
    return d / "folder"


def _missing_folder(d: Path) -> Path:
    return d / "no-such-folder" / "x.log"


BAD = [
    (_link_to_victim, "symbolic link"),
    (_dangling, "symbolic link"),
    (_fifo, "FIFO"),
    (_directory, "a directory"),
    (_missing_folder, "does not exist"),
]


def _worker(cli, path: Path):
    return cli("worker", "--burst", "-l", str(path), check=False, timeout=30)


def _export(cli, path: Path, job_id: str):
    return cli("export", job_id, "--output", str(path), check=False, timeout=30)


@pytest.fixture
def job_id(cli, tmp_path):
    src = tmp_path / "items.jsonl"
    src.write_text('"a"\n')
    return cli.create("Do", src)


@pytest.mark.parametrize("make, says", BAD, ids=[m.__name__.strip("_") for m, _ in BAD])
@pytest.mark.parametrize("option", ["worker -l", "export --output"])
def test_a_write_path_that_is_not_a_regular_file_is_one_line_and_changes_nothing(
    cli, tmp_path, job_id, option, make, says
):
    d = tmp_path / "place"
    d.mkdir()
    path = make(d)
    before = _snapshot(d)
    proc = _worker(cli, path) if option == "worker -l" else _export(cli, path, job_id)
    assert_one_line_error(proc, 1, says, str(path), option.split()[1])
    assert _snapshot(d) == before, (
        "nothing at or beside the path changed (no folder made, no file written)"
    )
    victim = d / "victim.txt"
    if victim.exists():
        assert victim.read_text() == "keep me\n" and stat.S_IMODE(victim.stat().st_mode) == 0o644


def _snapshot(d: Path) -> dict:
    return {
        str(p.relative_to(d)): (st.st_mode, st.st_ino, st.st_size)
        for p in d.rglob("*")
        for st in [os.lstat(p)]
    }


def test_worker_log_to_a_regular_file_appends_owner_only_and_to_a_device_leaves_it(cli, tmp_path):
    log = tmp_path / "worker.log"
    log.write_text("earlier\n")
    log.chmod(0o644)
    assert _worker(cli, log).returncode == 0
    assert log.read_text().startswith("earlier\n") and len(log.read_text()) > len("earlier\n")
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    before = os.stat("/dev/null")
    assert _worker(cli, Path("/dev/null")).returncode == 0
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_mode == before.st_mode


def _a_file(d: Path) -> Path:
    (d / "home").write_text("not a folder\n")
    return d / "home"


def _under_a_file(d: Path) -> Path:
    return _a_file(d) / "bulk"


def _fifo_home(d: Path) -> Path:
    os.mkfifo(d / "home")
    return d / "home"


HOMES = [(_a_file, "is a file"), (_under_a_file, "is a file"), (_fifo_home, "is a FIFO")]


@pytest.mark.parametrize("make, says", HOMES, ids=[m.__name__.strip("_") for m, _ in HOMES])
@pytest.mark.parametrize("command", [["create", "Do", "--over", "SRC"], ["worker", "--burst"]])
def test_a_data_directory_that_is_not_a_folder_is_one_line(cli, tmp_path, make, says, command):
    d = tmp_path / "place"
    d.mkdir()
    home = make(d)
    src = tmp_path / "one.txt"
    src.write_text("item")
    before = _snapshot(d)
    argv = [str(src) if a == "SRC" else a for a in command]
    proc = cli(*argv, check=False, timeout=30, HERMES_BULK_HOME=str(home))
    assert_one_line_error(proc, 3, says, "not a folder", "HERMES_BULK_HOME")
    assert _snapshot(d) == before


# What hermes-bulk deletes: a job's folder, only under the data directory.


def test_remove_tree_deletes_only_under_the_data_directory(tmp_path):
    data = tmp_path / "data"
    (data / "jobs" / "j1").mkdir(parents=True)
    (data / "jobs" / "j1" / "000000.md").write_text("x")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    with pytest.raises(InputError, match="outside"):
        remove_tree(outside, data)
    with pytest.raises(InputError):
        remove_tree(data, data)
    assert outside.exists()
    remove_tree(data / "jobs" / "j1", data)
    assert not (data / "jobs" / "j1").exists() and (data / "jobs").exists()
    remove_tree(data / "jobs" / "j1", data)  # gone already: nothing to do, no error
