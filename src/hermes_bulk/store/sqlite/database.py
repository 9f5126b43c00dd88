"""One SQLite file per process: its per-thread connections, migrations and write transactions.

A process has one `SqliteDatabase` per file (`open_database`): closing any descriptor of a file
drops every POSIX lock the process holds on it, SQLite's included (DESIGN.md invariant 10). In
it each thread has its own connection (a shared connection behind a lock would serialise
readers too), closed once the thread has ended. The job store and the budget ledger both use it.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from ...errors import BackendUnavailable
from ...files import private_dir
from ...full_disk import disk_is_full
from ..records import reserved_cost
from .schema import MIGRATIONS

BUSY_TIMEOUT_MS = 30_000


class SqliteDatabase:
    """One SQLite file: per-thread connections, migrations, and the write-transaction helper.

    Made only by `open_database`, which keeps one per file per process (DESIGN.md invariant 10).
    """

    def __init__(
        self,
        path: Path,
        identity: tuple[int, int],
        *,
        migrations: list[tuple[str, str]],
        busy_timeout_ms: int,
        setting: str,
    ) -> None:
        self.path = path
        self.identity = identity  # (st_dev, st_ino): the registry's key
        self.clock: Callable[[], float] = time.time
        self.migrations = migrations
        self.busy_timeout_ms = busy_timeout_ms
        self.setting = setting
        # Other SQLite files living as long as this one (Huey's queue), with their (st_dev, st_ino).
        self.companions: list[tuple[Path, tuple[int, int]]] = []
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
            conn = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout_ms / 1000,
                isolation_level=None,
                check_same_thread=False,
            )
            conn.execute(f"PRAGMA busy_timeout={self.busy_timeout_ms}")
            conn.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode survives process crashes; only power loss can undo the last
            # commits.
            conn.execute("PRAGMA synchronous=NORMAL")
            # Claims under --max-cost reckon an item's reservation in money with the one rule
            # the Redis scripts copy (records.reserved_cost).
            conn.create_function("reserved_cost", 4, reserved_cost, deterministic=True)
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
        """One atomic operation: BEGIN IMMEDIATE takes the write lock up front (no upgrade
        deadlock)."""
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
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT PRIMARY KEY, applied_at "
                "REAL)"
            )
            done = {r[0] for r in conn.execute("SELECT name FROM schema_migrations")}
            for name, sql in self.migrations:
                if name not in done:
                    for statement in sql.split(";"):
                        if statement.strip():
                            conn.execute(statement)
                    conn.execute(
                        "INSERT INTO schema_migrations VALUES (?, ?)", (name, self.clock())
                    )

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


def open_database(
    path: Path,
    *,
    migrations: list[tuple[str, str]] | None = None,
    busy_timeout_ms: int = BUSY_TIMEOUT_MS,
    setting: str = "HERMES_BULK_BACKEND",
) -> SqliteDatabase:
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
                db = SqliteDatabase(
                    path,
                    identity,
                    migrations=migrations,
                    busy_timeout_ms=busy_timeout_ms,
                    setting=setting,
                )
                try:
                    db._migrate()
                except BaseException:
                    db._close_connections()
                    raise
                _databases[identity] = db
        except (OSError, sqlite3.Error) as exc:
            if (folder := not_a_folder(Path(path).parent)) is not None:
                raise BackendUnavailable(
                    f"Cannot open the SQLite database {path}: {folder}; point "
                    f"{setting} (or HERMES_BULK_HOME) at a folder."
                ) from None
            if disk_is_full(Path(path).parent):  # SQLite says only "disk I/O error" then
                raise BackendUnavailable(
                    f"Cannot open the SQLite database {path}: the disk is full at "
                    f"{Path(path).parent}; free some space there, then run the command again."
                ) from None
            raise BackendUnavailable(
                f"Cannot open the SQLite database {path} ({exc}); check the "
                f"path in {setting} and its permissions."
            ) from None
        if [name for name, _ in db.migrations] != [name for name, _ in migrations]:
            raise BackendUnavailable(
                f"The SQLite database {path} is already open in this process as "
                f"{db.path} for {db.setting}; give {setting} a file of its own."
            )
        db._users += 1
        return db


_SIDE_FILE_SUFFIXES = ("-wal", "-shm", "-journal")


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
        held = [(db.path, db.identity) for db in _databases.values()]
        held += [companion for db in _databases.values() for companion in db.companions]
    if (st.st_dev, st.st_ino) in {identity for _, identity in held}:
        return True  # the inodes SQLite opened: what a path shows now is compared with them
    # A side file's real path ends like one: by its own name, or behind a link in its place.
    # Anything else skips the real paths (a lstat per component, each time): every item's
    # source is read here once more (the change check) before its call.
    if not (str(path).endswith(_SIDE_FILE_SUFFIXES) or os.path.islink(path)):
        return False
    real = os.path.realpath(path)
    return any(
        real == os.path.realpath(file) + suffix
        for file, _ in held
        for suffix in _SIDE_FILE_SUFFIXES
    )


def sqlite_file_identity(path: Path) -> tuple[int, int]:
    """(st_dev, st_ino) of the regular file at path, creating it owner-only first if missing.

    Never opens an existing file: closing that descriptor would drop every lock this process
    holds on the file, SQLite's included. O_EXCL makes sure the one descriptor opened here is of
    a file that did not exist a moment ago, which no connection in this process can hold.
    """
    real = Path(os.path.realpath(path))  # a dangling link: the file is made where it points
    private_dir(real.parent)
    try:
        fd = os.open(
            real, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600
        )
    except FileExistsError:
        pass
    else:
        os.close(fd)
    st = os.stat(real)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(f"{real} is not a regular file")
    return st.st_dev, st.st_ino


def not_a_folder(folder: Path) -> str | None:
    """What is in the way when a database's folder (or one above it) is a file, FIFO or device."""
    for place in [folder, *folder.parents]:
        try:
            st = os.stat(place)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            kind = (
                "a FIFO (named pipe)"
                if stat.S_ISFIFO(st.st_mode)
                else "a device"
                if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                else "a file"
            )
            return f"{place} is {kind}, not a folder"
        return None
    return None
