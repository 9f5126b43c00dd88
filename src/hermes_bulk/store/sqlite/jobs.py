"""SqliteJobStore: the JobStore protocol (store/protocol.py) on one SqliteDatabase."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, replace

from ... import credentials
from ...words import count
from ..compression import pack, unpack
from ..protocol import (
    CLAIMED,
    COMPLETED,
    CREATING,
    FAILED,
    NOT_STARTED,
    PAUSE_COST_LIMIT,
    PAUSE_SAMPLE,
    PAUSE_TOKEN_LIMIT,
    PAUSED,
    PENDING,
    RUNNING,
    WAITING,
    Claim,
    ClaimRefused,
    Event,
    ItemDetail,
    ItemError,
    ItemRecord,
    JobRecord,
    JobSpec,
    NewItem,
    WorkerInfo,
    cost_limit_reached,
    drops_content,
    reserved_cost,
    sample_done,
    spec_from_json,
    spread,
)
from .batches import SqliteBatches
from .database import SqliteDatabase
from .reservations import FITS, RESERVED_COST, limits

#: The pending items of a job's run --sample (job id, the sample as a JSON array).
_SAMPLE_PENDING = (
    "SELECT idx FROM items WHERE job_id = ? AND status = 'pending' AND idx IN "
    "(SELECT value FROM json_each(?))"
)
_SAMPLE_PENDING_NAMED = (
    "SELECT idx FROM items WHERE job_id = :job AND status = 'pending' AND idx IN "
    "(SELECT value FROM json_each(:sample))"
)
#: Answer keys looked up per statement by `answered` (SQLite's limit on variables is 32,766).
ANSWERED_PAGE = 500

_JOB_COLUMNS = (
    "id, created_at, spec, state, pause_reason, max_tokens, total, pending, running, completed, "
    "failed, tokens_in, tokens_out, tokens_charged, tokens_reserved, estimated_tokens, skipped, "
    "last_claim_at, run_at, interrupted, interrupted_at, reused, tokens_saved, tokens_cached, "
    "cost, list_cost, saved_cost, sample, max_cost, cost_reserved, tokens_written, tokens_unkept, "
    "cost_unkept, worst_tokens"
)


def _job_from_row(row: tuple) -> JobRecord:
    spec = spec_from_json(row[2])
    if spec.max_tokens != row[5] or spec.max_cost != row[28]:  # resume changes them
        spec = replace(spec, max_tokens=row[5], max_cost=row[28])
    return JobRecord(
        spec=spec,
        created_at=row[1],
        state=row[3],
        pause_reason=row[4],
        total=row[6],
        pending=row[7],
        running=row[8],
        completed=row[9],
        failed=row[10],
        tokens_in=row[11],
        tokens_out=row[12],
        tokens_charged=row[13],
        tokens_reserved=row[14],
        estimated_tokens=row[15],
        skipped=row[16],
        last_claim_at=row[17],
        run_at=row[18],
        interrupted=row[19],
        interrupted_at=row[20],
        reused=row[21],
        tokens_saved=row[22],
        tokens_cached=row[23],
        cost_nusd=row[24],
        list_nusd=row[25],
        saved_nusd=row[26],
        sample=tuple(json.loads(row[27])) if row[27] else None,
        cost_reserved=row[29],
        tokens_written=row[30],
        tokens_unkept=row[31],
        cost_unkept=row[32],
        worst_tokens=row[33],
    )


#: The item columns an ItemRecord is made of (_item_record), in the alias i.
_ITEM_COLUMNS = (
    "i.idx, i.name, i.status, r.text, i.error_type, i.http_status, i.error_message, i.tokens_in, "
    "i.tokens_out, i.attempts, i.provider, i.model, i.reused_job, i.reused_idx, i.cost"
)


def _item_record(r) -> ItemRecord:
    """An ItemRecord from the 15 _ITEM_COLUMNS (and the content, if a 16th)."""
    return ItemRecord(
        *r[:3],
        unpack(r[3]),
        *r[4:12],
        content=unpack(r[15]) if len(r) > 15 else None,
        reused_from=None if r[12] is None else (r[12], r[13]),
        cost_nusd=r[14],
    )


class SqliteJobStore(SqliteBatches):
    """JobStore on SqliteDatabase (see store/protocol.py for each method's contract)."""

    _job_columns = _JOB_COLUMNS
    _job_from_row = staticmethod(_job_from_row)

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

    # Creating ------------------------------------------------------------------------------
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
            reuse, drop = conn.execute(
                "SELECT json_extract(spec, '$.reuse'), drop_content FROM jobs WHERE id = ?",
                (job_id,),
            ).fetchone()
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
            )  # a spec from before reuse reuses too
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

    # Reading -------------------------------------------------------------------------------
    def get_job(self, job_id: str) -> JobRecord | None:
        rows = self.db.read(
            f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id = ? AND state != ?", (job_id, CREATING)
        )
        return _job_from_row(rows[0]) if rows else None

    def find_job_ids(self, prefix: str) -> list[str]:
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = self.db.read(
            "SELECT id FROM jobs WHERE id LIKE ? ESCAPE '\\' AND state != ? LIMIT 10",
            (escaped + "%", CREATING),
        )
        return [r[0] for r in rows]

    def list_jobs(self, limit: int = 20) -> list[JobRecord]:
        rows = self.db.read(
            f"SELECT {_JOB_COLUMNS} FROM jobs WHERE state != ? ORDER BY created_at DESC LIMIT ?",
            (CREATING, limit),
        )
        return [_job_from_row(r) for r in rows]

    def active_job_ids(self) -> list[str]:
        return [r[0] for r in self.db.read("SELECT id FROM jobs WHERE state = ?", (RUNNING,))]

    def iter_items(
        self, job_id: str, batch: int = 1000, *, with_content: bool = False
    ) -> Iterator[ItemRecord]:
        last = -1
        content, join = (
            (", c.text", " LEFT JOIN contents c ON c.job_id = i.job_id AND c.hash = i.content_hash")
            if with_content
            else ("", "")
        )
        while True:
            rows = self.db.read(
                f"SELECT {_ITEM_COLUMNS}{content} FROM items i LEFT JOIN results r ON r.job_id "
                f"= i.job_id AND r.idx = i.idx{join} WHERE i.job_id = ? AND i.idx > ? ORDER BY "
                "i.idx LIMIT ?",
                (job_id, last, batch),
            )
            for r in rows:
                yield _item_record(r)
            if len(rows) < batch:
                return
            last = rows[-1][0]

    def list_events(self, job_id: str, limit: int = 100) -> list[Event]:
        rows = self.db.read(
            "SELECT kind, message, item_idx, error_type, http_status, at FROM events"
            " WHERE job_id = ? ORDER BY id DESC LIMIT ?",
            (job_id, limit),
        )
        return [Event(*r) for r in reversed(rows)]

    def get_item(self, job_id: str, index: int) -> ItemDetail | None:
        rows = self.db.read(
            f"SELECT {_ITEM_COLUMNS}, c.text, i.content_hash FROM items i LEFT JOIN results r ON "
            "r.job_id = i.job_id AND r.idx = i.idx LEFT JOIN contents c ON c.job_id = i.job_id AND "
            "c.hash = i.content_hash WHERE i.job_id = ? AND i.idx = ?",
            (job_id, index),
        )
        if not rows:
            return None
        *record, content, content_hash = rows[0]
        return ItemDetail(_item_record(record), unpack(content), content_hash)

    def answered(self, keys: list[str]) -> set[str]:
        found: set[str] = set()
        for low in range(0, len(keys), ANSWERED_PAGE):
            page = keys[low : low + ANSWERED_PAGE]
            marks = ", ".join("?" * len(page))
            found.update(
                r[0] for r in self.db.read(f"SELECT key FROM answers WHERE key IN ({marks})", page)
            )
        return found

    def find_item(self, job_id: str, name: str) -> int | None:
        rows = self.db.read(
            "SELECT min(idx) FROM items WHERE job_id = ? AND name = ?", (job_id, name)
        )
        return rows[0][0] if rows else None

    def failed_items(self, job_id: str, limit: int) -> list[ItemRecord]:
        rows = self.db.read(
            f"SELECT {_ITEM_COLUMNS} FROM items i INDEXED BY items_failed LEFT JOIN results r ON "
            "r.job_id = i.job_id AND r.idx = i.idx WHERE i.job_id = ? AND i.status = 'failed' "
            "ORDER BY i.idx LIMIT ?",
            (job_id, max(limit, 0)),
        )
        return [_item_record(r) for r in rows]

    def item_names(self, job_id: str, indexes: Iterable[int]) -> dict[int, str]:
        wanted = sorted(set(indexes))
        if not wanted:
            return {}
        rows = self.db.read(
            "SELECT idx, name FROM items WHERE job_id = ? AND idx IN "
            f"({','.join('?' * len(wanted))})",
            (job_id, *wanted),
        )
        return dict(rows)

    def item_events(self, job_id: str, index: int, limit: int = 100) -> list[Event]:
        rows = self.db.read(
            "SELECT kind, message, item_idx, error_type, http_status, at FROM events"
            " WHERE job_id = ? AND item_idx = ? ORDER BY id DESC LIMIT ?",
            (job_id, index, limit),
        )
        return [Event(*r) for r in reversed(rows)]

    # Job state -----------------------------------------------------------------------------
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

    # Items ---------------------------------------------------------------------------------
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
        refusal. job_row: the job's _JOB_COLUMNS as this transaction just wrote them (a statement
        less)."""
        now = self.now()
        if job_row is None:
            job_row = conn.execute(
                f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)
            ).fetchone()
        if job_row is None:
            return ClaimRefused("no_job")
        job = _job_from_row(job_row)
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
        if limit is not None and job.tokens_charged + job.tokens_reserved + estimate > limit:
            if job.tokens_charged + estimate <= limit:
                return ClaimRefused("tokens_in_flight")
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
            if job.cost_nusd + need > max_cost:
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

    def sample_pending(self, job_id: str, n: int) -> list[int]:
        pending = [
            row[0]
            for row in self.db.read(
                "SELECT idx FROM items WHERE job_id = ? AND status = 'pending' ORDER BY idx",
                (job_id,),
            )
        ]
        return [pending[rank] for rank in spread(len(pending), n)]

    def set_sample(self, job_id: str, indexes: list[int] | None) -> bool:
        with self.db.write() as conn:
            return (
                conn.execute(
                    "UPDATE jobs SET sample = ? WHERE id = ? AND state != ?",
                    (json.dumps(sorted(indexes)) if indexes else None, job_id, CREATING),
                ).rowcount
                == 1
            )

    def next_item_estimate(self, job_id: str) -> int | None:
        rows = self.db.read(
            "SELECT estimate FROM items WHERE job_id = ? AND status = 'pending'"
            " ORDER BY idx LIMIT 1",
            (job_id,),
        )
        return rows[0][0] if rows else None

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

    def _finish_owned(self, conn, job_id, index, worker_id, status, extra_sets="", extra=()):
        """Move the owner's running item to status; returns its reservations (tokens, nano-USD),
        or None if not owner.

        An item's `reserved` and `reserved_cost` are what its claim reserved; they count only
        while the item runs, so they are left as they are here and RETURNING can give them back
        in one statement.
        """
        return conn.execute(
            f"UPDATE items SET status = ?, owner = NULL, lease_until = NULL{extra_sets}"
            " WHERE job_id = ? AND idx = ? AND owner = ? AND status = ?"
            " RETURNING reserved, reserved_cost",
            (status, *extra, job_id, index, worker_id, CLAIMED),
        ).fetchone()

    def complete_item(self, job_id, index, worker_id, result, usage, *, provider=None, model=None):
        with self.db.write() as conn:
            return (
                self._complete(conn, job_id, index, worker_id, result, usage, provider, model)
                is not None
            )

    def _complete(
        self, conn, job_id, index, worker_id, result, usage, provider, model
    ) -> tuple | None:
        """complete_item's writes in conn (the one complete path: complete_and_claim calls it too);
        the job's _JOB_COLUMNS after it, or None when worker_id does not hold the item.

        Each statement is one more wait for the GIL while the write lock is held (a process's
        threads take turns at it), so the job's counters are updated and read back in one."""
        tokens_in, tokens_out = usage.tokens_in or 0, usage.tokens_out or 0
        cached, cost = usage.tokens_cached or 0, usage.cost_nusd
        written = usage.tokens_written or 0
        held = self._finish_owned(
            conn,
            job_id,
            index,
            worker_id,
            COMPLETED,
            ", tokens_in = tokens_in + ?, tokens_out = tokens_out + ?, tokens_cached = ?, "
            "tokens_written = ?, cost = cost + ?, provider = ?, model = ?, rate_limit_waits = 0",
            (tokens_in, tokens_out, cached, written, cost, provider or None, model or None),
        )  # "" is none, as on Redis
        if held is None:
            return None
        reserved, held_cost = held
        charged = tokens_in + tokens_out if usage.reported else reserved
        if not usage.reported and held_cost > cost:  # no bill said: what its claim held (a cap's)
            conn.execute(
                "UPDATE items SET cost = cost + ? WHERE job_id = ? AND idx = ?",
                (held_cost - cost, job_id, index),
            )
            cost = held_cost
        result = pack(result)  # the one place a result is encoded (store/compression.py)
        conn.execute(
            "INSERT INTO results (job_id, idx, text) VALUES (?, ?, ?)", (job_id, index, result)
        )
        # Its duplicates take the answer (nothing charged), and the index points at it.
        dups = [
            r[0]
            for r in conn.execute(
                "UPDATE items SET status = ?, provider = ?, model = ? WHERE job_id = ? AND dup_of "
                "= ? AND status = ? RETURNING idx",
                (COMPLETED, provider or None, model or None, job_id, index, WAITING),
            )
        ]
        if dups:
            conn.executemany(
                "INSERT INTO results (job_id, idx, text) VALUES (?, ?, ?)",
                [(job_id, i, result) for i in dups],
            )
        conn.execute(
            "INSERT OR REPLACE INTO answers (key, job_id, idx, tokens, cost) SELECT answer_key, "
            "job_id, idx, ?, ? FROM items WHERE job_id = ? AND idx = ? AND answer_key != ''",
            (charged, cost, job_id, index),
        )
        job_row = conn.execute(
            "UPDATE jobs SET running = running - 1, completed = completed + 1 + ?, pending = "
            "pending - ?, tokens_reserved = tokens_reserved - ?, cost_reserved = cost_reserved - "
            "?, tokens_charged = tokens_charged + ?, tokens_in = tokens_in + ?, tokens_out = "
            "tokens_out + ?, tokens_cached = tokens_cached + ?, tokens_written = tokens_written + "
            "?, cost = cost + ?, list_cost = "
            f"list_cost + ? WHERE id = ? RETURNING {_JOB_COLUMNS}, drop_content",
            (
                len(dups),
                len(dups),
                reserved,
                held_cost,
                charged,
                tokens_in,
                tokens_out,
                cached,
                written,
                cost,
                usage.list_nusd,
                job_id,
            ),
        ).fetchone()
        if job_row[-1]:
            # Nothing reads a completed item's content again (protocol: complete_item): the bytes
            # go where the job drops them and no other item needs them (its answer key is set:
            # the items with its content are its duplicates, completed just above).
            conn.execute(
                "DELETE FROM contents WHERE job_id = ? AND hash = (SELECT content_hash FROM items"
                " WHERE job_id = ? AND idx = ? AND answer_key != '')",
                (job_id, job_id, index),
            )
        return job_row[:-1]

    def fail_item(self, job_id, index, worker_id, error: ItemError, *, usage=None):
        with self.db.write() as conn:
            failed = self._fail(conn, job_id, index, worker_id, error)
            if failed:
                self._charge_unkept(conn, job_id, index, usage)
            return failed

    def _fail(self, conn, job_id, index, worker_id, error: ItemError) -> bool:
        """fail_item's writes in conn (settle_failed_attempt calls it too)."""
        held = self._finish_owned(
            conn,
            job_id,
            index,
            worker_id,
            FAILED,
            ", error_type = ?, http_status = ?, error_message = ?",
            (error.error_type, error.http_status, error.message),
        )
        if held is None:
            return False
        dups = conn.execute(
            "UPDATE items SET status = ?, error_type = ?, http_status = ?, error_message = ?"
            " WHERE job_id = ? AND dup_of = ? AND status = ?",
            (FAILED, error.error_type, error.http_status, error.message, job_id, index, WAITING),
        ).rowcount
        conn.execute(
            "UPDATE jobs SET running = running - 1, failed = failed + 1 + ?, pending = pending -"
            " ?, tokens_reserved = tokens_reserved - ?, cost_reserved = cost_reserved - ?"
            " WHERE id = ?",
            (dups, dups, *held, job_id),
        )
        self._insert_events(
            conn,
            job_id,
            [Event("item_failed", error.message, index, error.error_type, error.http_status)],
        )
        return True

    def release_item(self, job_id, index, worker_id):
        with self.db.write() as conn:
            return self._release_owned(conn, job_id, index, worker_id)

    def _release_owned(self, conn, job_id, index, worker_id) -> bool:
        """release_item's writes in conn (settle_failed_attempt calls it too)."""
        held = self._finish_owned(conn, job_id, index, worker_id, PENDING)
        if held is None:
            return False
        self._count_released(conn, {job_id: (1, *held)})
        return True

    def record_attempt(self, job_id, index, worker_id, error: ItemError, *, rate_limited):
        with self.db.write() as conn:
            return self._record_attempt(
                conn, job_id, index, worker_id, error, rate_limited=rate_limited
            )

    def _record_attempt(
        self, conn, job_id, index, worker_id, error: ItemError, *, rate_limited
    ) -> int:
        """record_attempt's writes in conn (settle_failed_attempt calls it too)."""
        column = "rate_limit_waits" if rate_limited else "attempts"
        reset = "" if rate_limited else ", rate_limit_waits = 0"
        row = conn.execute(
            f"UPDATE items SET {column} = {column} + 1{reset}"
            " WHERE job_id = ? AND idx = ? AND owner = ? AND status = ? RETURNING " + column,
            (job_id, index, worker_id, CLAIMED),
        ).fetchone()
        if row is None:
            return -1
        kind = "rate_limited" if rate_limited else "attempt_failed"
        self._insert_events(
            conn, job_id, [Event(kind, error.message, index, error.error_type, error.http_status)]
        )
        return row[0]

    def settle_failed_attempt(
        self, job_id, index, worker_id, error: ItemError, *, retries, usage=None
    ):
        with self.db.write() as conn:  # one transaction: a kill between the two leaves neither
            attempts = self._record_attempt(
                conn, job_id, index, worker_id, error, rate_limited=False
            )
            if attempts < 0:
                return -1
            self._charge_unkept(conn, job_id, index, usage)
            if attempts > retries:
                self._fail(conn, job_id, index, worker_id, error)
            else:
                self._release_owned(conn, job_id, index, worker_id)
            return attempts

    @staticmethod
    def _charge_unkept(conn, job_id, index, usage) -> None:
        """What the provider billed for an answer not kept, charged to the item and the job
        (protocol: settle_failed_attempt); the caller has checked the item is the worker's."""
        if usage is None or not usage.reported:
            return
        tokens_in, tokens_out = usage.tokens_in or 0, usage.tokens_out or 0
        conn.execute(
            "UPDATE items SET tokens_in = tokens_in + ?, tokens_out = tokens_out + ?, cost = cost"
            " + ? WHERE job_id = ? AND idx = ?",
            (tokens_in, tokens_out, usage.cost_nusd, job_id, index),
        )
        conn.execute(
            "UPDATE jobs SET tokens_charged = tokens_charged + ?, tokens_unkept = tokens_unkept + "
            "?, cost = cost + ?, cost_unkept = cost_unkept + ?, list_cost = list_cost + ? WHERE "
            "id = ?",
            (
                tokens_in + tokens_out,
                tokens_in + tokens_out,
                usage.cost_nusd,
                usage.cost_nusd,
                usage.list_nusd,
                job_id,
            ),
        )

    def release_expired_leases(self) -> dict[str, int]:
        return self._release("status = ? AND lease_until < ?", (CLAIMED, self.now()))

    def release_worker_items(self, worker_id: str) -> dict[str, int]:
        return self._release("status = ? AND owner = ?", (CLAIMED, worker_id), worker=worker_id)

    def item_owners(self) -> dict[str, int]:
        rows = self.db.read(
            "SELECT owner, count(*) FROM items WHERE status = ? GROUP BY owner", (CLAIMED,)
        )
        return dict(rows)

    def _release(self, where: str, params: tuple, worker: str | None = None) -> dict[str, int]:
        """worker: whose items these are, when known (the recovered event names it)."""
        with self.db.write() as conn:
            # The reservations are left as they are (see _finish_owned), so RETURNING gives them.
            rows = conn.execute(
                f"UPDATE items SET status = 'pending', owner = NULL, lease_until = NULL"
                f" WHERE {where} RETURNING job_id, reserved, reserved_cost",
                params,
            ).fetchall()
            per_job: dict[str, tuple[int, int, int]] = {}
            for job_id, reserved, reserved_cost in rows:
                n, r, c = per_job.get(job_id, (0, 0, 0))
                per_job[job_id] = (n + 1, r + reserved, c + reserved_cost)
            self._count_released(conn, per_job)
            for job_id, (n, _, _) in per_job.items():
                self._insert_events(
                    conn,
                    job_id,
                    [
                        Event(
                            "recovered",
                            f"{count(n, 'interrupted item')} returned to the queue"
                            + (f" from worker {worker}" if worker else ""),
                        )
                    ],
                )
        return {job_id: n for job_id, (n, _, _) in per_job.items()}

    @staticmethod
    def _count_released(conn, per_job: dict[str, tuple[int, int, int]]) -> None:
        """per_job: job id -> (items, their token reservations, their cost reservations)."""
        for job_id, (n, reserved, held_cost) in per_job.items():
            conn.execute(
                "UPDATE jobs SET running = running - ?, pending = pending + ?,"
                " tokens_reserved = tokens_reserved - ?, cost_reserved = cost_reserved - ?"
                " WHERE id = ?",
                (n, n, reserved, held_cost, job_id),
            )

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

    # Workers -------------------------------------------------------------------------------
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
        # of every job (0.12 s at a million), than sort the few running ones. Only the listed
        # workers' items: a provider batch's (owner "batch:…", up to 50,000) are no worker's.
        for owner, job_id, idx in self.db.read(
            "SELECT owner, job_id, idx FROM items INDEXED BY items_owned WHERE status = "
            f"'{CLAIMED}'"
            " AND owner IN (SELECT id FROM workers WHERE expires_at >= ?) ORDER BY job_id, idx",
            (now,),
        ):
            held.setdefault(owner, []).append((job_id, idx))
        return [WorkerInfo(*r, holding=held.get(r[0], [])) for r in rows]
