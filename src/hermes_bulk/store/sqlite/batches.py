"""Provider batches on SQLite: the batch operations of the JobStore protocol (store/protocol.py),
mixed into SqliteJobStore. A batch's items are running items owned by "batch:<id>", so results,
failures and releases go through the store's own item steps."""

from __future__ import annotations

from collections.abc import Iterator

from ..claim_rule import fits_sql
from ..compression import unpack
from ..protocol import (
    BATCH_DONE,
    BATCH_FIELDS,
    BATCH_OWNER_PREFIX,
    BATCH_PREPARING,
    CLAIMED,
    RUNNING,
    BatchItem,
    BatchRecord,
    ClaimRefused,
    JobRecord,
)
from .reservations import RESERVED_COST, limits
from .rows import JOB_COLUMNS, job_from_row

_COLUMNS = (
    "id, job_id, status, items, created_at, provider_id, input_file, output_file, error_file, "
    "completed,"
    " failed, submitted_at, cancel_sent, run_rest_live, lease_owner, lease_until, final_status,"
    " polled_at"
)


def _batch(row) -> BatchRecord:
    return BatchRecord(
        *row[:12],
        cancel_sent=bool(row[12]),
        run_rest_live=bool(row[13]),
        lease_owner=row[14],
        lease_until=row[15],
        final_status=row[16],
        polled_at=row[17],
    )


def _lease_preparing(conn, found, worker_id, take_from, now: float, lease_s: float):
    """The job's batch being prepared (its row `found`) leased to worker_id when its lease is
    free, expired, already worker_id's or take_from's; else the refusal batch_preparing."""
    batch = _batch(found)
    if batch.lease_owner not in (None, worker_id, take_from) and batch.lease_until >= now:
        return ClaimRefused("batch_preparing")
    conn.execute(
        "UPDATE batches SET lease_owner = ?, lease_until = ? WHERE id = ?",
        (worker_id, now + lease_s, batch.batch_id),
    )
    return _batch((*found[:14], worker_id, now + lease_s, *found[16:]))  # as updated


class SqliteBatches:
    """The batch half of SqliteJobStore (self.db, self.now, self._release and self._refuse_claim
    come from it)."""

    def open_batch(
        self, job_id, worker_id, *, batch_id, max_items, lease_s, hold_s, take_from=None
    ):
        now = self.now()
        with self.db.write() as conn:
            row = conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                return ClaimRefused("no_job")
            job = job_from_row(row)
            if job.state != RUNNING:
                return ClaimRefused("not_running")
            found = conn.execute(
                f"SELECT {_COLUMNS} FROM batches WHERE job_id = ? AND status = ?",
                (job_id, BATCH_PREPARING),
            ).fetchone()
            if found is not None:
                return _lease_preparing(conn, found, worker_id, take_from, now, lease_s)
            taken = self._take_items(conn, job, batch_id, max_items, now=now, hold_s=hold_s)
            if isinstance(taken, ClaimRefused):
                return taken
            conn.execute(
                "INSERT INTO batches (id, job_id, status, items, created_at, lease_owner, "
                "lease_until) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (batch_id, job_id, BATCH_PREPARING, taken, now, worker_id, now + lease_s),
            )
            return BatchRecord(
                batch_id,
                job_id,
                BATCH_PREPARING,
                taken,
                now,
                lease_owner=worker_id,
                lease_until=now + lease_s,
            )

    def _take_items(
        self, conn, job: JobRecord, batch_id: str, max_items: int, *, now: float, hold_s: float
    ) -> int | ClaimRefused:
        """open_batch's items, in conn: up to max_items pending items, lowest index first, become
        the batch's running items with their reservations; how many, or the refusal when none
        fits (claim_item's, by _refuse_claim)."""
        job_id = job.job_id
        # Set-wise, so a batch of 50,000 holds no list of its items here: each item's
        # reservations (as claim_item reckons them in SQL, in money at the batch price) and
        # the running sums of them in index order, taken while both fit under the limits.
        owner = BATCH_OWNER_PREFIX + batch_id
        conn.execute(
            f"WITH c AS (SELECT idx, estimate AS r, {RESERVED_COST} AS rc FROM items"
            "  WHERE job_id = :job AND status = 'pending' ORDER BY idx LIMIT :max_items),"
            " s AS (SELECT idx, r, rc, sum(r) OVER (ORDER BY idx) AS cum, sum(rc) OVER"
            " (ORDER BY idx) AS cum_cost FROM c)"
            " UPDATE items SET status = :claimed, owner = :owner, lease_until = :until,"
            " reserved = s.r, reserved_cost = s.rc FROM s WHERE items.job_id = :job AND"
            " items.idx = s.idx AND "
            f"{fits_sql(':tokens_used', 's.cum', ':max_tokens')} AND "
            f"{fits_sql(':cost_used', 's.cum_cost', ':max_cost')}",
            {
                **limits(job, batch=True),
                "job": job_id,
                "max_items": max_items,
                "claimed": CLAIMED,
                "owner": owner,
                "until": now + hold_s,
            },
        )
        # rowcount is -1 for a statement opening WITH
        (taken,) = conn.execute("SELECT changes()").fetchone()
        if not taken:
            first = conn.execute(
                "SELECT idx FROM items WHERE job_id = ? AND status = 'pending' ORDER BY idx"
                " LIMIT 1",
                (job_id,),
            ).fetchone()
            if first is None:
                return ClaimRefused("no_pending")
            return self._refuse_claim(conn, job, first[0], batch=True)
        reserved, reserved_cost = conn.execute(
            "SELECT coalesce(sum(reserved), 0), coalesce(sum(reserved_cost), 0) FROM items"
            " WHERE job_id = ? AND owner = ? AND status = ?",
            (job_id, owner, CLAIMED),
        ).fetchone()
        conn.execute(
            "UPDATE jobs SET pending = pending - ?, running = running + ?, tokens_reserved ="
            " tokens_reserved + ?, cost_reserved = cost_reserved + ?, last_claim_at = ?"
            " WHERE id = ?",
            (taken, taken, reserved, reserved_cost, now, job_id),
        )
        return taken

    def lease_batch(self, job_id, batch_id, worker_id, *, lease_s, take_from=None):
        now = self.now()
        with self.db.write() as conn:
            row = conn.execute(
                "UPDATE batches SET lease_owner = ?, lease_until = ? WHERE id = ? AND job_id = ? "
                "AND status != ?"
                " AND (lease_owner IS NULL OR lease_owner IN (?, ?) OR lease_until < ?) RETURNING "
                + _COLUMNS,
                (
                    worker_id,
                    now + lease_s,
                    batch_id,
                    job_id,
                    BATCH_DONE,
                    worker_id,
                    take_from or worker_id,
                    now,
                ),
            ).fetchone()
        return None if row is None else _batch(row)

    def update_batch(self, job_id, batch_id, worker_id, **changes):
        unknown = set(changes) - set(BATCH_FIELDS)
        if unknown:
            raise ValueError(f"update_batch: unknown fields {sorted(unknown)}")
        sets = [f"{k} = ?" for k in changes]
        values = [int(v) if isinstance(v, bool) else v for v in changes.values()]
        if changes.get("status") == BATCH_DONE:
            sets.append("lease_owner = NULL, lease_until = 0")
        if not sets:
            sets.append("id = id")
        with self.db.write() as conn:
            row = conn.execute(
                f"UPDATE batches SET {', '.join(sets)} WHERE id = ? AND job_id = ? AND lease_owner "
                "= ? RETURNING " + _COLUMNS,
                (*values, batch_id, job_id, worker_id),
            ).fetchone()
        return None if row is None else _batch(row)

    def list_batches(self, job_id):
        return [
            _batch(r)
            for r in self.db.read(
                f"SELECT {_COLUMNS} FROM batches WHERE job_id = ? ORDER BY created_at, id",
                (job_id,),
            )
        ]

    def batch_job_ids(self):
        return [
            r[0]
            for r in self.db.read(
                "SELECT DISTINCT job_id FROM batches WHERE status != ?", (BATCH_DONE,)
            )
        ]

    def iter_batch_items(self, job_id, batch_id, page: int = 500) -> Iterator[BatchItem]:
        owner, last = BATCH_OWNER_PREFIX + batch_id, -1
        while True:
            rows = self.db.read(
                "SELECT i.idx, i.name, c.text, i.content_hash, i.origin, i.byte_offset, i.stat_sig "
                "FROM items i JOIN contents c ON c.job_id = i.job_id AND c.hash = i.content_hash "
                "WHERE i.job_id = ? AND i.owner = ? AND i.status = ? AND i.idx > ? ORDER BY i.idx "
                "LIMIT ?",
                (job_id, owner, CLAIMED, last, page),
            )
            for r in rows:
                yield BatchItem(
                    r[0], r[1], unpack(r[2]), *r[3:]
                )  # contents are stored packed (store/compression.py)
            if len(rows) < page:
                return
            last = rows[-1][0]

    def release_batch_items(self, job_id, batch_id):
        released = self._release(
            "job_id = ? AND status = ? AND owner = ?",
            (job_id, CLAIMED, BATCH_OWNER_PREFIX + batch_id),
        )
        return released.get(job_id, 0)
