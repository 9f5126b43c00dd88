"""Claims on SQLite: a pending item to a worker under the job's concurrency, --max-tokens,
--max-cost and run --sample, the pause when a limit is reached, a completion and the next claim
in one transaction, and lease renewal (the JobStore protocol, store/protocol.py; mixed into
SqliteJobStore)."""

from __future__ import annotations

import json

from ..claim_rule import IN_FLIGHT, LIMIT, fits, refusal
from ..compression import unpack
from ..protocol import (
    CLAIMED,
    PAUSE_COST_LIMIT,
    PAUSE_SAMPLE,
    PAUSE_TOKEN_LIMIT,
    PAUSED,
    RUNNING,
    Claim,
    ClaimRefused,
    Event,
    JobRecord,
    cost_limit_reached,
    reserved_cost,
    sample_done,
)
from .reservations import FITS, RESERVED_COST, limits
from .rows import JOB_COLUMNS, job_from_row

#: The pending items of a job's run --sample (job id, the sample as a JSON array).
_SAMPLE_PENDING = (
    "SELECT idx FROM items WHERE job_id = ? AND status = 'pending' AND idx IN "
    "(SELECT value FROM json_each(?))"
)
_SAMPLE_PENDING_NAMED = (
    "SELECT idx FROM items WHERE job_id = :job AND status = 'pending' AND idx IN "
    "(SELECT value FROM json_each(:sample))"
)


class SqliteClaims:
    """Claims (self.db, self.now, self._complete and self._insert_events come from
    SqliteJobStore)."""

    def claim_item(self, job_id, index_hint, worker_id, *, lease_s, max_running):
        with self.db.write() as conn:
            taken = self._claim(
                conn, job_id, index_hint, worker_id, lease_s=lease_s, max_running=max_running
            )
        return self._claimed(job_id, taken)

    def complete_and_claim(
        self,
        job_id,
        index,
        worker_id,
        result,
        usage,
        *,
        provider=None,
        model=None,
        index_hint,
        lease_s,
        max_running,
        take_turn=None,  # unused: an unpaced acquire here is a read, no round trip to save
    ):
        with self.db.write() as conn:  # one transaction: the steady state's one write per item
            job_row = self._complete(conn, job_id, index, worker_id, result, usage, provider, model)
            if job_row is None:
                return False, None
            taken = self._claim(
                conn,
                job_id,
                index_hint,
                worker_id,
                lease_s=lease_s,
                max_running=max_running,
                job_row=job_row,
            )
        return True, self._claimed(job_id, taken)

    def _claimed(
        self, job_id: str, taken: tuple[JobRecord, tuple] | ClaimRefused
    ) -> Claim | ClaimRefused:
        """The Claim of what _claim took, with its content (read after the transaction)."""
        if isinstance(taken, ClaimRefused):
            return taken
        job, row = taken
        # Contents never change once added, so they are read after the write lock is released.
        contents = self.db.read(
            "SELECT text FROM contents WHERE job_id = ? AND hash = ?", (job_id, row[2])
        )
        if not contents:
            return ClaimRefused("no_job")  # deleted in the meantime
        content = unpack(contents[0][0])
        return Claim(
            job=job,
            index=row[0],
            name=row[1],
            content=content,
            content_hash=row[2],
            origin=row[3],
            offset=row[4],
            stat_sig=row[5],
            attempts=row[7],
            rate_limit_waits=row[8],
        )

    def _claim(self, conn, job_id, index_hint, worker_id, *, lease_s, max_running, job_row=None):
        """claim_item's writes in conn: (the job as the claim saw it, the item's row) or the
        refusal. job_row: the job's JOB_COLUMNS as this transaction just wrote them (a statement
        less)."""
        now = self.now()
        if job_row is None:
            job_row = conn.execute(
                f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)
            ).fetchone()
        if job_row is None:
            return ClaimRefused("no_job")
        job = job_from_row(job_row)
        if job.state != RUNNING:
            return ClaimRefused("not_running")
        if job.running >= min(job.spec.concurrency, max_running):
            return ClaimRefused("at_capacity")
        # One statement takes the hint, else the lowest pending index, if its reservation fits
        # under --max-tokens and --max-cost (fewer statements: less time holding the write lock).
        if job.sample is None:  # the hint, else the lowest pending index
            pick = (
                "coalesce((SELECT idx FROM items WHERE job_id = :job AND status = 'pending' AND "
                "idx = :hint), (SELECT idx FROM items WHERE job_id = :job AND status = 'pending' "
                "ORDER BY idx LIMIT 1))"
            )
        else:  # run --sample: the lowest pending index of the sample (as _job.lua's)
            pick = f"({_SAMPLE_PENDING_NAMED} ORDER BY idx LIMIT 1)"
        row = conn.execute(
            "UPDATE items SET status = :claimed, owner = :owner, lease_until = :until, reserved = "
            f"estimate, reserved_cost = {RESERVED_COST} WHERE job_id = :job AND status = "
            f"'pending' AND idx = {pick} AND {FITS} RETURNING idx, name, content_hash, origin, "
            "byte_offset, stat_sig, reserved, attempts, rate_limit_waits, reserved_cost",
            {
                **limits(job, batch=False),
                "claimed": CLAIMED,
                "owner": worker_id,
                "until": now + lease_s,
                "job": job_id,
                "hint": index_hint,
                "sample": None if job.sample is None else json.dumps(job.sample),
            },
        ).fetchone()
        if row is None:
            return self._refuse_claim(conn, job, index_hint)
        conn.execute(
            "UPDATE jobs SET pending = pending - 1, running = running + 1, tokens_reserved ="
            " tokens_reserved + ?, cost_reserved = cost_reserved + ?, last_claim_at = ?"
            " WHERE id = ?",
            (row[6], row[9], now, job_id),
        )
        return job, row

    def _refuse_claim(
        self, conn, job: JobRecord, index_hint: int, *, batch: bool = False
    ) -> ClaimRefused:
        """No item was claimed: none is pending, or the next one does not fit under --max-tokens
        or --max-cost beside what is charged (spent) and reserved. It waits while reservations
        are in flight (they may settle for less); the job pauses, in the same transaction, only
        when it would not fit beside what is charged (spent) alone. batch: open_batch's first
        item (index_hint; a batch takes no --sample), its cost at the batch price."""
        select = "SELECT idx, estimate FROM items WHERE job_id = ? AND status = 'pending'"
        if job.sample is not None and not batch:  # a batch takes pending items by index alone
            sample = json.dumps(job.sample)
            row = conn.execute(
                f"SELECT idx, estimate FROM items WHERE idx = ({_SAMPLE_PENDING} ORDER BY idx "
                "LIMIT 1) AND job_id = ?",
                (job.job_id, sample, job.job_id),
            ).fetchone()
            if row is None:
                return self._end_sample(conn, job, sample)
        else:
            row = conn.execute(select + " AND idx = ?", (job.job_id, index_hint)).fetchone()
            row = row or conn.execute(select + " ORDER BY idx LIMIT 1", (job.job_id,)).fetchone()
        if row is None:
            return ClaimRefused("no_pending")
        idx, estimate = row[0], row[1]
        limit = job.spec.max_tokens
        tokens = refusal(job.tokens_charged, job.tokens_reserved, estimate, limit)
        if tokens == IN_FLIGHT:
            return ClaimRefused("tokens_in_flight")
        if tokens == LIMIT:
            return self._pause_at_limit(
                conn,
                job,
                PAUSE_TOKEN_LIMIT,
                f"token limit reached: {job.tokens_charged} charged + {estimate} for item "
                f"{idx + 1} would exceed --max-tokens {limit}",
                idx,
            )
        params = limits(job, batch=batch)
        max_cost = job.spec.max_cost
        if max_cost is not None:
            need = reserved_cost(estimate, job.spec.output_bound, params["rin"], params["rout"])
            if not fits(job.cost_nusd, need, max_cost):
                message = cost_limit_reached(job.cost_nusd, need, idx, max_cost)
                return self._pause_at_limit(conn, job, PAUSE_COST_LIMIT, message, idx)
        return ClaimRefused("cost_in_flight")

    def _pause_at_limit(self, conn, job: JobRecord, reason: str, message: str, idx: int):
        conn.execute(
            "UPDATE jobs SET state = ?, pause_reason = ? WHERE id = ?",
            (PAUSED, reason, job.job_id),
        )
        self._insert_events(conn, job.job_id, [Event("paused", message, idx)])
        return ClaimRefused("token_limit" if reason == PAUSE_TOKEN_LIMIT else "cost_limit")

    def _end_sample(self, conn, job: JobRecord, sample: str) -> ClaimRefused:
        """No item of the sample is pending: while one still runs, nothing to claim; once every
        one has settled, the job pauses (PAUSE_SAMPLE) and the sample is cleared, so a resume
        runs the rest (as _job.lua's end_sample)."""
        (running,) = conn.execute(
            "SELECT count(*) FROM items WHERE job_id = ? AND status = 'running' AND idx IN "
            "(SELECT value FROM json_each(?))",
            (job.job_id, sample),
        ).fetchone()
        if running:
            return ClaimRefused("no_pending")
        conn.execute(
            "UPDATE jobs SET state = ?, pause_reason = ?, sample = NULL WHERE id = ?",
            (PAUSED, PAUSE_SAMPLE, job.job_id),
        )
        self._insert_events(conn, job.job_id, [Event("paused", sample_done(len(job.sample or ())))])
        return ClaimRefused("sample_done")

    def renew_leases(self, worker_id, items, *, lease_s):
        items = list(items)
        if not items:
            return 0
        until = self.now() + lease_s
        with self.db.write() as conn:
            return sum(
                conn.execute(
                    "UPDATE items SET lease_until = ? WHERE job_id = ? AND idx = ? AND owner = ?"
                    " AND status = ?",
                    (until, job_id, idx, worker_id, CLAIMED),
                ).rowcount
                for job_id, idx in items
            )
