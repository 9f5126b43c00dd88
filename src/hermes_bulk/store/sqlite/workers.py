"""Workers on SQLite: their heartbeats, who is live and what each holds (the JobStore protocol,
store/protocol.py; mixed into SqliteJobStore)."""

from __future__ import annotations

from ..protocol import CLAIMED, WorkerInfo


class SqliteWorkers:
    """The worker registry (self.db and self.now come from SqliteJobStore)."""

    def heartbeat_worker(self, info: WorkerInfo, *, ttl_s: float) -> None:
        now = self.now()
        with self.db.write() as conn:
            conn.execute(
                "INSERT INTO workers (id, host, pid, started_at, heartbeat_at, expires_at, "
                "threads, serves) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
                "heartbeat_at = excluded.heartbeat_at, expires_at = excluded.expires_at, threads = "
                "excluded.threads, serves = excluded.serves",
                (
                    info.worker_id,
                    info.host,
                    info.pid,
                    info.started_at,
                    now,
                    now + ttl_s,
                    info.threads,
                    info.serves,
                ),
            )
            conn.execute("DELETE FROM workers WHERE expires_at < ?", (now - 3600,))

    def remove_worker(self, worker_id: str) -> None:
        with self.db.write() as conn:
            conn.execute("DELETE FROM workers WHERE id = ?", (worker_id,))

    def live_workers(self, *, holding: bool = True) -> list[WorkerInfo]:
        now = self.now()
        rows = self.db.read(
            "SELECT id, host, pid, started_at, heartbeat_at, threads, serves FROM workers"
            " WHERE expires_at >= ? ORDER BY started_at",
            (now,),
        )
        if not holding:
            return [WorkerInfo(*r) for r in rows]
        held: dict[str, list[tuple[str, int]]] = {}
        # INDEXED BY: for the ORDER BY the planner would rather walk the primary key, every item
        # of every job, than sort the few running ones. Only the listed
        # workers' items: a provider batch's (owner "batch:…", up to 50,000) are no worker's.
        for owner, job_id, idx in self.db.read(
            "SELECT owner, job_id, idx FROM items INDEXED BY items_owned WHERE status = "
            f"'{CLAIMED}'"
            " AND owner IN (SELECT id FROM workers WHERE expires_at >= ?) ORDER BY job_id, idx",
            (now,),
        ):
            held.setdefault(owner, []).append((job_id, idx))
        return [WorkerInfo(*r, holding=held.get(r[0], [])) for r in rows]

    def item_owners(self) -> dict[str, int]:
        rows = self.db.read(
            "SELECT owner, count(*) FROM items WHERE status = ? GROUP BY owner", (CLAIMED,)
        )
        return dict(rows)
