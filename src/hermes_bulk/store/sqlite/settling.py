"""How a claimed item settles on SQLite: completed (its duplicates with it, its answer indexed),
failed, released to pending by its worker, counted as a failed attempt, or taken back from an
expired lease or a dead worker (the JobStore protocol, store/protocol.py; mixed into
SqliteJobStore). Each public method is one transaction; the `_` steps run inside the caller's."""

from __future__ import annotations

from ...words import count
from ..compression import pack
from ..protocol import CLAIMED, COMPLETED, FAILED, PENDING, WAITING, Event, ItemError
from .rows import JOB_COLUMNS


class SqliteSettling:
    """Settling items (self.db, self.now and self._insert_events come from SqliteJobStore)."""

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
        the job's JOB_COLUMNS after it, or None when worker_id does not hold the item.

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
        dups = self._answer(conn, job_id, index, result, provider, model, charged, cost)
        job_row = conn.execute(
            "UPDATE jobs SET running = running - 1, completed = completed + 1 + ?, pending = "
            "pending - ?, tokens_reserved = tokens_reserved - ?, cost_reserved = cost_reserved - "
            "?, tokens_charged = tokens_charged + ?, tokens_in = tokens_in + ?, tokens_out = "
            "tokens_out + ?, tokens_cached = tokens_cached + ?, tokens_written = tokens_written + "
            "?, cost = cost + ?, list_cost = "
            f"list_cost + ? WHERE id = ? RETURNING {JOB_COLUMNS}, drop_content",
            (
                dups,
                dups,
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
            # the items with its content are its duplicates, completed by _answer).
            conn.execute(
                "DELETE FROM contents WHERE job_id = ? AND hash = (SELECT content_hash FROM items"
                " WHERE job_id = ? AND idx = ? AND answer_key != '')",
                (job_id, job_id, index),
            )
        return job_row[:-1]

    @staticmethod
    def _answer(conn, job_id, index, result, provider, model, charged, cost) -> int:
        """_complete's answer, in conn: the item's result, its WAITING duplicates completed with
        it (nothing charged), and the answer index pointed at it; how many duplicates."""
        result = pack(result)  # the one place a result is encoded (store/compression.py)
        conn.execute(
            "INSERT INTO results (job_id, idx, text) VALUES (?, ?, ?)", (job_id, index, result)
        )
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
        return len(dups)

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
