"""A job's state on SQLite: moves between states (run, pause, resume), why its workers stopped,
its concurrency and pacing, failed items back to pending, and its run --sample (the JobStore
protocol, store/protocol.py; mixed into SqliteJobStore)."""

from __future__ import annotations

import json

from ..protocol import CREATING, FAILED, PENDING, RUNNING, WAITING


class SqliteJobState:
    """A job's state (self.db, self.now, self.get_job and self._insert_events come from
    SqliteJobStore)."""

    def set_state(
        self,
        job_id,
        state,
        *,
        from_states,
        pause_reason=None,
        max_tokens=None,
        max_cost=None,
        event=None,
    ):
        from_states = tuple(from_states)
        marks = ",".join("?" * len(from_states))
        with self.db.write() as conn:
            sets, params = "state = ?, pause_reason = ?", [state, pause_reason]
            for column, value in (("max_tokens", max_tokens), ("max_cost", max_cost)):
                if value is not None:
                    sets += f", {column} = ?"
                    params.append(value)
            if state == RUNNING:
                sets += ", run_at = ?, interrupted = NULL, interrupted_at = NULL"
                params.append(self.now())
            changed = conn.execute(
                f"UPDATE jobs SET {sets} WHERE id = ? AND state IN ({marks})",
                (*params, job_id, *from_states),
            ).rowcount
            if not changed:
                return None
            if event is not None:
                self._insert_events(conn, job_id, [event])
        return self.get_job(job_id)

    def mark_interrupted(self, job_id, reason, *, event=None):
        with self.db.write() as conn:
            changed = conn.execute(
                "UPDATE jobs SET interrupted = ?, interrupted_at = ? WHERE id = ? AND state = ?",
                (reason, None if reason is None else self.now(), job_id, RUNNING),
            ).rowcount
            if changed and event is not None:
                self._insert_events(conn, job_id, [event])
        return bool(changed)

    def update_job(self, job_id, *, concurrency=None, rpm=None, tpm=None):
        changes = {
            k: v
            for k, v in (("concurrency", concurrency), ("rpm", rpm), ("tpm", tpm))
            if v is not None
        }
        with self.db.write() as conn:  # read and rewrite the spec in one transaction
            row = conn.execute(
                "SELECT spec FROM jobs WHERE id = ? AND state != ?", (job_id, CREATING)
            ).fetchone()
            if row is None:
                return None
            if changes:
                conn.execute(
                    "UPDATE jobs SET spec = ? WHERE id = ?",
                    (json.dumps({**json.loads(row[0]), **changes}), job_id),
                )
        return self.get_job(job_id)

    def retry_failed(self, job_id: str) -> int:
        with self.db.write() as conn:
            n = conn.execute(
                "UPDATE items SET status = CASE WHEN dup_of IS NULL THEN ? ELSE ? END, attempts = "
                "0, rate_limit_waits = 0, error_type = NULL, http_status = NULL, error_message = "
                "NULL WHERE job_id = ? AND status = ?",
                (PENDING, WAITING, job_id, FAILED),
            ).rowcount
            conn.execute(
                "UPDATE jobs SET failed = failed - ?, pending = pending + ? WHERE id = ?",
                (n, n, job_id),
            )
            return n

    def set_sample(self, job_id: str, indexes: list[int] | None) -> bool:
        with self.db.write() as conn:
            return (
                conn.execute(
                    "UPDATE jobs SET sample = ? WHERE id = ? AND state != ?",
                    (json.dumps(sorted(indexes)) if indexes else None, job_id, CREATING),
                ).rowcount
                == 1
            )
