"""Workers on Redis: their heartbeats (a registry in the {P:workers} slot), who is live and what
each holds, read job by job (the JobStore protocol, store/protocol.py; mixed into
RedisJobStore)."""

from __future__ import annotations

from ..protocol import WorkerInfo
from . import codec
from .connection import map_connection_errors


@map_connection_errors
class RedisWorkers:
    """The worker registry (self.conn, self.r, self.keys, self.lua, self._active_ids and
    self._each_active_job come from RedisJobStore)."""

    def heartbeat_worker(self, info: WorkerInfo, *, ttl_s: float) -> None:
        self.lua.heartbeat(
            keys=[self.keys.workers, self.keys.worker(info.worker_id)],
            args=[
                info.worker_id,
                info.host,
                info.pid,
                repr(float(info.started_at)),
                info.threads,
                ttl_s * 1000,
                info.serves,
            ],
        )

    def remove_worker(self, worker_id: str) -> None:
        pipe = self.r.pipeline(transaction=True)  # one slot: {P:workers}
        pipe.delete(self.keys.worker(worker_id))
        pipe.zrem(self.keys.workers, worker_id)
        pipe.execute()

    def live_workers(self, *, holding: bool = True) -> list[WorkerInfo]:
        # Live: its entry's expiry (heartbeat time + ttl) is not past, read against the backend's
        # clock in the same round trip (its hash expires then too, and is read below).
        pipe = self.r.pipeline(transaction=False)
        n = self.conn.queue_clock(pipe)
        pipe.zrange(self.keys.workers, 0, -1, withscores=True)
        *clock, entries = pipe.execute()
        now_ms = self.conn.time_of(clock[:n]) * 1000
        ids = [codec.text(i) for i, expires_ms in entries if expires_ms >= now_ms]
        pipe = self.r.pipeline(transaction=False)
        for worker_id in ids:
            pipe.hgetall(self.keys.worker(worker_id))
        held = self._holdings() if holding else {}
        workers = []
        for worker_id, raw in zip(ids, pipe.execute(), strict=True):
            w = codec.decode_hash(raw)
            if w:
                workers.append(
                    WorkerInfo(
                        worker_id,
                        w["host"],
                        int(w["pid"]),
                        float(w["started_at"]),
                        float(w["heartbeat_at_ms"]) / 1000,
                        int(w["threads"]),
                        w.get("serves", ""),
                        holding=held.get(worker_id, []),
                    )
                )
        return sorted(workers, key=lambda w: w.started_at)

    def _holdings(self) -> dict[str, list[tuple[str, int]]]:
        """Worker id -> the (job id, index) it holds, in job then index order."""
        ids = sorted(self._active_ids())
        pipe = self.r.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(self.keys.job_key(job_id, "owners"))
        held: dict[str, list[tuple[str, int]]] = {}
        for job_id, owners in zip(ids, pipe.execute(), strict=True):
            for index, owner in sorted((int(i), codec.text(o)) for i, o in owners.items()):
                held.setdefault(owner, []).append((job_id, index))
        return held

    def item_owners(self) -> dict[str, int]:
        # Counted in Redis (item_owners.lua): every maintenance pass asks, while batches may
        # hold a whole job's items, which read here would grow a worker's heap with them.
        owners: dict[str, int] = {}
        for flat in self._each_active_job(self.lua.item_owners, []).values():
            for owner, n in zip(flat[::2], flat[1::2], strict=True):
                owner = codec.text(owner)
                owners[owner] = owners.get(owner, 0) + int(n)
        return owners
