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
    return [json.loads(line) for line in cli("export", job_id, "--format", "jsonl", "--output", "-").stdout.splitlines()]


def _to_layout_1(raw: redis.Redis, keys: RedisKeys, job_id: str) -> None:
    """Rewrite a job into layout 1 and forget that the Redis was moved (P:layout)."""
    meta = keys.job_key(job_id, "meta")
    names = {k[2:]: v for k, v in raw.hgetall(meta).items() if k.startswith("n:")}
    top = int(raw.hget(meta, "max_index"))
    for i in range(top + 1):
        rec = {f: raw.hget(keys.bucket(job_id, f, i), i) for f in ITEM_FAMILIES}
        estimate, content_hash = rec["items"].split("\t")
        origin, offset, stat_sig = json.loads(rec["sources"]) if rec["sources"] else (rec["names"], -1, "0:0")
        raw.hset(keys.job_key(job_id, "items"), i,
                 f"{estimate}\t{content_hash}\t" + json.dumps([rec["names"], origin, offset, stat_sig]))
        if rec["states"]:
            st = {"a": 0, "w": 0, "r": 0, **json.loads(rec["states"])}
            for k in ("pv", "md"):
                if k in st:
                    st[k] = names[str(st[k])]
            raw.hset(keys.job_key(job_id, "states"), i, json.dumps(st))
        if rec["results"]:
            raw.hset(keys.job_key(job_id, "results"), i, rec["results"])
        if rec["keys"]:
            raw.hset(keys.job_key(job_id, "keys"), f"i:{i}", rec["keys"])
    for b in range(top // BUCKET_ITEMS + 1):
        raw.delete(*(keys.bucket(job_id, f, b * BUCKET_ITEMS) for f in ITEM_FAMILIES))
    raw.hdel(meta, "added", "names", *(k for k in raw.hkeys(meta) if k.startswith(("n:", "n="))))
    raw.delete(keys.layout)


def test_jobs_of_the_layout_before_buckets_run_export_reuse_and_delete(redis_cli, redis_url, tmp_path,
                                                                       fake_provider):
    cli = redis_cli
    done = cli.create("Summarise", _folder(tmp_path / "done", 4, "done"))
    cli("run", done, "--wait", timeout=120)
    before = _export(cli, done)
    waiting = cli.create("Summarise", _folder(tmp_path / "waiting", 3, "waiting"))
    raw = redis.Redis.from_url(redis_url.split("?")[0], decode_responses=True)
    keys = RedisKeys(prefix_of(redis_url))
    try:
        for job_id in (done, waiting):
            _to_layout_1(raw, keys, job_id)
        assert raw.hlen(keys.job_key(done, "items")) == 4 and raw.get(keys.layout) is None

        assert _export(cli, done) == before, "a completed job reads back as it was written"
        assert raw.get(keys.layout) == "2", "the first store that opened moved the jobs"
        assert not any(raw.exists(keys.job_key(j, f)) for j in (done, waiting) for f in ("items", "states", "results"))
        assert not any(k.startswith("i:") for k in raw.hkeys(keys.job_key(done, "keys")))

        fake_provider.reset_records()
        cli("run", waiting, "--wait", timeout=120)
        rows = _export(cli, waiting)
        assert [r["status"] for r in rows] == ["completed"] * 3 and all(r["result"] for r in rows)
        assert len(fake_provider.requests) == 3, "a moved pending item is claimed with its source"

        made = cli("create", "Summarise", "--over", str(tmp_path / "done")).stdout
        assert "4 answered before (reused), 0 to run" in made, "answers of a moved job are reused"

        cli("delete", "-y", done)
        assert not [v for v in raw.hvals(keys.answers) if v.startswith(done)], "its answers go with it"
        assert not [k for k in raw.scan_iter(match=f"*{done}*")]
    finally:
        raw.close()
