"""The embedded backend's store and limiter: one SQLite file in WAL mode.

Every state change is one `BEGIN IMMEDIATE` transaction through `SqliteDatabase.write()`, so
threads and processes on one machine see each operation whole. A process has one
`SqliteDatabase` per file (`open_database`), and in it each thread has its own connection (a
shared connection behind a lock would serialise readers too), closed once the thread has ended.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict
from pathlib import Path

from ..errors import BackendUnavailable
from ..files import private_dir
from ..words import count
from . import limits_math
from .limits_math import LimitState
from .protocol import (
    CLAIMED,
    COMPLETED,
    CREATING,
    FAILED,
    NOT_STARTED,
    PAUSE_TOKEN_LIMIT,
    PAUSED,
    PENDING,
    RUNNING,
    Claim,
    ClaimRefused,
    Event,
    ItemError,
    ItemRecord,
    JobRecord,
    JobSpec,
    NewItem,
    PauseState,
    Turn,
    WorkerInfo,
    spec_from_json,
)

BUSY_TIMEOUT_MS = 30_000

# Schema migrations, applied in order and recorded by name (the way simonw/llm does it).
MIGRATIONS: list[tuple[str, str]] = []
migration = MIGRATIONS.append

migration(("m001_initial", """
CREATE TABLE jobs (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    pause_reason TEXT,
    max_tokens INTEGER,
    total INTEGER NOT NULL DEFAULT 0,
    pending INTEGER NOT NULL DEFAULT 0,
    running INTEGER NOT NULL DEFAULT 0,
    completed INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    tokens_in INTEGER NOT NULL DEFAULT 0,
    tokens_out INTEGER NOT NULL DEFAULT 0,
    tokens_charged INTEGER NOT NULL DEFAULT 0,
    tokens_reserved INTEGER NOT NULL DEFAULT 0,
    estimated_tokens INTEGER NOT NULL DEFAULT 0,
    skipped INTEGER NOT NULL DEFAULT 0,
    last_claim_at REAL,
    run_at REAL
);
CREATE INDEX jobs_by_created ON jobs (created_at);
CREATE TABLE items (
    job_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    name TEXT NOT NULL,
    content_hash TEXT NOT NULL,
    origin TEXT NOT NULL,
    byte_offset INTEGER NOT NULL,
    stat_sig TEXT NOT NULL,
    estimate INTEGER NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending',
    attempts INTEGER NOT NULL DEFAULT 0,
    rate_limit_waits INTEGER NOT NULL DEFAULT 0,
    owner TEXT,
    lease_until REAL,
    reserved INTEGER NOT NULL DEFAULT 0,
    tokens_in INTEGER NOT NULL DEFAULT 0,
    tokens_out INTEGER NOT NULL DEFAULT 0,
    error_type TEXT,
    http_status INTEGER,
    error_message TEXT,
    provider TEXT,
    model TEXT,
    PRIMARY KEY (job_id, idx)
);
CREATE INDEX items_pending ON items (job_id, idx) WHERE status = 'pending';
CREATE INDEX items_leased ON items (lease_until) WHERE status = 'running';
CREATE INDEX items_owned ON items (owner) WHERE status = 'running';
CREATE TABLE contents (
    job_id TEXT NOT NULL,
    hash TEXT NOT NULL,
    text TEXT NOT NULL,
    PRIMARY KEY (job_id, hash)
);
CREATE TABLE results (
    job_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    text TEXT NOT NULL,
    PRIMARY KEY (job_id, idx)
);
CREATE TABLE events (
    id INTEGER PRIMARY KEY,
    job_id TEXT NOT NULL,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    item_idx INTEGER,
    message TEXT NOT NULL,
    error_type TEXT,
    http_status INTEGER
);
CREATE INDEX events_by_job ON events (job_id, id);
CREATE TABLE workers (
    id TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    started_at REAL NOT NULL,
    heartbeat_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    threads INTEGER NOT NULL
);
CREATE TABLE limits (
    key TEXT PRIMARY KEY,
    request_tat REAL NOT NULL DEFAULT 0,
    token_tat REAL NOT NULL DEFAULT 0,
    pause_until REAL NOT NULL DEFAULT 0,
    backoff_step INTEGER NOT NULL DEFAULT 0,
    auto_interval REAL NOT NULL DEFAULT 0,
    window_start REAL NOT NULL DEFAULT 0,
    window_count INTEGER NOT NULL DEFAULT 0,
    previous_count INTEGER NOT NULL DEFAULT 0
);
"""))

# Adaptive pacing that relaxes with time (auto_since) and slows down once per generation of
# requests (decreases). Databases made earlier have limits with or without auto_since (one
# version of main added it to m001), so the table is rebuilt rather than altered: its state is
# short-lived (waits, pacing, a two-second rate window).
migration(("m002_limits_decrease_epochs", """
DROP TABLE limits;
CREATE TABLE limits (
    key TEXT PRIMARY KEY,
    request_tat REAL NOT NULL DEFAULT 0,
    token_tat REAL NOT NULL DEFAULT 0,
    pause_until REAL NOT NULL DEFAULT 0,
    backoff_step INTEGER NOT NULL DEFAULT 0,
    auto_interval REAL NOT NULL DEFAULT 0,
    auto_since REAL NOT NULL DEFAULT 0,
    window_start REAL NOT NULL DEFAULT 0,
    window_count INTEGER NOT NULL DEFAULT 0,
    previous_count INTEGER NOT NULL DEFAULT 0,
    decreases INTEGER NOT NULL DEFAULT 0
);
"""))


class SqliteDatabase:
    """One SQLite file: per-thread connections, migrations, and the write-transaction helper.

    Made only by `open_database`, which keeps one per file per process (DESIGN.md invariant 10).
    """

    def __init__(self, path: Path, identity: tuple[int, int], *, migrations: list[tuple[str, str]],
                 busy_timeout_ms: int, setting: str) -> None:
        self.path = path
        self.identity = identity  # (st_dev, st_ino): the registry's key
        self.clock: Callable[[], float] = time.time
        self.migrations = migrations
        self.busy_timeout_ms = busy_timeout_ms
        self.setting = setting
        self.companions: list[Path] = []  # other SQLite files living as long as this one (Huey's queue)
        self._users = 0  # open_database calls not yet matched by close()
        self._local = threading.local()
        # Each thread's connection, kept to close it once its thread has ended (a gateway runs
        # every command on a new thread). Connections a forked child inherited stay here too.
        self._connections: dict[threading.Thread, tuple[int, sqlite3.Connection]] = {}
        self._inherited: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        # Threads of this process take turns at the write lock here, in order, instead of in
        # SQLite's busy handler, which sleeps 1, 2, 5 … 100 ms between tries. Other processes
        # still meet at BEGIN IMMEDIATE (busy_timeout).
        self._write_turn = threading.RLock()

    def connection(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None or getattr(self._local, "pid", None) != os.getpid():
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout_ms / 1000,
                                   isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout={self.busy_timeout_ms}")
            conn.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode survives process crashes; only power loss can undo the last commits.
            conn.execute("PRAGMA synchronous=NORMAL")
            with self._lock:
                self._close_connections_of_ended_threads()
                self._connections[threading.current_thread()] = (os.getpid(), conn)
            self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    def _close_connections_of_ended_threads(self) -> None:
        """Close the connections whose threads have ended (only their own thread ever used them).

        In a forked child, the parent's connections are kept, never closed or collected: SQLite
        must not tear down (checkpoint, unlock, delete the WAL of) a connection made by another
        process.
        """
        pid = os.getpid()
        for thread, (owner_pid, conn) in list(self._connections.items()):
            if owner_pid != pid:
                self._inherited.append(conn)
                del self._connections[thread]
            elif not thread.is_alive():
                with suppress(sqlite3.Error):
                    conn.close()
                del self._connections[thread]

    def live_connections(self) -> int:
        """This process's open connections (one per thread that used the file and may still)."""
        with self._lock:
            return sum(1 for owner_pid, _ in self._connections.values() if owner_pid == os.getpid())

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One atomic operation: BEGIN IMMEDIATE takes the write lock up front (no upgrade deadlock)."""
        conn = self.connection()
        with self._write_turn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def read(self, sql: str, params: tuple = ()) -> list[sqlite3.Row]:
        cur = self.connection().execute(sql, params)
        return cur.fetchall()

    def _migrate(self) -> None:
        with self.write() as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT PRIMARY KEY, applied_at REAL)")
            done = {r[0] for r in conn.execute("SELECT name FROM schema_migrations")}
            for name, sql in self.migrations:
                if name not in done:
                    for statement in sql.split(";"):
                        if statement.strip():
                            conn.execute(statement)
                    conn.execute("INSERT INTO schema_migrations VALUES (?, ?)", (name, self.clock()))

    def schema_version(self) -> list[str]:
        return [r[0] for r in self.read("SELECT name FROM schema_migrations ORDER BY name")]

    def close(self) -> None:
        """One user is done with the file; the last one closes this process's connections.

        Closing through SQLite is safe for other connections to the file: SQLite keeps a
        descriptor whose file is still locked by another connection until that one closes too.
        """
        with _databases_lock:
            self._users -= 1
            if self._users > 0:
                return
            if _databases.get(self.identity) is self:
                del _databases[self.identity]
        self._close_connections()

    def _close_connections(self) -> None:
        with self._lock:
            for owner_pid, conn in self._connections.values():
                if owner_pid == os.getpid():
                    with suppress(sqlite3.Error):
                        conn.close()
                else:
                    self._inherited.append(conn)
            self._connections.clear()
        self._local = threading.local()

    def _after_fork_in_child(self) -> None:
        # A lock another thread of the parent held at the fork would never be released here.
        self._lock, self._write_turn = threading.Lock(), threading.RLock()


# Every SqliteDatabase open in this process, by file (st_dev, st_ino). Reference-counted rather
# than kept for the process's life: a user that closes (a test's temporary directory, the budget
# moving its ledger) releases the descriptors once no other user in the process needs them.
_databases: dict[tuple[int, int], SqliteDatabase] = {}
_databases_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _databases_lock
    _databases_lock = threading.Lock()
    for db in _databases.values():
        db._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


def open_database(path: Path, *, migrations: list[tuple[str, str]] | None = None,
                  busy_timeout_ms: int = BUSY_TIMEOUT_MS, setting: str = "HERMES_BULK_BACKEND") -> SqliteDatabase:
    """This process's one open database for the file at path (made owner-only if missing), migrated.

    A symlink, hard link or another spelling of the path gives the same object. Every call is
    matched by one `close()`. `migrations` default to the job store's; the budget ledger brings
    its own (budget/sqlite_ledger.py), and one file cannot be both.
    """
    migrations = MIGRATIONS if migrations is None else migrations
    with _databases_lock:
        try:
            identity = sqlite_file_identity(path)
            db = _databases.get(identity)
            if db is None:
                db = SqliteDatabase(path, identity, migrations=migrations, busy_timeout_ms=busy_timeout_ms,
                                    setting=setting)
                try:
                    db._migrate()
                except BaseException:
                    db._close_connections()
                    raise
                _databases[identity] = db
        except (OSError, sqlite3.Error) as exc:
            raise BackendUnavailable(f"Cannot open the SQLite database {path} ({exc}); check the "
                                     f"path in {setting} and its permissions.") from None
        if [name for name, _ in db.migrations] != [name for name, _ in migrations]:
            raise BackendUnavailable(f"The SQLite database {path} is already open in this process as "
                                     f"{db.path} for {db.setting}; give {setting} a file of its own.")
        db._users += 1
        return db


def is_open_sqlite_file(path: Path) -> bool:
    """Whether path is one of the SQLite files this process has open, or their -wal/-shm/-journal.

    Reading such a file (a source folder holding the data directory, a --schema pointing at
    bulk.db) would open and close a descriptor on it and drop SQLite's locks: invariant 10.
    Files are matched by device and inode (a hard link), the side files by their real path.
    """
    try:
        st = os.stat(path)
    except OSError:
        return False
    with _databases_lock:
        files = [f for db in _databases.values() for f in (db.path, *db.companions)]
    real = os.path.realpath(path)
    for file in files:
        with suppress(OSError):
            held = os.stat(file)
            if (held.st_dev, held.st_ino) == (st.st_dev, st.st_ino):
                return True
        if real in {os.path.realpath(file) + suffix for suffix in ("-wal", "-shm", "-journal")}:
            return True
    return False


def sqlite_file_identity(path: Path) -> tuple[int, int]:
    """(st_dev, st_ino) of the regular file at path, creating it owner-only first if missing.

    Never opens an existing file: closing that descriptor would drop every lock this process
    holds on the file, SQLite's included. O_EXCL makes sure the one descriptor opened here is of
    a file that did not exist a moment ago, which no connection in this process can hold.
    """
    real = Path(os.path.realpath(path))  # a dangling link: the file is made where it points
    private_dir(real.parent)
    try:
        fd = os.open(real, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        pass
    else:
        os.close(fd)
    st = os.stat(real)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(f"{real} is not a regular file")
    return st.st_dev, st.st_ino


_JOB_COLUMNS = ("id, created_at, spec, state, pause_reason, max_tokens, total, pending, running, "
                "completed, failed, tokens_in, tokens_out, tokens_charged, tokens_reserved, "
                "estimated_tokens, skipped, last_claim_at, run_at")


def _job_from_row(row: tuple) -> JobRecord:
    spec = spec_from_json(row[2])
    if spec.max_tokens != row[5]:
        spec = JobSpec(**{**asdict(spec), "max_tokens": row[5]})
    return JobRecord(spec=spec, created_at=row[1], state=row[3], pause_reason=row[4],
                     total=row[6], pending=row[7], running=row[8], completed=row[9], failed=row[10],
                     tokens_in=row[11], tokens_out=row[12], tokens_charged=row[13],
                     tokens_reserved=row[14], estimated_tokens=row[15], skipped=row[16],
                     last_claim_at=row[17], run_at=row[18])


class SqliteJobStore:
    """JobStore on SqliteDatabase (see store/protocol.py for each method's contract)."""

    def __init__(self, db: SqliteDatabase) -> None:
        self.db = db
        self._closed = False

    def now(self) -> float:
        return self.db.clock()

    def close(self) -> None:
        if not self._closed:  # once per open: the database is shared with other users
            self._closed = True
            self.db.close()

    # Creating ------------------------------------------------------------------------------
    def begin_job(self, spec: JobSpec) -> None:
        with self.db.write() as conn:
            conn.execute("INSERT INTO jobs (id, created_at, spec, state, max_tokens) VALUES (?, ?, ?, ?, ?)",
                         (spec.job_id, self.now(), json.dumps(asdict(spec)), CREATING, spec.max_tokens))

    def add_items(self, job_id: str, items: Iterable[NewItem]) -> None:
        items = list(items)
        with self.db.write() as conn:
            conn.executemany("INSERT OR IGNORE INTO contents (job_id, hash, text) VALUES (?, ?, ?)",
                             [(job_id, it.content_hash, it.content) for it in items])
            conn.executemany(
                "INSERT INTO items (job_id, idx, name, content_hash, origin, byte_offset, stat_sig, estimate)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(job_id, it.index, it.name, it.content_hash, it.origin, it.offset, it.stat_sig,
                  it.estimated_tokens) for it in items])

    def finish_job(self, job_id: str) -> JobRecord:
        with self.db.write() as conn:
            total, estimated = conn.execute(
                "SELECT count(*), coalesce(sum(estimate), 0) FROM items WHERE job_id = ?", (job_id,)).fetchone()
            (skipped,) = conn.execute(
                "SELECT count(*) FROM events WHERE job_id = ? AND kind = 'skipped'", (job_id,)).fetchone()
            conn.execute("UPDATE jobs SET state = ?, total = ?, pending = ?, estimated_tokens = ?, skipped = ?"
                         " WHERE id = ? AND state = ?",
                         (NOT_STARTED, total, total, estimated, skipped, job_id, CREATING))
        job = self.get_job(job_id)
        assert job is not None
        return job

    def delete_job(self, job_id: str) -> bool:
        with self.db.write() as conn:
            for table, column in (("items", "job_id"), ("contents", "job_id"), ("results", "job_id"),
                                  ("events", "job_id")):
                conn.execute(f"DELETE FROM {table} WHERE {column} = ?", (job_id,))
            return conn.execute("DELETE FROM jobs WHERE id = ?", (job_id,)).rowcount > 0

    # Reading -------------------------------------------------------------------------------
    def get_job(self, job_id: str) -> JobRecord | None:
        rows = self.db.read(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id = ? AND state != ?", (job_id, CREATING))
        return _job_from_row(rows[0]) if rows else None

    def find_job_ids(self, prefix: str) -> list[str]:
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = self.db.read("SELECT id FROM jobs WHERE id LIKE ? ESCAPE '\\' AND state != ? LIMIT 10",
                            (escaped + "%", CREATING))
        return [r[0] for r in rows]

    def list_jobs(self, limit: int = 20) -> list[JobRecord]:
        rows = self.db.read(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE state != ? ORDER BY created_at DESC LIMIT ?",
                            (CREATING, limit))
        return [_job_from_row(r) for r in rows]

    def active_job_ids(self) -> list[str]:
        return [r[0] for r in self.db.read("SELECT id FROM jobs WHERE state = ?", (RUNNING,))]

    def iter_items(self, job_id: str, batch: int = 1000) -> Iterator[ItemRecord]:
        last = -1
        while True:
            rows = self.db.read(
                "SELECT i.idx, i.name, i.status, r.text, i.error_type, i.http_status, i.error_message,"
                " i.tokens_in, i.tokens_out, i.attempts, i.provider, i.model"
                " FROM items i LEFT JOIN results r ON r.job_id = i.job_id AND r.idx = i.idx"
                " WHERE i.job_id = ? AND i.idx > ? ORDER BY i.idx LIMIT ?", (job_id, last, batch))
            for r in rows:
                yield ItemRecord(*r)
            if len(rows) < batch:
                return
            last = rows[-1][0]

    def list_events(self, job_id: str, limit: int = 100) -> list[Event]:
        rows = self.db.read(
            "SELECT kind, message, item_idx, error_type, http_status, at FROM events"
            " WHERE job_id = ? ORDER BY id DESC LIMIT ?", (job_id, limit))
        return [Event(*r) for r in reversed(rows)]

    # Job state -----------------------------------------------------------------------------
    def set_state(self, job_id, state, *, from_states, pause_reason=None, max_tokens=None, event=None):
        from_states = tuple(from_states)
        marks = ",".join("?" * len(from_states))
        with self.db.write() as conn:
            sets, params = "state = ?, pause_reason = ?", [state, pause_reason]
            if max_tokens is not None:
                sets += ", max_tokens = ?"
                params.append(max_tokens)
            if state == RUNNING:
                sets += ", run_at = ?"
                params.append(self.now())
            changed = conn.execute(f"UPDATE jobs SET {sets} WHERE id = ? AND state IN ({marks})",
                                   (*params, job_id, *from_states)).rowcount
            if not changed:
                return None
            if event is not None:
                self._insert_events(conn, job_id, [event])
        return self.get_job(job_id)

    def retry_failed(self, job_id: str) -> int:
        with self.db.write() as conn:
            n = conn.execute(
                "UPDATE items SET status = ?, attempts = 0, rate_limit_waits = 0, error_type = NULL,"
                " http_status = NULL, error_message = NULL WHERE job_id = ? AND status = ?",
                (PENDING, job_id, FAILED)).rowcount
            conn.execute("UPDATE jobs SET failed = failed - ?, pending = pending + ? WHERE id = ?", (n, n, job_id))
            return n

    # Items ---------------------------------------------------------------------------------
    def claim_item(self, job_id, index_hint, worker_id, *, lease_s, max_running):
        now = self.now()
        with self.db.write() as conn:
            job_row = conn.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if job_row is None:
                return ClaimRefused("no_job")
            job = _job_from_row(job_row)
            if job.state != RUNNING:
                return ClaimRefused("not_running")
            if job.running >= min(job.spec.concurrency, max_running):
                return ClaimRefused("at_capacity")
            # One statement takes the hint, else the lowest pending index, if its estimate fits
            # under --max-tokens (fewer statements: less time holding the write lock).
            limit = job.spec.max_tokens
            used = job.tokens_charged + job.tokens_reserved
            row = conn.execute(
                "UPDATE items SET status = ?, owner = ?, lease_until = ?, reserved = estimate"
                " WHERE job_id = ? AND status = 'pending' AND idx = coalesce("
                "(SELECT idx FROM items WHERE job_id = ? AND status = 'pending' AND idx = ?),"
                " (SELECT idx FROM items WHERE job_id = ? AND status = 'pending' ORDER BY idx LIMIT 1))"
                " AND (? IS NULL OR ? + estimate <= ?)"
                " RETURNING idx, name, content_hash, origin, byte_offset, stat_sig, estimate, attempts,"
                " rate_limit_waits",
                (CLAIMED, worker_id, now + lease_s, job_id, job_id, index_hint, job_id, limit, used, limit)).fetchone()
            if row is None:
                return self._refuse_claim(conn, job, index_hint)
            idx, estimate = row[0], row[6]
            conn.execute("UPDATE jobs SET pending = pending - 1, running = running + 1,"
                         " tokens_reserved = tokens_reserved + ?, last_claim_at = ? WHERE id = ?",
                         (estimate, now, job_id))
        # Contents never change once added, so they are read after the write lock is released.
        contents = self.db.read("SELECT text FROM contents WHERE job_id = ? AND hash = ?", (job_id, row[2]))
        if not contents:
            return ClaimRefused("no_job")  # deleted in the meantime
        content = contents[0][0]
        return Claim(job=job, index=idx, name=row[1], content=content, content_hash=row[2], origin=row[3],
                     offset=row[4], stat_sig=row[5], attempts=row[7], rate_limit_waits=row[8])

    def _refuse_claim(self, conn, job: JobRecord, index_hint: int) -> ClaimRefused:
        """No item was claimed: none is pending, or the next one does not fit under --max-tokens
        beside what is charged and reserved. It waits while reservations are in flight (they
        may settle for less); the job pauses, in the same transaction, only when it would not
        fit beside what is charged alone."""
        select = "SELECT idx, estimate FROM items WHERE job_id = ? AND status = 'pending'"
        row = conn.execute(select + " AND idx = ?", (job.job_id, index_hint)).fetchone()
        row = row or conn.execute(select + " ORDER BY idx LIMIT 1", (job.job_id,)).fetchone()
        if row is None:
            return ClaimRefused("no_pending")
        idx, estimate = row
        if job.spec.max_tokens is None or job.tokens_charged + estimate <= job.spec.max_tokens:
            return ClaimRefused("tokens_in_flight")
        conn.execute("UPDATE jobs SET state = ?, pause_reason = ? WHERE id = ?", (PAUSED, PAUSE_TOKEN_LIMIT, job.job_id))
        self._insert_events(conn, job.job_id, [Event(
            "paused", f"token limit reached: {job.tokens_charged} charged + {estimate} for item {idx + 1}"
            f" would exceed --max-tokens {job.spec.max_tokens}", idx)])
        return ClaimRefused("token_limit")

    def next_item_estimate(self, job_id: str) -> int | None:
        rows = self.db.read("SELECT estimate FROM items WHERE job_id = ? AND status = 'pending'"
                            " ORDER BY idx LIMIT 1", (job_id,))
        return rows[0][0] if rows else None

    def renew_leases(self, worker_id, items, *, lease_s):
        items = list(items)
        if not items:
            return 0
        until = self.now() + lease_s
        with self.db.write() as conn:
            return sum(conn.execute("UPDATE items SET lease_until = ? WHERE job_id = ? AND idx = ? AND owner = ?"
                                    " AND status = ?", (until, job_id, idx, worker_id, CLAIMED)).rowcount
                       for job_id, idx in items)

    def _finish_owned(self, conn, job_id, index, worker_id, status, extra_sets="", extra=()):
        """Move the owner's running item to status; returns its reservation, or None if not owner.

        An item's `reserved` is the estimate its claim reserved; it counts only while the item
        runs, so it is left as it is here and RETURNING can give it back in one statement.
        """
        row = conn.execute(f"UPDATE items SET status = ?, owner = NULL, lease_until = NULL{extra_sets}"
                           " WHERE job_id = ? AND idx = ? AND owner = ? AND status = ? RETURNING reserved",
                           (status, *extra, job_id, index, worker_id, CLAIMED)).fetchone()
        return None if row is None else row[0]

    def complete_item(self, job_id, index, worker_id, result, usage, *, provider=None, model=None):
        with self.db.write() as conn:
            tokens_in, tokens_out = usage.tokens_in or 0, usage.tokens_out or 0
            reserved = self._finish_owned(
                conn, job_id, index, worker_id, COMPLETED,
                ", tokens_in = ?, tokens_out = ?, provider = ?, model = ?, rate_limit_waits = 0",
                (tokens_in, tokens_out, provider or None, model or None))  # "" is none, as on Redis
            if reserved is None:
                return False
            charged = tokens_in + tokens_out if usage.reported else reserved
            conn.execute("INSERT INTO results (job_id, idx, text) VALUES (?, ?, ?)", (job_id, index, result))
            conn.execute("UPDATE jobs SET running = running - 1, completed = completed + 1,"
                         " tokens_reserved = tokens_reserved - ?, tokens_charged = tokens_charged + ?,"
                         " tokens_in = tokens_in + ?, tokens_out = tokens_out + ? WHERE id = ?",
                         (reserved, charged, tokens_in, tokens_out, job_id))
            return True

    def fail_item(self, job_id, index, worker_id, error: ItemError):
        with self.db.write() as conn:
            reserved = self._finish_owned(conn, job_id, index, worker_id, FAILED,
                                          ", error_type = ?, http_status = ?, error_message = ?",
                                          (error.error_type, error.http_status, error.message))
            if reserved is None:
                return False
            conn.execute("UPDATE jobs SET running = running - 1, failed = failed + 1,"
                         " tokens_reserved = tokens_reserved - ? WHERE id = ?", (reserved, job_id))
            self._insert_events(conn, job_id, [Event("item_failed", error.message, index, error.error_type,
                                                     error.http_status)])
            return True

    def release_item(self, job_id, index, worker_id):
        with self.db.write() as conn:
            reserved = self._finish_owned(conn, job_id, index, worker_id, PENDING)
            if reserved is None:
                return False
            self._count_released(conn, {job_id: (1, reserved)})
            return True

    def record_attempt(self, job_id, index, worker_id, error: ItemError, *, rate_limited):
        column, other = ("rate_limit_waits", "attempts") if rate_limited else ("attempts", "rate_limit_waits")
        reset = "" if rate_limited else ", rate_limit_waits = 0"
        with self.db.write() as conn:
            row = conn.execute(f"UPDATE items SET {column} = {column} + 1{reset}"
                               " WHERE job_id = ? AND idx = ? AND owner = ? AND status = ? RETURNING " + column,
                               (job_id, index, worker_id, CLAIMED)).fetchone()
            if row is None:
                return -1
            kind = "rate_limited" if rate_limited else "attempt_failed"
            self._insert_events(conn, job_id, [Event(kind, error.message, index, error.error_type, error.http_status)])
            return row[0]

    def release_expired_leases(self) -> dict[str, int]:
        return self._release("status = ? AND lease_until < ?", (CLAIMED, self.now()))

    def release_worker_items(self, worker_id: str) -> dict[str, int]:
        return self._release("status = ? AND owner = ?", (CLAIMED, worker_id))

    def item_owners(self) -> dict[str, int]:
        rows = self.db.read("SELECT owner, count(*) FROM items WHERE status = ? GROUP BY owner", (CLAIMED,))
        return dict(rows)

    def _release(self, where: str, params: tuple) -> dict[str, int]:
        with self.db.write() as conn:
            # `reserved` is left as it is (see _finish_owned), so RETURNING gives each reservation.
            rows = conn.execute(f"UPDATE items SET status = 'pending', owner = NULL, lease_until = NULL"
                                f" WHERE {where} RETURNING job_id, reserved", params).fetchall()
            per_job: dict[str, tuple[int, int]] = {}
            for job_id, reserved in rows:
                n, r = per_job.get(job_id, (0, 0))
                per_job[job_id] = (n + 1, r + reserved)
            self._count_released(conn, per_job)
            for job_id, (n, _) in per_job.items():
                self._insert_events(conn, job_id, [Event("recovered", f"{count(n, 'interrupted item')} returned to the queue")])
        return {job_id: n for job_id, (n, _) in per_job.items()}

    @staticmethod
    def _count_released(conn, per_job: dict[str, tuple[int, int]]) -> None:
        for job_id, (n, reserved) in per_job.items():
            conn.execute("UPDATE jobs SET running = running - ?, pending = pending + ?,"
                         " tokens_reserved = tokens_reserved - ? WHERE id = ?", (n, n, reserved, job_id))

    def add_events(self, job_id: str, events: Iterable[Event]) -> None:
        with self.db.write() as conn:
            self._insert_events(conn, job_id, events)

    def _insert_events(self, conn, job_id: str, events: Iterable[Event]) -> None:
        now = self.now()
        conn.executemany(
            "INSERT INTO events (job_id, at, kind, item_idx, message, error_type, http_status) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(job_id, e.at or now, e.kind, e.item_index, e.message, e.error_type, e.http_status) for e in events])

    # Workers -------------------------------------------------------------------------------
    def heartbeat_worker(self, info: WorkerInfo, *, ttl_s: float) -> None:
        now = self.now()
        with self.db.write() as conn:
            conn.execute("INSERT INTO workers (id, host, pid, started_at, heartbeat_at, expires_at, threads)"
                         " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET"
                         " heartbeat_at = excluded.heartbeat_at, expires_at = excluded.expires_at,"
                         " threads = excluded.threads",
                         (info.worker_id, info.host, info.pid, info.started_at, now, now + ttl_s, info.threads))
            conn.execute("DELETE FROM workers WHERE expires_at < ?", (now - 3600,))

    def remove_worker(self, worker_id: str) -> None:
        with self.db.write() as conn:
            conn.execute("DELETE FROM workers WHERE id = ?", (worker_id,))

    def live_workers(self) -> list[WorkerInfo]:
        rows = self.db.read("SELECT id, host, pid, started_at, heartbeat_at, threads FROM workers"
                            " WHERE expires_at >= ? ORDER BY started_at", (self.now(),))
        held: dict[str, list[tuple[str, int]]] = {}
        for owner, job_id, idx in self.db.read(
                "SELECT owner, job_id, idx FROM items WHERE status = ? ORDER BY job_id, idx", (CLAIMED,)):
            held.setdefault(owner, []).append((job_id, idx))
        return [WorkerInfo(*r, holding=held.get(r[0], [])) for r in rows]


class SqliteLimits:
    """SharedLimits on SqliteDatabase: the shared 429 wait and pacing per provider key.

    The pacing arithmetic lives in `limits_math`, shared in spirit with the Redis Lua scripts.
    """

    #: Requests granted on an unpaced key are added to its shared count in batches, at most this
    #: often per process, instead of one write transaction each (that write was one of three on
    #: every item's path). observed_rate reads the count over about a second, so it lags by at
    #: most this much; a 429 adds what is pending first.
    COUNT_EVERY_S = 0.1

    def __init__(self, db: SqliteDatabase) -> None:
        self.db = db
        self._uncounted: dict[str, int] = {}
        self._counted_at: dict[str, float] = {}
        self._count_lock = threading.Lock()
        # Per key: this process's last acquire found no backoff step, and it has not seen a 429
        # since, so a success has nothing to clear (clear_backoff skips its read). A 429 elsewhere in between is cleared by the next success after its wait.
        self._clean: dict[str, bool] = {}

    def _take_uncounted(self, key: str, now_s: float, *, plus: int = 0, force: bool = False) -> int:
        """Requests granted here and not yet counted (plus `plus`), if it is time to count them."""
        with self._count_lock:
            n = self._uncounted.get(key, 0) + plus
            if not force and now_s - self._counted_at.get(key, 0.0) < self.COUNT_EVERY_S:
                self._uncounted[key] = n
                return 0
            self._uncounted[key], self._counted_at[key] = 0, now_s
            return n

    def _row(self, conn, key: str) -> LimitState:
        row = conn.execute(f"SELECT {', '.join(LimitState.COLUMNS)} FROM limits WHERE key = ?", (key,)).fetchone()
        return LimitState(*row) if row else LimitState()

    def _save(self, conn, key: str, state: LimitState) -> None:
        cols = ", ".join(LimitState.COLUMNS)
        marks = ", ".join("?" * len(LimitState.COLUMNS))
        updates = ", ".join(f"{c} = excluded.{c}" for c in LimitState.COLUMNS)
        conn.execute(f"INSERT INTO limits (key, {cols}) VALUES (?, {marks}) ON CONFLICT (key) DO UPDATE SET {updates}",
                     (key, *state.values()))

    def acquire(self, key: str, *, rpm: int | None, tpm: int | None, tokens: int) -> Turn:
        now_s = self.db.clock()
        if not rpm and not tpm:
            # Unpaced: a read (no write lock) says whether the key is waiting or adaptively paced;
            # when it is neither, the grant only needs counting, which is batched.
            rows = self.db.read("SELECT pause_until, auto_interval, auto_since, backoff_step, decreases"
                                " FROM limits WHERE key = ?", (key,))
            seen = LimitState(pause_until_s=rows[0][0], auto_interval_s=rows[0][1], auto_since_s=rows[0][2],
                              backoff_step=rows[0][3], decreases=rows[0][4]) if rows else LimitState()
            self._clean[key] = limits_math.clean(seen)
            if limits_math.unpaced(seen, now_s, rpm=rpm, tpm=tpm):
                n = self._take_uncounted(key, now_s, plus=1)
                if n:
                    with self.db.write() as conn:
                        state = self._row(conn, key)
                        limits_math.count(state, now_s, n)
                        self._save(conn, key, state)
                return Turn(0.0, seen.decreases)
        with self.db.write() as conn:
            state = self._row(conn, key)
            self._clean[key] = limits_math.clean(state)
            wait_s = limits_math.acquire(state, now_s, rpm=rpm, tpm=tpm, tokens=tokens)
            if wait_s == 0:
                self._save(conn, key, state)
            return Turn(wait_s, state.decreases)

    def pause(self, key: str, *, seconds: float | None, base_s: float, cap_s: float,
              epoch: int) -> float:
        now_s = self.db.clock()
        self._clean[key] = False
        with self.db.write() as conn:
            state = self._row(conn, key)
            uncounted = self._take_uncounted(key, now_s, force=True)
            if uncounted:  # the rate seen before this 429 includes them
                limits_math.count(state, now_s, uncounted)
            limits_math.rate_limited(state, now_s, retry_after_s=seconds, base_s=base_s, cap_s=cap_s, epoch=epoch)
            self._save(conn, key, state)
            return state.pause_until_s

    def clear_backoff(self, key: str) -> None:
        if self._clean.get(key):
            return
        # Read first: most successes have nothing to change, and a read takes no write lock.
        rows = self.db.read("SELECT backoff_step FROM limits WHERE key = ?", (key,))
        if rows and rows[0][0]:
            with self.db.write() as conn:
                state = self._row(conn, key)
                limits_math.succeeded(state)
                self._save(conn, key, state)

    def pause_state(self, key: str) -> PauseState | None:
        rows = self.db.read("SELECT pause_until, backoff_step FROM limits WHERE key = ?", (key,))
        if rows and rows[0][0] > self.db.clock():
            return PauseState(until=rows[0][0], backoff_step=rows[0][1])
        return None


