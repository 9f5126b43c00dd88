"""One open database per SQLite file per process, connections that end with their threads, and
settings that stay with the thread that loaded them (DESIGN.md invariant 10).

On POSIX, closing any descriptor of a file drops every lock the process holds on it, SQLite's
included: another process closing its last connection then deletes the -wal/-shm under the
first one, whose admissions from then on go to a deleted file. These tests run real processes
against a real ledger and count descriptors in /proc/self/fd.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from hermes_bulk.budget.ledger import CallRecord
from hermes_bulk.budget.ledger_location import open_ledger
from hermes_bulk.budget.windows import window_at
from hermes_bulk.config.settings import Settings, load_settings
from hermes_bulk.errors import BackendUnavailable, InputError
from hermes_bulk.fleet import broker
from hermes_bulk.frontends.flag_files import read_schema
from hermes_bulk.jobs.request import JobRequest
from hermes_bulk.jobs.service import Jobs
from hermes_bulk.store.sqlite.database import is_open_sqlite_file, open_database
from hermes_bulk.store.sqlite.queue import queue_maker
from hermes_bulk.store.sqlite.schema import MIGRATIONS

pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc (Linux)")

# What the processes below run: admitters open the ledger twice (as the bulk plugin's budget and
# its gate do) and admit in a loop; readers open and close it as `hermes cron-budget status` does.
CHILD = r"""
import datetime as dt, json, os, sys, time
from pathlib import Path
from zoneinfo import ZoneInfo
from hermes_bulk.budget import policy
from hermes_bulk.budget.ledger import CallRecord
from hermes_bulk.budget.ledger_location import open_ledger
from hermes_bulk.budget.windows import window_at

role, path, rundir, n = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
window = window_at(time.time(), dt.time(0, 0), ZoneInfo("UTC"))
call = CallRecord("chat", profile=role, provider="custom", model="m", api_mode="chat_completions")
terms = policy.terms_for("chat", "m", "", mode="enforce", daily_limit=10, chat_reserve=4,
                         job_limit=None, models=("*",))

def handles():
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(path):
            out.append(target)
    return out

if role.startswith("reader"):
    while not (rundir / "stop").exists():
        first = open_ledger(path)
        first.counts(window)
        second = open_ledger(path)
        second.counts(window)
        second.close()
        first.close()
        (rundir / f"ready-{role}").touch()
    sys.exit(0)

first = open_ledger(path)
first.admit(call, window, terms)
second = open_ledger(path)  # the second user in this process: it must not drop the first's locks
while len(list(rundir.glob("ready-reader-*"))) < 2:  # readers are opening and closing by now
    time.sleep(0.01)
admitted, errors = 1, []
for i in range(n - 1):
    if i == n // 2:
        second.close()  # one user leaves; the other goes on
    ledger = second if i < n // 2 else first
    try:
        ledger.admit(call, window, terms)
        admitted += 1
    except Exception as exc:
        errors.append(repr(exc))
    time.sleep(0.002)  # leave the readers room to open and close in between
seen_at_end = handles()
(rundir / f"done-{role}").touch()
while len(list(rundir.glob("done-*"))) < 2:
    time.sleep(0.01)
total = first.counts(window).total
print(json.dumps({"admitted": admitted, "errors": errors[:3], "n_errors": len(errors),
                  "handles": seen_at_end, "total_seen": total}))
first.close()
"""


def _fds_on(path: Path) -> list[str]:
    """Where this process's descriptors on path, path-wal and path-shm point."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(path)):
            out.append(target)
    return out


def test_the_wal_survives_a_second_open_while_other_processes_open_and_close_the_ledger(tmp_path):
    path = str(tmp_path / "ledger.db")
    n = 150
    open_ledger(path).close()  # made once, so no child races to create it
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

    def start(role):
        return subprocess.Popen(
            [sys.executable, "-c", CHILD, role, path, str(tmp_path), str(n)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    readers = [start("reader-1"), start("reader-2")]
    admitters = [start("admitter-1"), start("admitter-2")]
    try:
        results = []
        for proc in admitters:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
            results.append(json.loads(out))
    finally:
        (tmp_path / "stop").touch()
        for proc in readers + admitters:
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
    for reader in readers:
        assert reader.returncode == 0, reader.stderr

    for r in results:
        assert r["n_errors"] == 0, r["errors"]
        assert r["admitted"] == n
        # The WAL and its index stay the live files, never "(deleted)" under the process.
        assert not [h for h in r["handles"] if "(deleted)" in h], r["handles"]
        assert any(h.endswith("-wal") for h in r["handles"]), r["handles"]
        # Every process saw every admission of every other one.
        assert r["total_seen"] == 2 * n
    window = window_at(time.time(), dt.time(0, 0), ZoneInfo("UTC"))
    ledger = open_ledger(path)
    try:
        assert ledger.counts(window).total == 2 * n
        assert len(ledger.entries(window, limit=10 * n)) == 2 * n
    finally:
        ledger.close()


def test_two_opens_in_one_process_share_one_database_and_keep_its_locks(tmp_path):
    path = tmp_path / "ledger.db"
    first = open_ledger(str(path))
    window = window_at(time.time(), dt.time(0, 0), ZoneInfo("UTC"))
    from hermes_bulk.budget import policy

    call = CallRecord(
        "chat", profile="p", provider="custom", model="m", api_mode="chat_completions"
    )
    terms = policy.terms_for(
        "chat",
        "m",
        "",
        mode="monitor",
        daily_limit=10,
        chat_reserve=4,
        job_limit=None,
        models=("*",),
    )
    first.admit(call, window, terms)
    link = tmp_path / "link.db"
    link.symlink_to(path)
    second = open_ledger(f"sqlite:///{link}")  # another spelling of the same file
    try:
        # Another process closing its last connection must find this one's locks held.
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]);"
                " c.execute('select count(*) from requests').fetchall(); c.close()",
                str(path),
            ],
            check=True,
        )
        assert not [h for h in _fds_on(path) if "(deleted)" in h]
        assert (tmp_path / "ledger.db-wal").exists() and (tmp_path / "ledger.db-shm").exists()
        assert second.db is first.db and second.turns is first.turns
        second.close()
        first.admit(call, window, terms)
        assert first.counts(window).total == 2
    finally:
        second.close()
        first.close()


def test_the_job_store_is_one_database_per_file_under_any_spelling_of_its_url(
    tmp_path, monkeypatch
):
    (tmp_path / "data").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    urls = [
        f"sqlite:///{tmp_path}/data/bulk.db",
        "sqlite:///data/bulk.db",
        f"sqlite:///{tmp_path}/alias/bulk.db",
        f"sqlite:///{tmp_path}/data/../data/bulk.db",
    ]
    try:
        backends = [broker.open_backend(Settings(backend=url)) for url in urls]
        assert all(b is backends[0] for b in backends)
        db = backends[0].store.db
        assert open_database(tmp_path / "alias" / "bulk.db") is db
        db.close()
    finally:
        broker.close_all()


def test_a_source_schema_or_export_that_is_an_open_database_is_refused(tmp_path):
    home = tmp_path / "data"
    jobs = Jobs(Settings(home=home, model="m", backend=""))
    try:
        home.mkdir(
            exist_ok=True
        )  # Jobs makes the database (and the folder) at the first write: create
        (home / "notes.txt").write_text("a note")
        # the data directory itself as the source
        created = jobs.create(JobRequest(instruction="Summarize", over=str(home)))
        skipped = {s.name: s.reason for s in created.skipped}
        for name in ("bulk.db", "bulk.db-wal", "bulk.db-shm", "bulk-queue.db"):
            assert "database in use" in skipped.get(name, ""), skipped
        assert created.job.total == 1
        with pytest.raises(InputError, match="database in use"):
            read_schema(home / "bulk.db")
        for name in ("bulk.db", "bulk.db-wal", "bulk-queue.db"):
            with pytest.raises(InputError, match="database in use"):
                jobs.export(created.job.job_id, output=str(home / name))
        # Nothing above released this process's locks: another process's close leaves the WAL be.
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]);"
                " c.execute('select count(*) from jobs').fetchall(); c.close()",
                str(home / "bulk.db"),
            ],
            check=True,
        )
        assert not [h for h in _fds_on(home / "bulk") if "(deleted)" in h], _fds_on(home / "bulk")
    finally:
        broker.close_all()


def test_every_spelling_of_an_open_database_or_its_side_files_is_known_and_nothing_else(tmp_path):
    """What else can be at a source's place: the database under another name (a hard link, a
    link, a path through a linked folder), its -wal behind a link with an innocent name, its
    queue file; and, not to be refused, files that only look like those."""
    data = tmp_path / "data"
    db = open_database(data / "bulk.db")
    try:
        queue_maker(data / "bulk-queue.db", db)
        with db.write() as conn:  # a write leaves the -wal and -shm beside it
            conn.execute("CREATE TABLE IF NOT EXISTS probe (x)")
        assert (data / "bulk.db-wal").exists()
        other = tmp_path / "elsewhere"
        other.mkdir()
        os.link(data / "bulk.db", other / "hard.db")
        os.link(data / "bulk-queue.db", other / "queue-hard.db")
        (other / "notes.txt").symlink_to(data / "bulk.db-wal")
        (other / "db-link").symlink_to(data / "bulk.db")
        (tmp_path / "via").symlink_to(data)
        held = [
            data / "bulk.db",
            data / "bulk.db-wal",
            data / "bulk.db-shm",
            data / "bulk-queue.db",
            other / "hard.db",
            other / "queue-hard.db",
            other / "notes.txt",
            other / "db-link",
            tmp_path / "via" / "bulk.db-wal",
            tmp_path / "via" / "bulk.db",
            data / ".." / "data" / "bulk.db-shm",
        ]
        for path in held:
            assert is_open_sqlite_file(path), path
        (other / "bulk.db-wal").write_text("a file named like a side file, beside no database")
        (other / "copy.db").write_bytes((data / "bulk.db").read_bytes())
        (other / "plain.txt").write_text("text")
        (other / "dangling").symlink_to(other / "missing-wal")
        for path in (
            other / "bulk.db-wal",
            other / "copy.db",
            other / "plain.txt",
            other / "dangling",
            other / "missing",
        ):
            assert not is_open_sqlite_file(path), path
    finally:
        db.close()


def test_a_file_open_as_a_job_store_is_not_opened_as_a_ledger(tmp_path):
    path = tmp_path / "bulk.db"
    db = open_database(path)
    try:
        with pytest.raises(BackendUnavailable, match="already open"):
            open_ledger(str(path))
    finally:
        db.close()


def test_a_new_database_is_owner_only_and_a_path_that_is_not_a_file_is_refused(tmp_path):
    db = open_database(tmp_path / "new" / "bulk.db")
    try:
        with db.write() as conn:
            conn.execute(
                "INSERT INTO workers (id, host, pid, started_at, heartbeat_at, expires_at, threads)"
                " VALUES ('w', 'h', 1, 0, 0, 0, 1)"
            )
        for name in ("bulk.db", "bulk.db-wal", "bulk.db-shm"):
            assert stat.S_IMODE((tmp_path / "new" / name).stat().st_mode) == 0o600, name
    finally:
        db.close()
    fifo = tmp_path / "fifo.db"
    os.mkfifo(fifo)
    (tmp_path / "dir.db").mkdir()
    for bad in (fifo, tmp_path / "dir.db"):
        with pytest.raises(BackendUnavailable, match="not a regular file"):
            open_database(bad)
    # A dangling link is followed: the file is made where it points, owner-only.
    (tmp_path / "dangling.db").symlink_to(tmp_path / "target.db")
    db = open_database(tmp_path / "dangling.db")
    db.close()
    assert stat.S_IMODE((tmp_path / "target.db").stat().st_mode) == 0o600


# Defect 3: a connection per thread, closed when its thread has ended ---------------------------


def _one_item_of_work(db):
    with db.write() as conn:
        conn.execute(
            "INSERT INTO limits (key) VALUES (?) ON CONFLICT (key) DO UPDATE SET"
            " window_count = window_count + 1",
            ("k",),
        )
    assert db.read("SELECT window_count FROM limits WHERE key = 'k'")


def test_connections_of_threads_that_ended_are_closed(tmp_path):
    path = tmp_path / "bulk.db"
    db = open_database(path)

    def threads(count, at_once=1):
        for _ in range(count // at_once):
            batch = [threading.Thread(target=_one_item_of_work, args=(db,)) for _ in range(at_once)]
            for t in batch:
                t.start()
            for t in batch:
                t.join()

    try:
        _one_item_of_work(db)
        before = len(_fds_on(path))
        threads(200)  # each /bulk command in the gateway is a new thread
        assert (
            db.live_connections() <= 2
        )  # this thread's, and the last thread's until the next comes
        assert len(_fds_on(path)) <= before + 3, _fds_on(path)
        # With 10 threads at a time: this thread's, the batch's, and the previous batch's until
        # the next connection is made. SQLite keeps a closed connection's descriptor of a file
        # the process still has locked, for the next connection to reuse: bounded, never growing.
        most = 1 + 10 + 10
        for _ in range(3):
            threads(100, at_once=10)
            assert db.live_connections() <= most
            assert len(_fds_on(path)) <= before + 2 * most, _fds_on(path)
        threads(200)
        assert db.live_connections() <= 2
        assert (
            db.read("SELECT window_count FROM limits WHERE key = 'k'")[0][0]
            == 1 + 200 + 300 + 200 - 1
        )
    finally:
        db.close()
    assert _fds_on(path) == []


def test_a_live_threads_connection_is_never_closed_by_another_threads_sweep(tmp_path):
    db = open_database(tmp_path / "bulk.db")
    holding, release = threading.Event(), threading.Event()
    failures = []

    def long_lived():
        try:
            with db.write() as conn:
                conn.execute("INSERT INTO limits (key) VALUES ('long')")
            holding.set()
            release.wait(30)
            _one_item_of_work(db)  # its connection still works
        except Exception as exc:  # pragma: no cover - the failure being tested for
            failures.append(exc)

    try:
        keeper = threading.Thread(target=long_lived)
        keeper.start()
        assert holding.wait(30)
        for _ in range(50):
            t = threading.Thread(target=_one_item_of_work, args=(db,))
            t.start()
            t.join()
        release.set()
        keeper.join(30)
        assert failures == []
    finally:
        db.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_makes_its_own_connection_and_leaves_the_parents_alone(tmp_path):
    path = tmp_path / "bulk.db"
    db = open_database(path)
    held, release = threading.Event(), threading.Event()

    def hold_the_write_turn():  # another thread is between its turn and its commit at the fork
        with db._write_turn:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold_the_write_turn)
    try:
        _one_item_of_work(db)
        parent_conn = db.connection()
        holder.start()
        assert held.wait(30)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            code = 1
            try:
                if db.connection() is not parent_conn:
                    _one_item_of_work(db)
                    code = 0
            finally:
                os._exit(code)
        deadline = time.monotonic() + 30
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        if done[0] == 0:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the child hung on a lock the parent's other thread held at the fork")
        assert os.waitstatus_to_exitcode(done[1]) == 0
        release.set()
        holder.join()
        assert db.connection() is parent_conn
        _one_item_of_work(db)
        assert db.read("SELECT window_count FROM limits WHERE key = 'k'")[0][0] == 2
        assert not [h for h in _fds_on(path) if "(deleted)" in h]
    finally:
        release.set()
        db.close()


def test_a_database_closed_by_its_last_user_is_open_again_on_the_next_open(tmp_path):
    path = tmp_path / "bulk.db"
    first = open_database(path)
    second = open_database(path)
    assert second is first
    second.close()
    _one_item_of_work(first)  # still open for its other user
    first.close()
    assert _fds_on(path) == []
    again = open_database(path)
    try:
        assert again is not first
        assert again.schema_version() == [name for name, _ in MIGRATIONS]
    finally:
        again.close()


# Defect 2: settings loaded in one thread stay in that thread
# ---------------------------------------


def test_threads_loading_settings_for_different_homes_never_get_each_others(tmp_path, monkeypatch):
    for key in ("HERMES_BULK_HOME", "HERMES_HOME", "HERMES_BULK_BACKEND"):
        monkeypatch.delenv(key, raising=False)
    homes = [tmp_path / f"profile-{i}" for i in range(4)]
    crossovers, start = [], threading.Barrier(len(homes))

    def load_many(home: Path):
        start.wait()
        for _ in range(1500):
            got = load_settings(plugin_settings={"home": str(home)}).home
            if got != home:
                crossovers.append((home, got))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible, as a busy gateway would
    try:
        threads = [threading.Thread(target=load_many, args=(home,)) for home in homes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert crossovers == [], f"{len(crossovers)} of {1500 * len(homes)} loads got another home"
    assert load_settings().home != homes[0], "plugin settings do not outlive their load"


def test_backends_opened_inside_closing_new_are_closed_after_it_and_those_before_stay(tmp_path):
    """A command run inside a process that lives on (a test's, tests/helpers.run_in_process)
    leaves no backend of its own open, and keeps the process's."""
    before = Settings(backend=f"sqlite:///{tmp_path}/before.db")
    inside = Settings(backend=f"sqlite:///{tmp_path}/inside.db")
    try:
        kept = broker.open_backend(before)
        with broker.closing_new():
            assert broker.open_backend(before) is kept
            opened = broker.open_backend(inside)
        assert broker.open_backend(before) is kept, "one open before the block stays open"
        assert broker.open_backend(inside) is not opened, (
            "the one opened inside was closed and forgotten"
        )
        assert kept.store.get_job("nosuchjob") is None
    finally:
        broker.close_all()
