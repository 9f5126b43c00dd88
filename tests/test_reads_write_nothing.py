"""A read never writes (DESIGN.md invariant 13), the dashboard's included.

`status`, `list`, `events` and `export` change nothing in the store or under the data directory
but the export file asked for. Each read runs as a real `hermes-bulk` process; before and after
it, everything is snapshotted: every path under the data directory (kind, mode, size, mtime,
contents), and the store's data behind its back (every table of every SQLite file, read
immutably; every Redis key of the test's prefix and its value, through a raw client).

The job read has completed and failed items, and two completed items whose output files are
missing (as on a machine that did not run them, or whose worker stopped between saving the
result and writing the file); a second job was run with no worker to take it, so its triggers
wait in the queue and `status` shows it awaiting recovery. On Redis the reads also run from a
machine that never ran anything: a data directory that does not exist yet.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat
from pathlib import Path

import pytest
import redis

from .contract.conftest import prefix_of

Snapshot = dict[str, tuple]


def _files(root: Path) -> Snapshot:
    """Every path under root: kind and mode, and for a file its size, mtime and a digest of its
    bytes.

    A folder's own mtime is left out: SQLite makes and removes its -wal/-shm beside the database
    whenever a process opens it, which touches the folder but leaves no path behind.
    """
    found: Snapshot = {}
    if not root.exists():
        return found
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            st = os.lstat(path)
            key = str(path.relative_to(root))
            if stat.S_ISREG(st.st_mode):
                found[key] = (
                    "file",
                    oct(st.st_mode),
                    st.st_size,
                    st.st_mtime_ns,
                    hashlib.sha256(path.read_bytes()).hexdigest(),
                )
            elif stat.S_ISLNK(st.st_mode):
                found[key] = ("link", os.readlink(path))
            else:
                found[key] = ("dir" if stat.S_ISDIR(st.st_mode) else "other", oct(st.st_mode))
    return found


def _sqlite_tables(path: Path) -> dict[str, list]:
    """Every row of every table, read with immutable=1: no lock, no -wal/-shm, nothing written.

    Reads between commands only, when no process has the file open; a WAL left behind would
    show in the file snapshot.
    """
    conn = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
    try:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            )
        ]
        return {t: sorted(map(repr, conn.execute(f'SELECT * FROM "{t}"'))) for t in tables}
    finally:
        conn.close()


def _redis_keys(client: redis.Redis, prefix: str) -> dict[bytes, object]:
    """Every key holding the prefix, its value by type, and whether it expires (not its TTL:
    that counts down by itself)."""
    dump: dict[bytes, object] = {}
    for key in sorted(client.scan_iter(match=f"*{prefix}*", count=1000)):
        kind = client.type(key).decode()
        value = {
            "string": lambda k: client.get(k),
            "hash": lambda k: sorted(client.hgetall(k).items()),
            "list": lambda k: client.lrange(k, 0, -1),
            "set": lambda k: sorted(client.smembers(k)),
            "zset": lambda k: client.zrange(k, 0, -1, withscores=True),
        }[kind](key)
        dump[key] = (kind, value, client.ttl(key) >= 0)
    return dump


class World:
    """The data directory and the store that a read must leave as they were."""

    def __init__(
        self, home: Path, backend: str, redis_client: redis.Redis | None, prefix: str | None
    ) -> None:
        self.home, self.backend, self.redis, self.prefix = home, backend, redis_client, prefix

    def snapshot(self, store_home: Path) -> tuple[Snapshot, dict]:
        files = _files(self.home)
        if self.backend == "sqlite":
            store = {p.name: _sqlite_tables(p) for p in sorted(store_home.glob("*.db"))}
        else:
            store = _redis_keys(self.redis, self.prefix)
        return files, store


def _changed(before: Snapshot, after: Snapshot) -> set[str]:
    return {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


def _allowed(target: Path | None, home: Path) -> set[str]:
    """The export file asked for, and the folders made for it (the job's folder, on a machine
    that has none yet)."""
    if target is None or home not in target.parents:
        return set()
    rel = target.relative_to(home)
    return {str(rel), *(str(p) for p in rel.parents if str(p) != ".")}


@pytest.fixture(params=["sqlite", "redis", "redis, another machine"])
def setup(request, cli, tmp_path, home, fake_provider):
    """A job with completed and failed items and two missing output files; a second job run with
    no worker. Returns the world the reads run in and the environment they run with."""
    backend = request.param.split(",")[0]
    raw = prefix = None
    if backend == "redis":
        url = request.getfixturevalue("redis_url")
        cli.env["HERMES_BULK_BACKEND"] = url
        raw = redis.Redis(
            port=request.getfixturevalue("redis_server").port
        )  # bytes: Huey stores pickles
        request.addfinalizer(raw.close)
        prefix = prefix_of(url)
    src = tmp_path / "items.jsonl"
    src.write_text("".join(f'{{"n": {i}}}\n' for i in range(6)) + '{"n": "PERMANENT-400"}\n')
    fake_provider.configure(item_faults={"PERMANENT-400": "400"})
    job_id = cli.create("Do", src, "--retries", "0")
    cli("run", job_id, "--wait", check=False)
    assert cli.json("status", job_id, "--json")["failed"] == 1
    outputs = home / "jobs" / job_id / "outputs"
    for index in (1, 3):
        (outputs / f"{index:06d}.md").unlink()
    waiting = cli.create("Do", src)
    cli("run", waiting)  # no worker: its triggers wait in the queue
    assert (
        cli.json("status", waiting, "--json")["state"] == "waiting_for_worker"
    )  # run, never picked up
    read_home, extra = home, {}
    if request.param.endswith("another machine"):
        read_home = tmp_path / "other-machine" / "data"
        extra = {"HERMES_BULK_HOME": str(read_home)}
    return World(read_home, backend, raw, prefix), home, job_id, extra


READS = [
    ("status", "{job}"),
    ("status",),
    ("status", "{job}", "--json"),
    ("status", "{job}", "--events", "5"),
    ("list",),
    ("list", "--json"),
    ("events", "{job}"),
    ("show", "{job}", "1"),
    ("show", "{job}", "line:7", "--json"),
    ("status", "{job}", "--failed"),
    ("export", "{job}"),
    ("export", "{job}", "--format", "csv"),
    ("export", "{job}", "--format", "jsonl"),
    ("export", "{job}", "--format", "csv", "--output", "{out}"),
    ("export", "{job}", "--output", "-"),
]


def test_reads_change_nothing_but_the_export_asked_for(setup, cli, tmp_path):
    world, store_home, job_id, extra = setup
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "results.csv"
    for read in READS:
        args = [a.format(job=job_id, out=out) for a in read]
        files_before, store_before = world.snapshot(store_home)
        proc = cli(*args, **extra)
        files_after, store_after = world.snapshot(store_home)
        command = "hermes-bulk " + " ".join(read)
        assert store_after == store_before, f"{command} changed the store"
        if read[0] == "export" and "--output" not in read:
            target = Path(proc.stdout.strip())
            assert (
                target
                == world.home
                / "jobs"
                / job_id
                / f"results.{args[-1] if '--format' in args else 'md'}"
            )
        elif "--output" in read and args[-1] != "-":
            target = out
        else:
            target = None
        changed = _changed(files_before, files_after)
        assert changed <= _allowed(target, world.home), (
            f"{command} changed {sorted(changed)} under the data directory"
        )
        if target is not None:
            assert target.is_file() and target.stat().st_size > 0


def test_the_dashboard_changes_nothing(setup, cli):
    """Every page, every API read and every export download of `hermes-bulk dashboard`, from
    start to stop (its samples stay in its memory)."""
    from .dashboard.conftest import start_dashboard

    world, store_home, job_id, extra = setup
    files_before, store_before = world.snapshot(store_home)
    d = start_dashboard(
        cli, HERMES_BULK_DASHBOARD_TOKEN="a-dashboard-token-for-tests-0123456789", **extra
    )
    try:
        with d.client() as c:
            reads = [
                "/",
                "/workers",
                f"/jobs/{job_id}",
                "/static/dashboard.js",
                "/api/jobs",
                "/api/workers",
                f"/api/jobs/{job_id}",
                f"/api/jobs/{job_id}/export?format=md",
                f"/api/jobs/{job_id}/export?format=csv",
                f"/api/jobs/{job_id}/export?format=jsonl",
            ]
            for path in reads * 2:  # twice: the second time the samples are there
                assert c.get(path).status_code == 200, path
            assert c.get(f"/api/jobs/{job_id}").json()["job"]["failed"] == 1
    finally:
        d.stop()
    files_after, store_after = world.snapshot(store_home)
    assert store_after == store_before, "the dashboard changed the store"
    assert _changed(files_before, files_after) == set(), "the dashboard changed the data directory"
