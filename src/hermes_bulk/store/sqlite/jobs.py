"""SqliteJobStore: the JobStore protocol (store/protocol.py) on one SqliteDatabase, one room
per concept, the same rooms as the Redis store (store/redis/):

- creation.py  begin a job, add its items, finish it, delete it
- reads.py     jobs and items read back (nothing written)
- events.py    a job's history
- job_state.py run, pause and resume moves, interruptions, settings, retries, the sample
- claims.py    an item to a worker under the job's limits, lease renewal
- settling.py  a claimed item completed, failed, released or taken back
- batches.py   provider batches
- workers.py   heartbeats and who holds what
"""

from __future__ import annotations

from ... import credentials
from .batches import SqliteBatches
from .claims import SqliteClaims
from .creation import SqliteCreation
from .database import SqliteDatabase
from .events import SqliteEvents
from .job_state import SqliteJobState
from .reads import SqliteReads
from .settling import SqliteSettling
from .workers import SqliteWorkers


class SqliteJobStore(
    SqliteCreation,
    SqliteReads,
    SqliteEvents,
    SqliteJobState,
    SqliteClaims,
    SqliteSettling,
    SqliteBatches,
    SqliteWorkers,
):
    """JobStore on SqliteDatabase (see store/protocol.py for each method's contract)."""

    def __init__(self, db: SqliteDatabase) -> None:
        self.db = db
        self._closed = False

    def now(self) -> float:
        return self.db.clock()

    def fingerprint_salt(self, create: bool = True) -> str | None:
        read = "SELECT value FROM store_meta WHERE name = 'fingerprint_salt'"
        rows = self.db.read(read)
        if rows or not create:
            return rows[0][0] if rows else None
        with self.db.write() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO store_meta VALUES ('fingerprint_salt', ?)",
                (credentials.new_salt_record(),),
            )
            return conn.execute(read).fetchone()[0]

    def close(self) -> None:
        if not self._closed:  # once per open: the database is shared with other users
            self._closed = True
            self.db.close()
