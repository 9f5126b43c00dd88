"""Creating a job on Redis: begin (its index entries in the same MULTI/EXEC), add its items a
batch a script (reused answers read first), finish, and delete (the JobStore protocol,
store/protocol.py; mixed into RedisJobStore)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict

import redis

from ...errors import BackendUnavailable
from ..protocol import JobRecord, JobSpec, NewItem, drops_content
from . import codec
from .connection import map_connection_errors
from .keys import BUCKET_ITEMS

#: Items per add_items script call, and the content bytes one call may carry.
ADD_BATCH_ITEMS = 1000
ADD_BATCH_BYTES = 8 * 1024 * 1024


@map_connection_errors
class RedisCreation:
    """Creating and deleting jobs (self.r, self.keys, self.lua, self.durable, self._run and
    self.get_job come from RedisJobStore)."""

    def begin_job(self, spec: JobSpec) -> None:
        created_ms = self.now() * 1000
        # One MULTI/EXEC: a process killed while sending it leaves nothing (Redis drops a MULTI
        # whose connection closes before EXEC). Indexes first all the same, so a job's keys are
        # never without the index entries that reach them.
        pipe = self.r.pipeline(transaction=True)
        # NX: a clashing id must not move the existing job in list_jobs.
        pipe.zadd(self.keys.jobs_created, {spec.job_id: created_ms}, nx=True)
        pipe.zadd(self.keys.jobs_ids, {spec.job_id: 0})
        self.lua.begin_job(
            keys=self.keys.job(spec.job_id),
            client=pipe,
            args=[
                f"{created_ms:.3f}",
                json.dumps(asdict(spec)),
                codec.opt(spec.max_tokens),
                spec.concurrency,
                spec.output_tokens_estimate,
                codec.opt(spec.max_output_tokens),
                int(drops_content(spec)),
                codec.opt(spec.max_cost),
                codec.cost_rates(spec),
            ],
        )
        try:
            pipe.execute()
        except redis.ResponseError as exc:
            if "job exists" in str(exc):
                raise ValueError(f"begin_job: job {spec.job_id!r} exists") from None
            raise

    def add_items(self, job_id: str, items: Iterable[NewItem]) -> None:
        spec, drop = self.r.hmget(self.keys.job_key(job_id, "meta"), ["spec", "drop_content"])
        reuse = spec is None or json.loads(spec).get("reuse", True)
        drops = codec.text(drop) == "1"  # begin_job: protocol.drops_content
        batch: list[NewItem] = []
        size = 0
        for it in items:
            if "\t" in it.content_hash:  # the items-hash record is tab-separated
                raise ValueError(f"add_items: content hash {it.content_hash!r} contains a tab")
            batch.append(it)
            size += len(it.content)
            if len(batch) >= ADD_BATCH_ITEMS or size >= ADD_BATCH_BYTES:
                self._add_batch(job_id, batch, self._batch_args(batch, reuse, drops))
                batch, size = [], 0
        if batch:
            self._add_batch(job_id, batch, self._batch_args(batch, reuse, drops))

    def _batch_args(self, batch: list[NewItem], reuse: bool, drops: bool) -> list:
        """add_items.lua's arguments for a batch, with the answers the index holds for it: two
        reads (the index, then the answers' texts) before the script. An answer whose job is
        deleted between them has no text and is asked again. Where the job drops contents (drops),
        a reused item's content is not sent: the script would not store it."""
        answers: dict[str, tuple[str, int, int, int, str]] = {}
        wanted = sorted({it.answer_key for it in batch if it.answer_key}) if reuse else []
        if wanted:
            stored = self.r.hmget(self.keys.answers, [codec.answer_field(k) for k in wanted])
            hits = [
                (k, codec.text(v).split("\t"))
                for k, v in zip(wanted, stored, strict=True)
                if v is not None
            ]
            if hits:
                pipe = self.r.pipeline(transaction=False)
                for _, (job, idx, *_charges) in hits:
                    pipe.hget(self.keys.bucket(job, "results", int(idx)), idx)
                for (key, (job, idx, tokens, *cost)), text in zip(
                    hits, pipe.execute(), strict=True
                ):
                    if text is not None:  # passed on as stored (compressed or not)
                        # an entry without a cost (three fields) spent nothing known
                        spent = int(cost[0]) if cost else 0
                        answers[key] = (job, int(idx), int(float(tokens)), spent, text)
        args: list = []
        for it in batch:
            found = answers.get(it.answer_key)
            args += [
                it.index,
                codec.item_head(it),
                it.name,
                codec.item_source(it),
                codec.content_field(it.content_hash),
                "" if found and drops else codec.stored(it.content),
                it.estimated_tokens,
                codec.answer_field(it.answer_key) if it.answer_key else "",
                *(found if found else ("", "", "", "", "")),
            ]
        return args

    def _add_batch(self, job_id: str, batch: list[NewItem], args: list) -> None:
        try:
            self._run(self.lua.add_items, job_id, args, items=[it.index for it in batch])
        except redis.ResponseError as exc:
            if "no such job" in str(exc):
                # The job begun a moment ago is gone: a failover promoted a replica that had not
                # received it yet (replication is asynchronous), or it was deleted meanwhile.
                raise BackendUnavailable(
                    f"Redis at {self.conn.where} no longer has the job being created (a failover "
                    "loses the writes just before it, or the job was deleted meanwhile); nothing "
                    "was created: run create again."
                ) from None
            if "already added" in str(exc):
                raise ValueError(f"add_items: {str(exc).removeprefix('ERR ')}") from None
            raise

    def finish_job(self, job_id: str) -> JobRecord:
        # The creator is told the job exists once a replica has it all (WAIT: durability.py;
        # replication keeps order, so the items added before come with it).
        with self.durable.writing() as client:
            self.lua.finish_job(keys=self.keys.job(job_id), client=client)
            self.durable.confirm(client, "a new job")
        job = self.get_job(job_id)
        if job is None:
            raise ValueError(f"finish_job: no job {job_id!r}")
        return job

    def delete_job(self, job_id: str) -> bool:
        # One MULTI/EXEC: the job's keys and its index entries go together, so an interrupted
        # delete leaves neither keys no index reaches nor index entries for no job. The script
        # is given every bucket up to max_index, read under WATCH: an item added meanwhile
        # makes the EXEC do nothing, and the delete starts again.
        meta = self.keys.job_key(job_id, "meta")
        with self.r.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(meta)
                    top = int(pipe.hget(meta, "max_index") or -1)
                    pipe.multi()
                    self.lua.delete_job(
                        keys=self.keys.job(job_id, buckets=range(top // BUCKET_ITEMS + 1)),
                        args=[job_id],
                        client=pipe,
                    )
                    pipe.delete(self.keys.job_key(job_id, "batches"))
                    pipe.srem(self.keys.jobs_batched, job_id)
                    for index in (
                        self.keys.jobs_active,
                        self.keys.jobs_created,
                        self.keys.jobs_ids,
                    ):
                        pipe.zrem(index, job_id)
                    return bool(pipe.execute()[0])
                except redis.WatchError as exc:
                    # redis-py says WatchError for a connection lost while watching too: that
                    # is the lost connection, not a change to read again.
                    if isinstance(exc.__context__, redis.ConnectionError | redis.TimeoutError):
                        raise exc.__context__ from None
