"""A job's state on Redis: moves between states (run, pause, resume) with the active-jobs index,
why its workers stopped, its concurrency and pacing, failed items back to pending a batch a
script, and its run --sample (the JobStore protocol, store/protocol.py; mixed into
RedisJobStore)."""

from __future__ import annotations

import json

from ..protocol import RUNNING, spec_from_json
from . import codec
from .connection import map_connection_errors

#: Failed items returned to pending per retry_failed script call (Redis stays responsive).
RETRY_BATCH_ITEMS = 1000


@map_connection_errors
class RedisJobState:
    """A job's state (self.r, self.keys, self.lua, self.durable, self._run and self.get_job come
    from RedisJobStore)."""

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
        args = [state, codec.opt(pause_reason), codec.opt(max_tokens)]
        args += codec.event_args([event]) if event is not None else [0, ""]
        rates = ""
        if max_cost is not None:  # the rates come from the spec, which never changes
            raw = codec.text(self.r.hget(self.keys.job_key(job_id, "meta"), "spec"))
            rates = "" if raw is None else codec.cost_rates(spec_from_json(raw))
        args += [codec.opt(max_cost), rates]
        pipe = self.r.pipeline(transaction=True)
        if state == RUNNING:
            # Listed in the same MULTI/EXEC as the move (score 0, NX: never lowers an entry),
            # so no running job is ever out of the index because a process died.
            pipe.zadd(self.keys.jobs_active, {job_id: 0}, nx=True)
        self.lua.set_state(keys=self.keys.job(job_id), args=[*args, *from_states], client=pipe)
        epoch = pipe.execute()[-1]
        if epoch is None:
            return None
        self.durable.confirm_earlier("a job's new state")  # run, pause, resume: told the user
        if state == RUNNING:
            self._raise_active_epoch(job_id, epoch)
        return self.get_job(job_id)

    def _raise_active_epoch(self, job_id: str, epoch: int) -> None:
        """Score the job's entry with its new run epoch, so a prune by a reaper that saw the job
        idle at an older epoch can no longer remove it (prune_active.lua). GT: a slower
        concurrent run never puts back an older epoch. A process that dies before this leaves
        the entry at its old score: a running job is never pruned, so only a prune decided
        before the run and arriving in between can drop it, and running the job again (`run`
        accepts a running job) lists it again."""
        self.r.zadd(self.keys.jobs_active, {job_id: epoch}, gt=True)

    def mark_interrupted(self, job_id, reason, *, event=None):
        body = codec.event_body(event) if event is not None else ""
        return bool(
            self.lua.mark_interrupted(keys=self.keys.job(job_id), args=[codec.opt(reason), body])
        )

    def update_job(self, job_id, *, concurrency=None, rpm=None, tpm=None):
        args = [codec.opt(concurrency), codec.opt(rpm), codec.opt(tpm)]
        if not self.lua.update_job(keys=self.keys.job(job_id), args=args):
            return None
        return self.get_job(job_id)

    def retry_failed(self, job_id: str) -> int:
        total, failed = 0, self.keys.job_key(job_id, "failed")
        while True:
            # The items it will take, read first: their buckets go with the script's one call.
            hint = self.r.zrange(failed, 0, RETRY_BATCH_ITEMS - 1)
            n = self._run(self.lua.retry_failed, job_id, [RETRY_BATCH_ITEMS], items=hint)
            total += n
            if n < RETRY_BATCH_ITEMS:
                return total

    def set_sample(self, job_id: str, indexes: list[int] | None) -> bool:
        text = json.dumps(sorted(indexes)) if indexes else ""
        return bool(self.lua.set_sample(keys=self.keys.job(job_id), args=[text]))
