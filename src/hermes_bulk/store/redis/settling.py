"""How a claimed item settles on Redis: completed (its duplicates with it, its answer indexed),
failed, released to pending by its worker, counted as a failed attempt, or taken back from an
expired lease or a dead worker, each one script of the job (the JobStore protocol,
store/protocol.py; mixed into RedisJobStore)."""

from __future__ import annotations

from ..protocol import ItemError, Usage
from . import codec
from .connection import map_connection_errors


@map_connection_errors
class RedisSettling:
    """Settling items (self.r, self.keys, self.lua, self.durable, self._run and
    self._each_active_job come from RedisJobStore)."""

    def complete_item(
        self, job_id, index, worker_id, result, usage: Usage, *, provider=None, model=None
    ):
        args = self._complete_args(job_id, index, worker_id, result, usage, provider, model)
        with self.durable.writing() as client:
            done = self._run(self.lua.complete_item, job_id, args, items=[index], client=client)
            if done:
                self.durable.confirm(client, "an answer")
        return bool(done)

    @staticmethod
    def _complete_args(job_id, index, worker_id, result, usage: Usage, provider, model) -> list:
        """complete_item.lua's ARGV: the one place a result is encoded for Redis (codec.stored)."""
        return [
            index,
            worker_id,
            codec.stored(result),
            codec.opt(usage.tokens_in),
            codec.opt(usage.tokens_out),
            codec.opt(provider),
            codec.opt(model),
            job_id,
            codec.opt(usage.tokens_cached),
            usage.cost_nusd,
            usage.list_nusd,
            codec.opt(usage.tokens_written),
        ]

    def fail_item(self, job_id, index, worker_id, error: ItemError, *, usage=None):
        args = [index, worker_id, error.error_type, codec.opt(error.http_status), error.message]
        return bool(self._run(self.lua.fail_item, job_id, [*args, *_unkept(usage)], items=[index]))

    def release_item(self, job_id, index, worker_id):
        return bool(self._run(self.lua.release_item, job_id, [index, worker_id], items=[index]))

    def record_attempt(self, job_id, index, worker_id, error: ItemError, *, rate_limited):
        return self._run(
            self.lua.record_attempt,
            job_id,
            [
                index,
                worker_id,
                int(rate_limited),
                error.error_type,
                codec.opt(error.http_status),
                error.message,
            ],
            items=[index],
        )

    def settle_failed_attempt(
        self, job_id, index, worker_id, error: ItemError, *, retries, usage=None
    ):
        return self._run(
            self.lua.settle_failed_attempt,
            job_id,
            [
                index,
                worker_id,
                error.error_type,
                codec.opt(error.http_status),
                error.message,
                retries,
                *_unkept(usage),
            ],
            items=[index],
        )

    def release_expired_leases(self) -> dict[str, int]:
        released: dict[str, int] = {}
        idle: list[tuple[str, int]] = []
        for job_id, (n, is_idle, epoch) in self._each_active_job(
            self.lua.release_expired, []
        ).items():
            if n:
                released[job_id] = n
            if is_idle:
                idle.append((job_id, epoch))
        if idle:
            # Jobs not running and holding nothing leave the index, unless run again meanwhile.
            pipe = self.r.pipeline(transaction=False)
            for job_id, epoch in idle:
                self.lua.prune_active(
                    keys=[self.keys.jobs_active], args=[job_id, epoch], client=pipe
                )
            pipe.execute()
        return released

    def release_worker_items(self, worker_id: str) -> dict[str, int]:
        counts = self._each_active_job(self.lua.release_worker_items, [worker_id])
        return {job_id: n for job_id, n in counts.items() if n}


def _unkept(usage: Usage | None) -> list:
    """The ARGV of an answer not kept that the provider billed (_job.lua charge_unkept): its
    tokens in and out ('' when unreported: nothing is charged), cost and list cost."""
    if usage is None or not usage.reported:
        return ["", "", 0, 0]
    return [
        codec.opt(usage.tokens_in),
        codec.opt(usage.tokens_out),
        usage.cost_nusd,
        usage.list_nusd,
    ]
