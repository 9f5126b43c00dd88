"""Jobs written by the Redis layout before the buckets (layout 1) keep working: the first store
that opens the Redis moves them (store/redis/layout.py), then run, export, reuse and delete
work on them through real CLI processes.

Layout 1, as keys.py described it before: one hash per family for the whole job, items
"<estimate>\\t<content_hash>\\t<JSON [name, origin, offset, stat_sig]>", states as JSON with the
provider and model spelled out and zero counts written, results, and "i:<index>" -> answer key
in the job's keys hash. `_to_layout_1` rewrites jobs the CLI made into exactly that.
"""

from __future__ import annotations

import json

import pytest
import redis

from hermes_bulk.store.redis.item_state import STATUS_CODES
from hermes_bulk.store.redis.keys import BUCKET_ITEMS, ITEM_FAMILIES, RedisKeys

from .contract.conftest import prefix_of


@pytest.fixture
def redis_cli(cli, redis_url):
    cli.env["HERMES_BULK_BACKEND"] = redis_url
    return cli


def _folder(path, n: int, word: str):
    path.mkdir()
    for i in range(n):
        (path / f"{word}-{i}.txt").write_text(f"{word} number {i}\n")
    return path


def _export(cli, job_id: str) -> list[dict]:
    return [
        json.loads(line)
        for line in cli("export", job_id, "--format", "jsonl", "--output", "-").stdout.splitlines()
    ]


def _hex(field: bytes) -> bytes:
    """A hash as layout 1 spelled it (codec.content_field / answer_field wrote its bytes)."""
    if len(field) == 17 and field[:1] == b"\x00":
        return b"b2:" + field[1:].hex().encode()
    return field.hex().encode() if len(field) == 16 else field


def _to_layout_1(raw: redis.Redis, keys: RedisKeys, job_id: str) -> None:
    """Rewrite a job into layout 1 and forget that the Redis was moved (P:layout)."""
    meta = keys.job_key(job_id, "meta")
    names = {
        k[2:].decode(): v.decode() for k, v in raw.hgetall(meta).items() if k.startswith(b"n:")
    }
    top = int(raw.hget(meta, "max_index"))
    for i in range(top + 1):
        rec = {f: raw.hget(keys.bucket(job_id, f, i), i) for f in ITEM_FAMILIES}
        estimate, field = rec["items"].split(b"\t", 1)
        name = rec["names"].decode()
        origin, offset, stat_sig = (
            json.loads(rec["sources"]) if rec["sources"] else (name, -1, "0:0")
        )
        raw.hset(
            keys.job_key(job_id, "items"),
            i,
            estimate
            + b"\t"
            + _hex(field)
            + b"\t"
            + json.dumps([name, origin, offset, stat_sig]).encode(),
        )
        content = raw.hget(keys.job_key(job_id, "contents"), field)
        if content is not None:
            raw.hset(keys.job_key(job_id, "contents"), _hex(field), content)
            raw.hdel(keys.job_key(job_id, "contents"), field)
        if rec["states"]:
            st = {"a": 0, "w": 0, "r": 0, **json.loads(rec["states"])}
            st["s"] = {v: k for k, v in STATUS_CODES.items()}[st["s"]]
            for k in ("pv", "md"):
                if k in st:
                    st[k] = names[str(st[k])]
            raw.hset(keys.job_key(job_id, "states"), i, json.dumps(st))
        if rec["results"]:
            raw.hset(keys.job_key(job_id, "results"), i, rec["results"])
        if rec["keys"]:
            raw.hset(keys.job_key(job_id, "keys"), f"i:{i}", _hex(rec["keys"]))
            first = raw.hget(keys.job_key(job_id, "keys"), b"k:" + rec["keys"])
            if first is not None:
                raw.hset(keys.job_key(job_id, "keys"), b"k:" + _hex(rec["keys"]), first)
                raw.hdel(keys.job_key(job_id, "keys"), b"k:" + rec["keys"])
    for b in range(top // BUCKET_ITEMS + 1):
        raw.delete(*(keys.bucket(job_id, f, b * BUCKET_ITEMS) for f in ITEM_FAMILIES))
    raw.hdel(meta, "added", "names", *(k for k in raw.hkeys(meta) if k.startswith((b"n:", b"n="))))
    for key, value in raw.hgetall(keys.answers).items():
        if len(key) == 16:
            raw.hset(keys.answers, _hex(key), value)
            raw.hdel(keys.answers, key)
    raw.delete(keys.layout)


def test_jobs_of_the_layout_before_buckets_run_export_reuse_and_delete(
    redis_cli, redis_url, tmp_path, fake_provider
):
    cli = redis_cli
    done = cli.create("Summarise", _folder(tmp_path / "done", 4, "done"))
    cli("run", done, "--wait", timeout=120)
    before = _export(cli, done)
    waiting = cli.create("Summarise", _folder(tmp_path / "waiting", 3, "waiting"))
    raw = redis.Redis.from_url(redis_url.split("?")[0])
    keys = RedisKeys(prefix_of(redis_url))
    try:
        for job_id in (done, waiting):
            _to_layout_1(raw, keys, job_id)
        assert raw.hlen(keys.job_key(done, "items")) == 4 and raw.get(keys.layout) is None
        assert all(len(k) == 32 for k in raw.hkeys(keys.answers)), "layout 1: answer keys in hex"

        assert _export(cli, done) == before, "a completed job reads back as it was written"
        assert raw.get(keys.layout) == b"2", "the first store that opened moved the jobs"
        assert not any(
            raw.exists(keys.job_key(j, f))
            for j in (done, waiting)
            for f in ("items", "states", "results")
        )
        assert not any(k.startswith(b"i:") for k in raw.hkeys(keys.job_key(done, "keys")))
        assert all(len(k) == 16 for k in raw.hkeys(keys.answers)), "answer keys as their bytes"

        fake_provider.reset_records()
        cli("run", waiting, "--wait", timeout=120)
        rows = _export(cli, waiting)
        assert [r["status"] for r in rows] == ["completed"] * 3 and all(r["result"] for r in rows)
        assert len(fake_provider.requests) == 3, "a moved pending item is claimed with its source"

        made = cli("create", "Summarise", "--over", str(tmp_path / "done")).stdout
        assert "4 answered before (reused), 0 to run" in made, "answers of a moved job are reused"

        cli("delete", "-y", done)
        assert not [v for v in raw.hvals(keys.answers) if v.startswith(done.encode())], (
            "its answers go with it"
        )
        assert not list(raw.scan_iter(match=f"*{done}*"))
    finally:
        raw.close()


def test_a_move_interrupted_anywhere_is_finished_by_the_next_store_that_opens(redis_url):
    from hermes_bulk.fleet import broker
    from hermes_bulk.sources import content_hash
    from hermes_bulk.store.protocol import NOT_STARTED, RUNNING, JobSpec, NewItem, Usage

    first = broker.build_backend(redis_url)
    store = first.store
    job_id = "moved0000001"
    store.begin_job(
        JobSpec(
            job_id=job_id,
            instruction="x",
            source="/s",
            source_kind="directory",
            concurrency=9,
            retries=1,
            provider_key="p:test",
        )
    )
    store.add_items(
        job_id,
        [
            NewItem(
                i,
                f"n{i}",
                f"c{i % 150}",
                content_hash(f"c{i % 150}"),
                f"n{i}",
                -1,
                "1:1",
                5,
                answer_key=f"{i % 150:032x}",
            )
            for i in range(300)
        ],
    )
    store.finish_job(job_id)
    store.set_state(job_id, RUNNING, from_states=[NOT_STARTED])
    for _ in range(100):
        c = store.claim_item(job_id, 0, "w1", lease_s=30, max_running=99)
        store.complete_item(
            job_id, c.index, "w1", f"r{c.index}", Usage(1, 1), provider="pv", model="md"
        )
    before = list(store.iter_items(job_id, with_content=True))
    raw = redis.Redis.from_url(redis_url.split("?")[0])
    try:
        _to_layout_1(raw, store.keys, job_id)
        store.lua.migrate_layout(  # a move stopped part-way
            keys=store.keys.job(job_id, buckets=[0, 1]), args=[0, 140]
        )
        assert (
            raw.hlen(store.keys.job_key(job_id, "items")) == 159
            and raw.get(store.keys.layout) is None
        )
        second = broker.build_backend(redis_url)
        try:
            assert list(second.store.iter_items(job_id, with_content=True)) == before
            assert raw.get(store.keys.layout) == b"2" and not raw.exists(
                store.keys.job_key(job_id, "items")
            )
            c = second.store.claim_item(job_id, 0, "w1", lease_s=30, max_running=99)
            assert (c.index, c.content, c.origin) == (100, "c100", "n100")
        finally:
            second.close()
    finally:
        raw.close()
        first.close()
