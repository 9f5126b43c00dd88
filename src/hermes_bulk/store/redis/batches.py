"""Provider batches on Redis: the batch operations of the JobStore protocol (store/protocol.py),
mixed into RedisJobStore. Each batch is a JSON record in {P:job:ID}:batches; its items are the
job's running items owned by "batch:<id>" (OWNERS), so results, failures and releases go through
the job's own item scripts. P:jobs:batched lists the jobs with an open batch."""

from __future__ import annotations

import json
from collections.abc import Iterator

from ..protocol import BATCH_FIELDS, BATCH_OWNER_PREFIX, BatchItem, BatchRecord, ClaimRefused
from . import codec
from .connection import map_connection_errors


def _batch(raw) -> BatchRecord:
    data = json.loads(raw)
    return BatchRecord(
        batch_id=data["batch_id"],
        job_id=data["job_id"],
        status=data["status"],
        items=int(data["items"]),
        created_at=float(data["created_at"]),
        provider_id=data.get("provider_id"),
        input_file=data.get("input_file"),
        output_file=data.get("output_file"),
        error_file=data.get("error_file"),
        completed=int(data.get("completed", 0)),
        failed=int(data.get("failed", 0)),
        submitted_at=data.get("submitted_at"),
        cancel_sent=bool(data.get("cancel_sent", False)),
        run_rest_live=bool(data.get("run_rest_live", False)),
        lease_owner=data.get("lease_owner"),
        lease_until=float(data.get("lease_until", 0)),
        final_status=data.get("final_status"),
        polled_at=data.get("polled_at"),
    )


@map_connection_errors
class RedisBatches:
    """The batch half of RedisJobStore (self.r, self.keys, self.lua and self._run come from
    it)."""

    def _batch_keys(self, job_id: str) -> list[str]:
        return [self.keys.job_key(job_id, "batches"), self.keys.jobs_batched]

    def open_batch(
        self, job_id, worker_id, *, batch_id, max_items, lease_s, hold_s, take_from=None
    ):
        reply = self._run(
            self.lua.open_batch,
            job_id,
            [
                batch_id,
                worker_id,
                max_items,
                lease_s * 1000,
                hold_s * 1000,
                BATCH_OWNER_PREFIX,
                job_id,
                take_from or "",
            ],
            extra_keys=self._batch_keys(job_id),
        )
        if reply[0] != b"ok":
            return ClaimRefused(codec.text(reply[0]))
        return _batch(reply[1])

    def lease_batch(self, job_id, batch_id, worker_id, *, lease_s, take_from=None):
        raw = self.lua.lease_batch(
            keys=self._batch_keys(job_id)[:1],
            args=[batch_id, worker_id, lease_s * 1000, take_from or ""],
        )
        return _batch(raw) if raw else None

    def update_batch(self, job_id, batch_id, worker_id, **changes):
        unknown = set(changes) - set(BATCH_FIELDS)
        if unknown:
            raise ValueError(f"update_batch: unknown fields {sorted(unknown)}")
        raw = self.lua.update_batch(
            keys=self._batch_keys(job_id), args=[batch_id, worker_id, json.dumps(changes), job_id]
        )
        return _batch(raw) if raw else None

    def list_batches(self, job_id):
        records = [_batch(raw) for raw in self.r.hvals(self.keys.job_key(job_id, "batches"))]
        return sorted(records, key=lambda b: (b.created_at, b.batch_id))

    def batch_job_ids(self):
        return sorted(codec.text(i) for i in self.r.smembers(self.keys.jobs_batched))

    def iter_batch_items(self, job_id, batch_id, page: int = 500) -> Iterator[BatchItem]:
        owner = (BATCH_OWNER_PREFIX + batch_id).encode()
        indexes = sorted(
            int(i)
            for i, o in self.r.hscan_iter(self.keys.job_key(job_id, "owners"), count=1000)
            if o == owner
        )
        contents = self.keys.job_key(job_id, "contents")
        for low in range(0, len(indexes), page):
            chunk = indexes[low : low + page]
            heads, names, sources, _meta = self._records(
                job_id, ("items", "names", "sources"), chunk
            )
            hashes = [codec.parse_head(h)[1] for h in heads]
            for index, field, name, source, text in zip(
                chunk, hashes, names, sources, self.r.hmget(contents, hashes), strict=True
            ):
                origin, offset, stat_sig = codec.parse_source(source)
                yield BatchItem(
                    index,
                    codec.text(name),
                    codec.stored_text(text),
                    codec.content_hash_of(field),
                    origin,
                    offset,
                    stat_sig,
                )

    def release_batch_items(self, job_id, batch_id):
        return int(
            self._run(self.lua.release_worker_items, job_id, [BATCH_OWNER_PREFIX + batch_id])
        )
