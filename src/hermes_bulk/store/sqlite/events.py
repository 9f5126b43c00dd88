"""A job's events on SQLite: appended in the transaction of the change they record, or alone,
and read newest last (the JobStore protocol, store/protocol.py; mixed into SqliteJobStore)."""

from __future__ import annotations

from collections.abc import Iterable

from ..protocol import Event


class SqliteEvents:
    """Events (self.db and self.now come from SqliteJobStore)."""

    def add_events(self, job_id: str, events: Iterable[Event]) -> None:
        with self.db.write() as conn:
            self._insert_events(conn, job_id, events)

    def _insert_events(self, conn, job_id: str, events: Iterable[Event]) -> None:
        now = self.now()
        conn.executemany(
            "INSERT INTO events (job_id, at, kind, item_idx, message, error_type, http_status) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (job_id, e.at or now, e.kind, e.item_index, e.message, e.error_type, e.http_status)
                for e in events
            ],
        )

    def list_events(self, job_id: str, limit: int = 100, *, item: int | None = None) -> list[Event]:
        where, params = ("job_id = ?", (job_id,))
        if item is not None:
            where, params = ("job_id = ? AND item_idx = ?", (job_id, item))
        rows = self.db.read(
            "SELECT kind, message, item_idx, error_type, http_status, at FROM events"
            f" WHERE {where} ORDER BY id DESC LIMIT ?",
            (*params, limit),
        )
        return [Event(*r) for r in reversed(rows)]
