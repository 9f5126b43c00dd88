"""Creating a job on SQLite: begin, add its items (reused answers and duplicates settled at
once), finish, and delete (the JobStore protocol, store/protocol.py; mixed into SqliteJobStore)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict

from ...errors import JobNotFound
from ..compression import pack
from ..protocol import CREATING, NOT_STARTED, JobRecord, JobSpec, NewItem, drops_content


class SqliteCreation:
    """Creating and deleting jobs (self.db, self.now and self.get_job come from SqliteJobStore)."""

    def begin_job(self, spec: JobSpec) -> None:
        with self.db.write() as conn:
            conn.execute(
                "INSERT INTO jobs (id, created_at, spec, state, max_tokens, max_cost, drop_content)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    spec.job_id,
                    self.now(),
                    json.dumps(asdict(spec)),
                    CREATING,
                    spec.max_tokens,
                    spec.max_cost,
                    int(drops_content(spec)),
                ),
            )

    def add_items(self, job_id: str, items: Iterable[NewItem]) -> None:
        items = list(items)
        if not items:
            return
        with self.db.write() as conn:
            row = conn.execute(
                "SELECT json_extract(spec, '$.reuse'), drop_content FROM jobs WHERE id = ?",
                (job_id,),
            ).fetchone()
            if row is None:
                raise JobNotFound(
                    f"Job {job_id} was deleted while it was being created; nothing was created: "
                    "run create again."
                )
            reuse, drop = row
            conn.executemany(
                "INSERT INTO items (job_id, idx, name, content_hash, origin, byte_offset, "
                "stat_sig, estimate, expected, answer_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        job_id,
                        it.index,
                        it.name,
                        it.content_hash,
                        it.origin,
                        it.offset,
                        it.stat_sig,
                        it.claim_tokens,
                        it.estimated_tokens,
                        it.answer_key,
                    )
                    for it in items
                ],
            )
            reused = self._settle_reuse(
                conn,
                job_id,
                min(it.index for it in items),
                max(it.index for it in items),
                reuse=reuse is None or bool(reuse),
            )  # a spec without `reuse` reuses
            # An item completed from an earlier answer is never processed, so where the job drops
            # a completed item's content (complete_item) its bytes are not stored at all. Any other
            # item with that content stores them itself (INSERT OR IGNORE), in this batch or a later
            # one.
            unstored = reused if drop else set()
            conn.executemany(
                "INSERT OR IGNORE INTO contents (job_id, hash, text) VALUES (?, ?, ?)",
                [
                    (job_id, it.content_hash, pack(it.content))
                    for it in items
                    if it.index not in unstored
                ],
            )

    @staticmethod
    def _settle_reuse(conn, job_id: str, lo: int, hi: int, *, reuse: bool) -> set[int]:
        """The batch lo..hi just added: items answered before complete from the answer index (when
        the job reuses), and duplicates of an earlier item of the job wait on it. Set-wise, so a
        million-row create costs a few statements per batch, not a query per item. Returns the
        indexes completed from the index."""
        batch = "items.job_id = ? AND items.idx BETWEEN ? AND ? AND items.answer_key != ''"
        reused: set[int] = set()
        if reuse:
            reused = {
                r[0]
                for r in conn.execute(
                    "UPDATE items SET status = 'completed', reused_job = a.job_id, reused_idx = "
                    f"a.idx, tokens_saved = a.tokens, saved_cost = a.cost FROM answers a WHERE "
                    f"{batch} AND a.key = "
                    "items.answer_key RETURNING items.idx",
                    (job_id, lo, hi),
                )
            }
            conn.execute(
                "INSERT INTO results (job_id, idx, text) SELECT items.job_id, items.idx, r.text "
                "FROM items JOIN results r ON r.job_id = items.reused_job AND r.idx = "
                f"items.reused_idx WHERE {batch} AND items.reused_job IS NOT NULL",
                (job_id, lo, hi),
            )
        conn.execute(
            "INSERT OR IGNORE INTO item_keys (job_id, key, idx) SELECT job_id, answer_key, "
            f"min(idx) FROM items WHERE {batch} AND status = 'pending' GROUP BY answer_key",
            (job_id, lo, hi),
        )
        conn.execute(
            "UPDATE items SET status = 'waiting', dup_of = k.idx FROM item_keys k"
            f" WHERE {batch} AND items.status = 'pending' AND k.job_id = items.job_id"
            " AND k.key = items.answer_key AND k.idx != items.idx",
            (job_id, lo, hi),
        )
        return reused

    def finish_job(self, job_id: str) -> JobRecord:
        with self.db.write() as conn:
            total, estimated, worst, reused, saved, saved_cost = conn.execute(
                "SELECT count(*), coalesce(sum(expected) FILTER (WHERE reused_job IS NULL "
                "AND status != 'waiting'), 0), coalesce(sum(estimate) FILTER (WHERE reused_job "
                "IS NULL AND status != 'waiting'), 0), "
                "count(reused_job), "
                "coalesce(sum(tokens_saved), 0), coalesce(sum(saved_cost), 0) FROM items "
                "WHERE job_id = ?",
                (job_id,),
            ).fetchone()
            (skipped,) = conn.execute(
                "SELECT count(*) FROM events WHERE job_id = ? AND kind = 'skipped'", (job_id,)
            ).fetchone()
            conn.execute(
                "UPDATE jobs SET state = ?, total = ?, pending = ?, completed = ?, "
                "estimated_tokens = ?, worst_tokens = ?,"
                " skipped = ?, reused = ?, tokens_saved = ?, saved_cost = ? WHERE id = ? AND "
                "state = ?",
                (
                    NOT_STARTED,
                    total,
                    total - reused,
                    reused,
                    estimated,
                    worst,
                    skipped,
                    reused,
                    saved,
                    saved_cost,
                    job_id,
                    CREATING,
                ),
            )
        job = self.get_job(job_id)
        assert job is not None
        return job

    def delete_job(self, job_id: str) -> bool:
        with self.db.write() as conn:
            for table, column in (
                ("items", "job_id"),
                ("contents", "job_id"),
                ("results", "job_id"),
                ("events", "job_id"),
                ("item_keys", "job_id"),
                ("answers", "job_id"),
                ("batches", "job_id"),
            ):
                conn.execute(f"DELETE FROM {table} WHERE {column} = ?", (job_id,))
            return conn.execute("DELETE FROM jobs WHERE id = ?", (job_id,)).rowcount > 0
