"""RedisJobStore: the JobStore protocol (store/protocol.py) on Redis, one Lua script per change
of one job (the keys and what each holds: keys.py), one room per concept, the same rooms as the
SQLite store (store/sqlite/):

- creation.py  begin a job, add its items, finish it, delete it
- reads.py     jobs and items read back (nothing written)
- events.py    a job's history
- job_state.py run, pause and resume moves, interruptions, settings, retries, the sample
- claims.py    an item to a worker under the job's limits, lease renewal
- settling.py  a claimed item completed, failed, released or taken back
- batches.py   provider batches
- workers.py   heartbeats and who holds what

The cross-job indexes are updated outside the job's scripts (so each script stays in one slot),
in the same MULTI/EXEC as the script for begin_job, delete_job and set_state, in an order that
keeps each index a superset of what it must list (keys.py says how); readers skip entries whose
job is missing or still being created.
"""

from __future__ import annotations

import redis

from ... import credentials
from . import codec
from .batches import RedisBatches
from .claims import RedisClaims
from .connection import RedisConnection, map_connection_errors
from .creation import RedisCreation
from .durability import Durability
from .events import RedisEvents
from .job_state import RedisJobState
from .keys import RedisKeys
from .layout import ensure_layout
from .reads import RedisReads
from .scripts import NEEDKEYS_ROUNDS, call_job_script, needed_buckets
from .settling import RedisSettling
from .workers import RedisWorkers


@map_connection_errors
class RedisJobStore(
    RedisCreation,
    RedisReads,
    RedisEvents,
    RedisJobState,
    RedisClaims,
    RedisSettling,
    RedisBatches,
    RedisWorkers,
):
    """JobStore on Redis (see store/protocol.py for each method's contract)."""

    def __init__(self, conn: RedisConnection) -> None:
        self.conn = conn
        self.r = conn.client
        self.keys = RedisKeys(conn.prefix)
        self.lua = conn.lua
        self.durable = Durability(conn, self.keys.wait_mark)
        try:
            ensure_layout(conn, self.keys)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise conn.unavailable(exc) from exc

    def now(self) -> float:
        return self.conn.now_s()

    def fingerprint_salt(self, create: bool = True) -> str | None:
        if create:
            self.r.set(self.keys.fingerprint_salt, credentials.new_salt_record(), nx=True)
        salt = self.r.get(self.keys.fingerprint_salt)
        return salt.decode() if salt is not None else None

    def close(self) -> None:
        self.conn.close()

    def _run(self, script, job_id: str, args: list, **buckets):
        """A job script with the buckets it touches in KEYS (scripts.call_job_script)."""
        return call_job_script(script, self.keys, job_id, args, **buckets)

    def _active_ids(self) -> list[str]:
        return [codec.text(i) for i in self.r.zrange(self.keys.jobs_active, 0, -1)]

    # What the SQLite store does in one statement across jobs, this store does one atomic
    # script per job on the active-jobs index (pipelined: one round trip). Each job's release
    # is atomic; the set of jobs is read just before.
    # A script that chose items of buckets it was not given (it asked for them: needed_buckets)
    # runs again with them, in a second pipeline of all such jobs.
    def _each_active_job(self, script, args: list) -> dict[str, object]:
        replies: dict[str, object] = {}
        asked: dict[str, set[int]] = {job_id: set() for job_id in self._active_ids()}
        for _ in range(NEEDKEYS_ROUNDS):
            if not asked:
                return replies
            pipe = self.r.pipeline(transaction=False)
            for job_id, buckets in asked.items():
                script(keys=self.keys.job(job_id, buckets=sorted(buckets)), args=args, client=pipe)
            again: dict[str, set[int]] = {}
            for (job_id, buckets), reply in zip(
                asked.items(), pipe.execute(raise_on_error=False), strict=True
            ):
                more = needed_buckets(reply) if isinstance(reply, redis.ResponseError) else None
                if more:
                    again[job_id] = buckets | more
                elif isinstance(reply, Exception):
                    raise reply
                else:
                    replies[job_id] = reply
            asked = again
        raise redis.ResponseError(f"scripts still chose items of other buckets: {sorted(asked)}")
