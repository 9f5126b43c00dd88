"""Claims on Redis: a pending item to a worker (claim_item.lua: the job's concurrency,
--max-tokens, --max-cost and run --sample), a completion and the next claim in one script, and
lease renewal (the JobStore protocol, store/protocol.py; mixed into RedisJobStore)."""

from __future__ import annotations

import json
from dataclasses import replace

from ..protocol import Claim, ClaimRefused, Usage
from . import codec
from .connection import map_connection_errors
from .item_state import ATTEMPTS, WAITS
from .limits import ACQUIRE_TIMING_ARGS, turn_of
from .scripts import call_job_script


@map_connection_errors
class RedisClaims:
    """Claims (self.conn, self.r, self.keys, self.lua, self.durable, self._run and
    self._complete_args come from RedisJobStore)."""

    def claim_item(self, job_id, index_hint, worker_id, *, lease_s, max_running):
        reply = self._run(
            self.lua.claim_item,
            job_id,
            [index_hint, worker_id, lease_s * 1000, max_running],
            items=[index_hint],
        )
        return self._claimed(reply)

    @staticmethod
    def _claimed(reply: list) -> Claim | ClaimRefused:
        """A Claim from claim_item.lua's reply (or the refusal it gives)."""
        if reply[0] != b"ok":
            return ClaimRefused(codec.text(reply[0]))
        _, meta, index, content_hash, name, source, raw_state, content = reply
        origin, offset, stat_sig = codec.parse_source(source)
        st = json.loads(raw_state) if raw_state else {}  # attempts and waits only: no names to read
        return Claim(
            job=codec.job_from_meta(codec.decode_hash(meta)),
            index=int(index),
            name=codec.text(name),
            content=codec.stored_text(content),
            content_hash=codec.content_hash_of(content_hash),
            origin=origin,
            offset=offset,
            stat_sig=stat_sig,
            attempts=st.get(ATTEMPTS, 0),
            rate_limit_waits=st.get(WAITS, 0),
        )

    def complete_and_claim(
        self,
        job_id,
        index,
        worker_id,
        result,
        usage: Usage,
        *,
        provider=None,
        model=None,
        index_hint,
        lease_s,
        max_running,
        take_turn=None,
    ):
        turn_args = [1, *ACQUIRE_TIMING_ARGS] if take_turn else [0]
        with self.durable.writing() as client:
            reply = call_job_script(
                self.lua.complete_and_claim,
                self.keys,
                job_id,
                [
                    *self._complete_args(job_id, index, worker_id, result, usage, provider, model),
                    index_hint,
                    worker_id,
                    lease_s * 1000,
                    max_running,
                    *turn_args,
                ],
                items=[index, index_hint],
                extra_keys=[self.keys.limit(take_turn)] if take_turn else (),
                client=client,
            )
            if not reply[0]:
                return False, None
            self.durable.confirm(client, "an answer")
        claimed = self._claimed(reply[1])
        if len(reply) > 2:  # the turn taken with the claim (take_turn)
            turn = turn_of(self.conn.backoff_clean, take_turn, reply[2])
            claimed = replace(claimed, turn=turn)
        return True, claimed

    def renew_leases(self, worker_id, items, *, lease_s):
        by_job: dict[str, list[int]] = {}
        for job_id, idx in items:
            by_job.setdefault(job_id, []).append(idx)
        if not by_job:
            return 0
        pipe = self.r.pipeline(transaction=False)
        for job_id, indexes in by_job.items():
            self.lua.renew_leases(
                keys=self.keys.job(job_id), args=[worker_id, lease_s * 1000, *indexes], client=pipe
            )
        return sum(int(n) for n in pipe.execute())
