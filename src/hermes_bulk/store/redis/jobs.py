"""RedisJobStore: the JobStore protocol (store/protocol.py) on Redis, one Lua script per change
of one job (the keys and what each holds: keys.py).

The cross-job indexes are updated outside the job's scripts (so each script stays in one slot),
in the same MULTI/EXEC as the script for begin_job, delete_job and set_state, in an order that
keeps each index a superset of what it must list (keys.py says how); readers skip entries whose
job is missing or still being created.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, replace

import redis

from ... import credentials
from ..protocol import (
    CREATING,
    PENDING,
    RUNNING,
    Claim,
    ClaimRefused,
    Event,
    ItemDetail,
    ItemError,
    ItemRecord,
    JobRecord,
    JobSpec,
    NewItem,
    Usage,
    WorkerInfo,
    drops_content,
    spec_from_json,
    spread,
)
from . import codec
from .batches import RedisBatches
from .connection import RedisConnection, map_connection_errors
from .durability import Durability
from .keys import BUCKET_ITEMS, RedisKeys
from .layout import ensure_layout
from .limits import ACQUIRE_TIMING_ARGS, turn_of
from .scripts import NEEDKEYS_ROUNDS, call_job_script, needed_buckets

#: Items per add_items script call, and the content bytes one call may carry.
ADD_BATCH_ITEMS = 1000
ADD_BATCH_BYTES = 8 * 1024 * 1024
#: Failed items returned to pending per retry_failed script call (Redis stays responsive).
RETRY_BATCH_ITEMS = 1000
#: Job ids read per round trip when walking an index.
INDEX_PAGE = 200
#: At most this many ids from find_job_ids (as the SQLite store).
FIND_LIMIT = 10
#: Answer keys looked up per round trip by `answered`.
ANSWERED_PAGE = 1000
#: Buckets of names read per round trip by find_item.
FIND_BUCKETS = 64


@map_connection_errors
class RedisJobStore(RedisBatches):
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

    # Creating ------------------------------------------------------------------------------
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
                        # an answer recorded before costs were kept has none
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
            if "no such job" in str(exc) or "already added" in str(exc):
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

    # Reading -------------------------------------------------------------------------------
    def get_job(self, job_id: str) -> JobRecord | None:
        return codec.job_from_meta(
            codec.decode_hash(self.r.hgetall(self.keys.job_key(job_id, "meta")))
        )

    def _metas(self, job_ids: list[str]) -> list[dict[str, str]]:
        pipe = self.r.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hgetall(self.keys.job_key(job_id, "meta"))
        return [codec.decode_hash(m) for m in pipe.execute()]

    def _states(self, job_ids: list[str]) -> list[str | None]:
        pipe = self.r.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hget(self.keys.job_key(job_id, "meta"), "state")
        return [codec.text(s) for s in pipe.execute()]

    def find_job_ids(self, prefix: str) -> list[str]:
        low, high = b"[" + prefix.encode(), b"(" + prefix.encode() + b"\xff"
        found: list[str] = []
        offset = 0
        while len(found) < FIND_LIMIT:
            ids = [
                codec.text(i)
                for i in self.r.zrange(
                    self.keys.jobs_ids, low, high, bylex=True, offset=offset, num=INDEX_PAGE
                )
            ]
            found += [i for i, s in zip(ids, self._states(ids), strict=True) if s and s != CREATING]
            if len(ids) < INDEX_PAGE:
                break
            offset += INDEX_PAGE
        return found[:FIND_LIMIT]

    def list_jobs(self, limit: int = 20) -> list[JobRecord]:
        jobs: list[JobRecord] = []
        start = 0
        while len(jobs) < limit:
            ids = [
                codec.text(i)
                for i in self.r.zrevrange(self.keys.jobs_created, start, start + INDEX_PAGE - 1)
            ]
            jobs += [j for j in map(codec.job_from_meta, self._metas(ids)) if j is not None]
            if len(ids) < INDEX_PAGE:
                break
            start += INDEX_PAGE
        return jobs[: max(limit, 0)]

    def _active_ids(self) -> list[str]:
        return [codec.text(i) for i in self.r.zrange(self.keys.jobs_active, 0, -1)]

    def active_job_ids(self) -> list[str]:
        ids = self._active_ids()
        return [i for i, s in zip(ids, self._states(ids), strict=True) if s == RUNNING]

    def _records(self, job_id: str, families: tuple[str, ...], indexes: list[int]) -> list[list]:
        """The records of `families` for `indexes` (None where absent), one list per family, and
        the job's META last: one round trip, an HMGET per family and bucket."""
        buckets: dict[int, list[int]] = {}
        for index in indexes:
            buckets.setdefault(index // BUCKET_ITEMS, []).append(index)
        pipe = self.r.pipeline(transaction=False)
        for family in families:
            for group in buckets.values():
                pipe.hmget(self.keys.bucket(job_id, family, group[0]), group)
        pipe.hgetall(self.keys.job_key(job_id, "meta"))
        replies = pipe.execute()
        found: list[list] = []
        for f in range(len(families)):
            values = dict(
                zip(
                    (i for group in buckets.values() for i in group),
                    (
                        v
                        for reply in replies[f * len(buckets) : (f + 1) * len(buckets)]
                        for v in reply
                    ),
                    strict=True,
                )
            )
            found.append([values[i] for i in indexes])
        return [*found, codec.decode_hash(replies[-1])]

    def iter_items(
        self, job_id: str, batch: int = 1000, *, with_content: bool = False
    ) -> Iterator[ItemRecord]:
        # Indexes are positions in the source (0..n-1), so a page is a range of bucket fields.
        max_index = self.r.hget(self.keys.job_key(job_id, "meta"), "max_index")
        if max_index is None:
            return
        for low in range(0, int(max_index) + 1, max(batch, 1)):
            page = list(range(low, min(low + batch, int(max_index) + 1)))
            heads, names, states, results, meta = self._records(
                job_id, ("items", "names", "states", "results"), page
            )
            hashes = (
                [codec.parse_head(h)[1] for h in heads if h is not None] if with_content else []
            )
            contents = self.r.hmget(self.keys.job_key(job_id, "contents"), hashes) if hashes else []
            by_hash = dict(zip(hashes, contents, strict=True))
            for index, head, name, state, result in zip(
                page, heads, names, states, results, strict=True
            ):
                if head is None:
                    continue
                record = self._item_record(
                    index, codec.text(name), codec.parse_state(state, meta), result
                )
                if with_content:
                    record = replace(
                        record, content=codec.stored_text(by_hash[codec.parse_head(head)[1]])
                    )
                yield record

    def list_events(self, job_id: str, limit: int = 100) -> list[Event]:
        if limit <= 0:
            return []
        return [
            codec.parse_event(e)
            for e in self.r.lrange(self.keys.job_key(job_id, "events"), -limit, -1)
        ]

    def get_item(self, job_id: str, index: int) -> ItemDetail | None:
        if index < 0:
            return None
        [head], [name], [state], [result], meta = self._records(
            job_id, ("items", "names", "states", "results"), [index]
        )
        if head is None or not meta:  # no such item, or deleted in the meantime
            return None
        _, field = codec.parse_head(head)
        # No content: dropped when the item completed (protocol.drops_content).
        content = self.r.hget(self.keys.job_key(job_id, "contents"), field)
        record = self._item_record(index, codec.text(name), codec.parse_state(state, meta), result)
        return ItemDetail(record, codec.stored_text(content), codec.content_hash_of(field))

    @staticmethod
    def _item_record(index: int, name: str, st: dict, result) -> ItemRecord:
        return ItemRecord(
            index=index,
            name=name,
            status=st.get("s", PENDING),
            result=codec.stored_text(result),
            error_type=st.get("et"),
            http_status=st.get("hs"),
            error_message=st.get("em"),
            tokens_in=st.get("ti", 0),
            tokens_out=st.get("to", 0),
            attempts=st.get("a", 0),
            provider=st.get("pv"),
            model=st.get("md"),
            reused_from=(st["rj"], st["ri"]) if "rj" in st else None,
            cost_nusd=int(st.get("c") or 0),
        )

    def answered(self, keys: list[str]) -> set[str]:
        found: set[str] = set()
        for low in range(0, len(keys), ANSWERED_PAGE):
            page = keys[low : low + ANSWERED_PAGE]
            stored = self.r.hmget(self.keys.answers, [codec.answer_field(k) for k in page])
            found.update(k for k, v in zip(page, stored, strict=True) if v is not None)
        return found

    def find_item(self, job_id: str, name: str) -> int | None:
        # No index on names: the names buckets are read FIND_BUCKETS a round trip, lowest first.
        top = int(self.r.hget(self.keys.job_key(job_id, "meta"), "max_index") or -1)
        wanted = name.encode("utf-8")
        step = FIND_BUCKETS * BUCKET_ITEMS
        for low in range(0, top + 1, step):
            pipe = self.r.pipeline(transaction=False)
            for first in range(low, min(low + step, top + 1), BUCKET_ITEMS):
                pipe.hgetall(self.keys.bucket(job_id, "names", first))
            found = [int(i) for page in pipe.execute() for i, n in page.items() if n == wanted]
            if found:
                return min(found)
        return None

    def failed_items(self, job_id: str, limit: int) -> list[ItemRecord]:
        if limit <= 0:
            return []
        indexes = [int(i) for i in self.r.zrange(self.keys.job_key(job_id, "failed"), 0, limit - 1)]
        if not indexes:
            return []
        heads, names, states, results, meta = self._records(
            job_id, ("items", "names", "states", "results"), indexes
        )
        return [
            self._item_record(index, codec.text(name), codec.parse_state(state, meta), result)
            for index, head, name, state, result in zip(
                indexes, heads, names, states, results, strict=True
            )
            if head is not None
        ]

    def item_names(self, job_id: str, indexes: Iterable[int]) -> dict[int, str]:
        wanted = sorted({i for i in indexes if i >= 0})
        if not wanted:
            return {}
        names, _meta = self._records(job_id, ("names",), wanted)
        return {i: codec.text(n) for i, n in zip(wanted, names, strict=True) if n is not None}

    def item_events(self, job_id: str, index: int, limit: int = 100) -> list[Event]:
        if limit <= 0:
            return []
        events = [
            e
            for e in map(
                codec.parse_event, self.r.lrange(self.keys.job_key(job_id, "events"), 0, -1)
            )
            if e.item_index == index
        ]
        return events[-limit:]

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

    def _raise_active_epoch(self, job_id: str, epoch: int) -> None:
        """Score the job's entry with its new run epoch, so a prune by a reaper that saw the job
        idle at an older epoch can no longer remove it (prune_active.lua). GT: a slower
        concurrent run never puts back an older epoch. A process that dies before this leaves
        the entry at its old score: a running job is never pruned, so only a prune decided
        before the run and arriving in between can drop it, and running the job again (`run`
        accepts a running job) lists it again."""
        self.r.zadd(self.keys.jobs_active, {job_id: epoch}, gt=True)

    def retry_failed(self, job_id: str) -> int:
        total, failed = 0, self.keys.job_key(job_id, "failed")
        while True:
            # The items it will take, read first: their buckets go with the script's one call.
            hint = self.r.zrange(failed, 0, RETRY_BATCH_ITEMS - 1)
            n = self._run(self.lua.retry_failed, job_id, [RETRY_BATCH_ITEMS], items=hint)
            total += n
            if n < RETRY_BATCH_ITEMS:
                return total

    # Items ---------------------------------------------------------------------------------
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
            attempts=st.get("a", 0),
            rate_limit_waits=st.get("w", 0),
        )

    def next_item_estimate(self, job_id: str) -> int | None:
        first = self.r.zrange(self.keys.job_key(job_id, "pending"), 0, 0)
        raw = (
            self.r.hget(self.keys.bucket(job_id, "items", int(first[0])), first[0])
            if first
            else None
        )
        return codec.parse_head(raw)[0] if raw is not None else None

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

    def sample_pending(self, job_id: str, n: int) -> list[int]:
        pending = self.keys.job_key(job_id, "pending")
        ranks = spread(self.r.zcard(pending), n)
        pipe = self.r.pipeline(transaction=False)
        for rank in ranks:  # by rank: a million pending indexes are never read for five
            pipe.zrange(pending, rank, rank)
        return [int(found[0]) for found in pipe.execute() if found]

    def set_sample(self, job_id: str, indexes: list[int] | None) -> bool:
        text = json.dumps(sorted(indexes)) if indexes else ""
        return bool(self.lua.set_sample(keys=self.keys.job(job_id), args=[text]))

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

    def _run(self, script, job_id: str, args: list, **buckets):
        """A job script with the buckets it touches in KEYS (scripts.call_job_script)."""
        return call_job_script(script, self.keys, job_id, args, **buckets)

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
        # hold a whole job's items; reading them here made a worker's heap grow with them.
        owners: dict[str, int] = {}
        for flat in self._each_active_job(self.lua.item_owners, []).values():
            for owner, n in zip(flat[::2], flat[1::2], strict=True):
                owner = codec.text(owner)
                owners[owner] = owners.get(owner, 0) + int(n)
        return owners

    def add_events(self, job_id: str, events: Iterable[Event]) -> None:
        events = list(events)
        if events:
            skipped = sum(e.kind == "skipped" for e in events)
            self.lua.add_events(
                keys=self.keys.job(job_id), args=[skipped, *codec.event_args(events)]
            )

    # Workers -------------------------------------------------------------------------------
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
