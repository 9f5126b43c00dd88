"""Reading jobs and items on Redis: one job, lists of jobs through the cross-job indexes, items
one by one or streamed a page of buckets a round trip, failed items, names, the sample's
candidates (the JobStore protocol, store/protocol.py; mixed into RedisJobStore). Nothing here
writes."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace

from ..protocol import CREATING, RUNNING, ItemDetail, ItemRecord, JobRecord, spread
from . import codec
from .connection import map_connection_errors
from .item_state import item_record, parse_state
from .keys import BUCKET_ITEMS

#: Job ids read per round trip when walking an index.
INDEX_PAGE = 200
#: At most this many ids from find_job_ids (as the SQLite store).
FIND_LIMIT = 10
#: Answer keys looked up per round trip by `answered`.
ANSWERED_PAGE = 1000
#: Buckets of names read per round trip by find_item.
FIND_BUCKETS = 64


@map_connection_errors
class RedisReads:
    """The reads of RedisJobStore (self.r, self.keys and self._active_ids come from it)."""

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

    def active_job_ids(self) -> list[str]:
        ids = self._active_ids()
        return [i for i, s in zip(ids, self._states(ids), strict=True) if s == RUNNING]

    def answered(self, keys: list[str]) -> set[str]:
        found: set[str] = set()
        for low in range(0, len(keys), ANSWERED_PAGE):
            page = keys[low : low + ANSWERED_PAGE]
            stored = self.r.hmget(self.keys.answers, [codec.answer_field(k) for k in page])
            found.update(k for k, v in zip(page, stored, strict=True) if v is not None)
        return found

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
                record = item_record(
                    index, codec.text(name), parse_state(state, meta), codec.stored_text(result)
                )
                if with_content:
                    record = replace(
                        record, content=codec.stored_text(by_hash[codec.parse_head(head)[1]])
                    )
                yield record

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
        record = item_record(
            index, codec.text(name), parse_state(state, meta), codec.stored_text(result)
        )
        return ItemDetail(record, codec.stored_text(content), codec.content_hash_of(field))

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
            item_record(
                index, codec.text(name), parse_state(state, meta), codec.stored_text(result)
            )
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

    def sample_pending(self, job_id: str, n: int) -> list[int]:
        pending = self.keys.job_key(job_id, "pending")
        ranks = spread(self.r.zcard(pending), n)
        pipe = self.r.pipeline(transaction=False)
        for rank in ranks:  # by rank: a million pending indexes are never read for five
            pipe.zrange(pending, rank, rank)
        return [int(found[0]) for found in pipe.execute() if found]

    def next_item_estimate(self, job_id: str) -> int | None:
        first = self.r.zrange(self.keys.job_key(job_id, "pending"), 0, 0)
        raw = (
            self.r.hget(self.keys.bucket(job_id, "items", int(first[0])), first[0])
            if first
            else None
        )
        return codec.parse_head(raw)[0] if raw is not None else None
