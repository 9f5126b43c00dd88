"""A full disk is said as such, where it is, and loses nothing (create, run, export).

The data directory (or the export's folder) is a small tmpfs mounted for the test and filled
with a file, so the disk is really full: SQLite says "database or disk is full" or only "disk
I/O error", writes fail with ENOSPC, and the errors.log a bug would point at cannot be written
either. Each command answers one line naming the full disk (no traceback, no "internal error");
after space is freed, running the command again finishes the job with every item answered once.
Mounting needs root (CI runs as root; a skip there fails the run, tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hermes_bulk.testing.fake_provider import expected_answer

from .helpers import wait_for

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Callable[[str], Path]]:
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root")
        point = tmp_path / f"disk-{len(mounted)}"
        point.mkdir()
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(point)],
            capture_output=True,
            text=True,
        )
        if proc.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=False)


def fill(disk: Path, leave: int = 0) -> Path:
    """Fill the disk to the last byte but `leave`; the returned file frees it when removed."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (65536, 1):
            try:
                while os.write(fd, b"\0" * chunk):
                    pass
            except OSError:
                pass
        if leave:
            os.ftruncate(fd, max(0, os.fstat(fd).st_size - leave))
    finally:
        os.close(fd)
    return filler


def assert_disk_full_line(proc, where: Path, codes: tuple[int, ...] = (1,)) -> None:
    """One final line naming the full disk; 3 where the store itself cannot be opened."""
    out = proc.stdout + proc.stderr
    assert proc.returncode in codes, out
    assert "Traceback" not in out and "internal error" not in out and "Logging error" not in out, (
        out
    )
    last = proc.stderr.strip().splitlines()[-1]
    assert "disk is full" in last and str(where) in last, last


def test_create_on_a_full_disk_says_so_and_makes_no_half_job(cli, tmp_path, small_disk):
    disk = small_disk("2m")
    home = disk / "bulk"
    src = tmp_path / "src"
    src.mkdir()
    for i in range(300):  # ~3.6 MB of content: more than the disk holds
        (src / f"f{i:03}.txt").write_text(os.urandom(6000).hex())
    proc = cli("create", "Summarise", "--over", str(src), check=False, HERMES_BULK_HOME=str(home))
    assert_disk_full_line(proc, home)
    assert (
        not (home / "logs" / "errors.log").exists()
        or (home / "logs" / "errors.log").stat().st_size == 0
    )
    listed = cli("list", "--json", check=False, HERMES_BULK_HOME=str(home))
    assert listed.returncode == 0 and json.loads(listed.stdout or "[]") == [], (
        listed.stdout + listed.stderr
    )


@pytest.mark.parametrize("leave", [0, 160 * 1024], ids=["full", "fills-while-running"])
def test_run_on_a_disk_that_fills_says_so_and_finishes_once_space_is_freed(
    cli, tmp_path, small_disk, fake_provider, leave
):
    disk = small_disk("4m")
    env = {"HERMES_BULK_HOME": str(disk / "bulk"), "HERMES_BULK_LEASE_SECONDS": "2"}
    src = tmp_path / "items.jsonl"
    items = [json.dumps(f"item {i} " + "x" * 4000) for i in range(40)]
    src.write_text("\n".join(items) + "\n")
    job_id = json.loads(cli("create", "Echo", "--over", str(src), "--json", **env).stdout)["job_id"]
    filler = fill(disk, leave)
    proc = cli("run", job_id, "--wait", check=False, timeout=120, **env)
    assert_disk_full_line(proc, disk / "bulk", codes=(1, 3))
    filler.unlink()
    cli("run", job_id, "--wait", timeout=120, **env)
    st = json.loads(cli("status", job_id, "--json", **env).stdout)
    assert (st["state"], st["completed"], st["failed"]) == ("completed", 40, 0), st
    rows = [
        json.loads(line)
        for line in cli(
            "export", job_id, "--format", "jsonl", "--output", "-", **env
        ).stdout.splitlines()
    ]
    assert [r["result"] for r in rows] == [expected_answer(item) for item in items]


def test_export_onto_a_full_disk_says_so_and_leaves_the_old_file(cli, tmp_path, small_disk):
    src = tmp_path / "items.jsonl"
    src.write_text("\n".join(json.dumps("y" * 3000 + str(i)) for i in range(200)) + "\n")
    job_id = cli.create("Echo", src)
    cli("run", job_id, "--wait")
    disk = small_disk("1m")
    out = disk / "results.csv"
    out.write_text("the old export\n")
    fill(disk)
    proc = cli("export", job_id, "--format", "csv", "--output", str(out), check=False)
    assert_disk_full_line(proc, out)
    assert out.read_text() == "the old export\n"
    assert sorted(p.name for p in disk.iterdir()) == ["filler", "results.csv"], (
        "no temporary file left"
    )


@pytest.mark.parametrize("runner", ["worker", "run --wait"])
def test_answers_in_flight_when_the_disk_fills_are_kept_and_never_asked_again(
    cli, tmp_path, small_disk, fake_provider, runner
):
    """Four answers arrive while the data directory's disk is full, and it stays full past their
    leases: they are kept in memory, no new item is taken, and they are saved once space is
    freed. Every item is asked once. (`run --wait` stops when its heartbeat cannot be written
    for a lease, after saving what it kept; run again, it finishes.)"""
    disk = small_disk("4m")
    env = {"HERMES_BULK_HOME": str(disk / "bulk"), "HERMES_BULK_LEASE_SECONDS": "2"}
    src = tmp_path / "items.jsonl"
    items = [json.dumps(f"item {i} " + "x" * 4000) for i in range(12)]
    src.write_text("\n".join(items) + "\n")
    job_id = json.loads(cli("create", "Echo", "--over", str(src), "--json", **env).stdout)["job_id"]
    fake_provider.hold()
    if runner == "worker":
        process = cli.spawn_worker("-w", "4", **env)  # its log is outside the small disk
        cli("run", job_id, **env)
    else:
        process = subprocess.Popen(
            [sys.executable, "-m", "hermes_bulk", "run", job_id, "--wait", "-w", "4"],
            env=cli.full_env(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    try:
        fake_provider.wait_held(4, timeout=60)
        filler = fill(disk)
        fake_provider.release()
        if runner == "worker":
            log = cli.logs_dir / "worker-1.log"
            wait_for(
                lambda: log.read_text().count("an answer is kept in memory") == 4,
                timeout=60,
                message="the four answers are kept",
            )
        time.sleep(3)  # so that their leases (2 s) run out while the disk is full
        assert len(fake_provider.requests) == 4, "no new item is taken while the disk is full"
        filler.unlink()
        if runner == "worker":
            wait_for(lambda: cli.status(job_id, **env)["completed"] == 12, timeout=60)
            assert "Traceback" not in log.read_text()
        else:
            out, err = process.communicate(timeout=60)
            assert "Traceback" not in out + err and "internal error" not in out + err
            if cli.status(job_id, **env)["completed"] < 12:
                cli("run", job_id, "--wait", **env)
    finally:
        process.terminate()
        process.wait(30)
    asked = Counter(r.item for r in fake_provider.requests)
    assert len(asked) == 12 and set(asked.values()) == {1}, asked
    rows = [
        json.loads(line)
        for line in cli(
            "export", job_id, "--format", "jsonl", "--output", "-", **env
        ).stdout.splitlines()
    ]
    assert [r["result"] for r in rows] == [expected_answer(item) for item in items]


def test_batch_results_that_arrive_on_a_full_disk_are_read_again_never_bought_again(
    cli, tmp_path, small_disk, fake_provider
):
    """A batch ends while the data directory's disk is full, and stays so for more passes than
    a batch's strikes: its results are read again once there is room; no second batch."""
    disk = small_disk("4m")
    env = {"HERMES_BULK_HOME": str(disk / "bulk"), "HERMES_BULK_BATCH_POLL_SECONDS": "0.1"}
    src = tmp_path / "items.jsonl"
    items = [json.dumps(f"item {i} " + "x" * 4000) for i in range(6)]
    src.write_text("\n".join(items) + "\n")
    fake_provider.configure(batch_hold=True)
    job_id = cli.json("create", "Echo", "--over", str(src), "--batch", "--json", **env)["job_id"]
    cli("run", job_id, **env)
    worker = cli.spawn_worker("-w", "2", **env)
    log = cli.logs_dir / "worker-1.log"
    try:
        wait_for(lambda: len(fake_provider.batches.created) == 1, timeout=60)
        filler = fill(disk)
        fake_provider.configure(batch_hold=False)
        wait_for(  # more passes than a batch's strikes (MAX_STRIKES, 5)
            lambda: log.read_text().count("results are read again once there is room") > 5,
            timeout=60,
            message="the worker says the disk is full, pass after pass",
        )
        filler.unlink()
        wait_for(lambda: cli.status(job_id, **env)["state"] == "completed", timeout=60)
    finally:
        worker.terminate()
        worker.wait(30)
    assert len(fake_provider.batches.created) == 1 and len(fake_provider.batches.lines) == 6
    assert not fake_provider.requests and "Traceback" not in log.read_text()
