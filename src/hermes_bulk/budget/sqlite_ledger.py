"""The embedded ledger: one SQLite file in WAL mode, shared by every Hermes profile on a machine.

Each admission is one `BEGIN IMMEDIATE` transaction (read the counts, decide, count, record),
so processes cannot both pass the same last free request. Admissions first take a turn on
`ledger.db.lock` (turns.py): under heavy contention SQLite's sleeping busy handler lets a writer
starve, a kernel lock wakes it at once. An admission waits at most ADMIT_TIMEOUT_S for its turn
and again for the write lock; a ledger locked longer than that fails the call open (the caller
decides), because a budget must never be the reason an agent stops answering.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

from ..store.sqlite.database import open_database
from .ledger import (
    KEEP_AFTER_WINDOW_S,
    NOT_SENT,
    Admission,
    CallRecord,
    LedgerEntry,
    LedgerUnavailable,
    WindowCounts,
    counter_updates,
    counters_taken_back,
    run_counter,
)
from .policy import Terms, counts_toward_total, decide
from .turns import FileTurns, TurnTimeout
from .windows import Window

#: How long an admission waits for its turn, then for SQLite's write lock, before the call fails
#: open. An admission takes about 0.1 ms; a second covers a turn holder that the OS descheduled
#: on a loaded machine (a spurious warning for the rest of the day is worse than a rare wait).
ADMIT_TIMEOUT_S = 1.0
ADMIT_BUSY_TIMEOUT_MS = 1000
#: Opening (and migrating) waits no longer than an admission: the first call of a process must
#: fail open as fast as any other (a longer wait here holds a cron run up while the ledger is
#: busy). A ledger that cannot be opened now is opened again by a later call (Budget.ledger),
#: after RETRY_AFTER_S.
OPEN_BUSY_TIMEOUT_MS = ADMIT_BUSY_TIMEOUT_MS

MIGRATIONS: list[tuple[str, str]] = []
migration = MIGRATIONS.append

migration(
    (
        "m001_ledger",
        """
CREATE TABLE requests (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    window_start INTEGER NOT NULL,
    profile TEXT NOT NULL,
    call_class TEXT NOT NULL,
    job_id TEXT NOT NULL,
    job_name TEXT NOT NULL,
    run_id TEXT NOT NULL,
    provider TEXT NOT NULL,
    model TEXT NOT NULL,
    api_mode TEXT NOT NULL,
    decision TEXT NOT NULL,
    counted INTEGER NOT NULL
);
CREATE INDEX requests_by_window ON requests (window_start, call_class);
CREATE TABLE counters (
    window_start INTEGER NOT NULL,
    window_end INTEGER NOT NULL,
    key TEXT NOT NULL,
    n INTEGER NOT NULL,
    PRIMARY KEY (window_start, key)
) WITHOUT ROWID;
CREATE TABLE runs (
    window_start INTEGER NOT NULL,
    counter TEXT NOT NULL,
    run_id TEXT NOT NULL,
    PRIMARY KEY (window_start, counter, run_id)
) WITHOUT ROWID;
CREATE TABLE jobs (
    window_start INTEGER NOT NULL,
    job_id TEXT NOT NULL,
    call_class TEXT NOT NULL,
    name TEXT NOT NULL,
    PRIMARY KEY (window_start, job_id)
) WITHOUT ROWID;
""",
    )
)

_ENTRY_COLUMNS = (
    "at, window_start, call_class, profile, job_id, job_name, run_id, provider, model, "
    "api_mode, decision, counted"
)


def _record(
    conn: sqlite3.Connection,
    at: float,
    window_start: int,
    call: CallRecord,
    decision: str,
    counted: bool,
) -> None:
    conn.execute(
        f"INSERT INTO requests ({_ENTRY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            at,
            window_start,
            call.call_class,
            call.profile,
            call.job_id,
            call.job_name,
            call.run_id,
            call.provider,
            call.model,
            call.api_mode,
            decision,
            int(counted),
        ),
    )


# One FileTurns (a lock-file descriptor and its thread) per ledger file per process, for the
# process's life: ledgers opened again (status, the bulk plugin's budget and gate) share it.
_turns: dict[tuple[tuple[int, int], str], FileTurns] = {}
_turns_lock = threading.Lock()


def _turns_for(identity: tuple[int, int], lock_path: Path) -> FileTurns:
    key = (identity, str(lock_path))  # the path too: a deleted file's inode may be reused
    with _turns_lock:
        turns = _turns.get(key)
        if turns is None:
            turns = _turns[key] = FileTurns(lock_path)
        return turns


class SqliteLedger:
    """RequestLedger on one SQLite file (see ledger.py for the contract)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.location = str(path)
        # The process's one database for this file, shared with any other ledger object on it
        # (the bulk plugin's budget and its gate each have one): invariant 10.
        self.db = open_database(
            path,
            migrations=MIGRATIONS,
            busy_timeout_ms=OPEN_BUSY_TIMEOUT_MS,
            setting="the cron-budget ledger setting",
        )
        self._closed = False
        # Connections made from now on wait briefly; the one that migrated is shortened too.
        self.db.busy_timeout_ms = ADMIT_BUSY_TIMEOUT_MS
        self.db.connection().execute(f"PRAGMA busy_timeout={ADMIT_BUSY_TIMEOUT_MS}")
        # Admissions take turns on a lock file first, so they rarely meet SQLite's busy handler.
        # Beside the real file, so every spelling of its path (a symlink) takes turns on one lock.
        real = Path(os.path.realpath(path))
        self.turns = _turns_for(self.db.identity, real.with_name(real.name + ".lock"))

    def admit(self, call: CallRecord, window: Window, terms: Terms) -> Admission:
        try:
            with self.turns.turn(ADMIT_TIMEOUT_S), self.db.write() as conn:
                return self._admit(conn, call, window, terms, self.db.clock())
        except TurnTimeout as exc:
            raise LedgerUnavailable(f"The cron-budget ledger is busy: {exc}.") from None
        except sqlite3.OperationalError as exc:  # locked past the busy timeout, disk I/O, …
            raise LedgerUnavailable(
                f"The cron-budget ledger {self.path} is not answering ({exc})."
            ) from None

    def _admit(
        self, conn: sqlite3.Connection, call: CallRecord, window: Window, terms: Terms, now: float
    ) -> Admission:
        start = window.start_s
        job_key = f"job:{call.job_id}:requests" if call.job_id else ""
        held_runs_key = f"job:{call.job_id}:held_runs" if call.job_id else ""
        have = dict(
            conn.execute(
                "SELECT key, n FROM counters WHERE window_start = ? AND key IN (?, ?, ?, ?)",
                (start, "calls", "total", job_key, held_runs_key),
            ).fetchall()
        )
        if "calls" not in have:
            self._prune(conn, now)  # the window's first call
        decision = decide(
            call.call_class,
            terms,
            window_total=have.get("total", 0),
            job_requests=have.get(job_key, 0),
        )
        counted = counts_toward_total(decision, terms)
        keys = counter_updates(call, decision, counted)
        run_key = run_counter(call, decision)
        new_run = (
            bool(run_key)
            and conn.execute(
                "INSERT OR IGNORE INTO runs VALUES (?, ?, ?)", (start, run_key, call.run_id)
            ).rowcount
            == 1
        )
        if new_run:
            keys.append(run_key)
        conn.executemany(
            "INSERT INTO counters VALUES (?, ?, ?, 1) ON CONFLICT (window_start, key) DO UPDATE "
            "SET n = n + 1",
            [(start, window.end_s, k) for k in keys],
        )
        if call.job_id:
            conn.execute(
                "INSERT INTO jobs VALUES (?, ?, ?, ?) ON CONFLICT (window_start, job_id) "
                "DO UPDATE SET name = excluded.name WHERE excluded.name != ''",
                (start, call.job_id, call.call_class, call.job_name),
            )
        _record(conn, now, start, call, decision, counted)
        return Admission(
            decision=decision,
            counted=counted,
            window_total=have.get("total", 0) + counted,
            job_requests=have.get(job_key, 0) + int(counted and bool(job_key)),
            job_held_runs=have.get(held_runs_key, 0) + int(new_run and run_key == held_runs_key),
        )

    def take_back(self, call: CallRecord, window: Window) -> None:
        try:
            with self.turns.turn(ADMIT_TIMEOUT_S), self.db.write() as conn:
                start = window.start_s
                conn.executemany(
                    "UPDATE counters SET n = n - 1 WHERE window_start = ? AND key = ? AND n > 0",
                    [(start, k) for k in counters_taken_back(call)],
                )
                conn.execute(
                    "INSERT INTO counters VALUES (?, ?, ?, 1) ON CONFLICT (window_start, key) "
                    "DO UPDATE SET n = n + 1",
                    (start, window.end_s, NOT_SENT),
                )
                _record(conn, self.db.clock(), start, call, NOT_SENT, False)
        except TurnTimeout as exc:
            raise LedgerUnavailable(f"The cron-budget ledger is busy: {exc}.") from None
        except sqlite3.OperationalError as exc:
            raise LedgerUnavailable(
                f"The cron-budget ledger {self.path} is not answering ({exc})."
            ) from None

    def _prune(self, conn: sqlite3.Connection, now: float) -> None:
        """The first call of a window drops what ended more than KEEP_AFTER_WINDOW_S ago."""
        cutoff = now - KEEP_AFTER_WINDOW_S
        old = [
            r[0]
            for r in conn.execute(
                "SELECT DISTINCT window_start FROM counters WHERE window_end < ?", (cutoff,)
            )
        ]
        for start in old:
            for table in ("counters", "runs", "jobs", "requests"):
                conn.execute(f"DELETE FROM {table} WHERE window_start = ?", (start,))

    def counts(self, window: Window) -> WindowCounts:
        try:
            counters = {
                k: n
                for k, n in self.db.read(
                    "SELECT key, n FROM counters WHERE window_start = ?", (window.start_s,)
                )
            }
            jobs = {
                r[0]: (r[1], r[2])
                for r in self.db.read(
                    "SELECT job_id, call_class, name FROM jobs WHERE window_start = ?",
                    (window.start_s,),
                )
            }
        except sqlite3.OperationalError as exc:
            raise LedgerUnavailable(
                f"The cron-budget ledger {self.path} is not answering ({exc})."
            ) from None
        return WindowCounts(window.start_s, counters, jobs)

    def entries(self, window: Window, limit: int = 1000) -> list[LedgerEntry]:
        rows = self.db.read(
            f"SELECT {_ENTRY_COLUMNS} FROM requests WHERE window_start = ? ORDER BY id LIMIT ?",
            (window.start_s, limit),
        )
        return [
            LedgerEntry(
                at=r[0],
                window_start_s=r[1],
                call=CallRecord(*r[2:10]),
                decision=r[10],
                counted=bool(r[11]),
            )
            for r in rows
        ]

    def close(self) -> None:
        if not self._closed:  # once per open: the database is shared with other users
            self._closed = True
            self.db.close()
