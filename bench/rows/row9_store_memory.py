"""Row 9: what a job costs Redis' memory (issue 15): after `create` over English text files,
and after the job completed, against the goals of the issue.

Redis' own `used_memory` (INFO memory) is read before `create`, after it, and after the job
completed (run --wait's embedded consumer, loopback provider), on a redis-server this run
started: the deltas are what the job holds. The contents are compressed in the store and a
completed file item's content is dropped (docs/decisions.md, issue 15), so after completion
the job holds its results (compressed; their stored size is read with HSTRLEN) and per-item
bookkeeping. SQLite's file size after each step is shown beside it (reported only).

The files are English prose: windows of 10,000 characters of the docstrings of the standard
library's modules, each headed by its number (so no two are equal and none is deduplicated).
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from pathlib import Path

from ..core import Context, Line, RowResult, at_most, table
from ..procs import FakeProviderProc, HermesEnv

ROW = 9
TITLE = "store memory: Redis used_memory after create and after completion"
FILE_CHARS = 10_000
PER_ITEM = 300  # bytes per item the goals allow beside the content or the results
CONTENT_SHARE = 0.5  # after create: at most this share of the raw content bytes (plus PER_ITEM)
#: INFO memory fields whose change is shown beside used_memory's (where the rest went).
_INFO_PARTS = (
    "used_memory_dataset",
    "used_memory_overhead",
    "mem_clients_normal",
    "used_memory_scripts",
    "used_memory_vm_eval",
    "used_memory_lua",
    "mem_not_counted_for_evict",
)
_MODULES = (
    "argparse",
    "asyncio.events",
    "asyncio.streams",
    "asyncio.tasks",
    "collections",
    "concurrent.futures",
    "contextlib",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "email.message",
    "email.utils",
    "functools",
    "http.client",
    "http.server",
    "importlib.metadata",
    "inspect",
    "io",
    "itertools",
    "json",
    "logging",
    "multiprocessing",
    "os",
    "pathlib",
    "pickle",
    "re",
    "shutil",
    "socket",
    "sqlite3",
    "ssl",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "typing",
    "unittest.case",
    "unittest.mock",
    "urllib.request",
    "uuid",
    "xml.etree.ElementTree",
    "zipfile",
)


def english_corpus() -> str:
    """The docstrings of some standard-library modules and of what they define: English prose."""
    with warnings.catch_warnings():  # inspecting a module touches its deprecated names (typing.io)
        warnings.simplefilter("ignore", DeprecationWarning)
        return _docstrings()


def _docstrings() -> str:
    parts: list[str] = []
    for name in _MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        objs = [
            module,
            *(
                v
                for _, v in inspect.getmembers(module)
                if inspect.isclass(v) or inspect.isfunction(v)
            ),
        ]
        for obj in objs:
            doc = inspect.getdoc(obj)
            if doc and len(doc) > 200:
                parts.append(doc)
    return "\n\n".join(dict.fromkeys(parts))


def write_text_files(folder: Path, n: int) -> int:
    """n English text files of about FILE_CHARS characters; returns their total size in bytes."""
    corpus = english_corpus()
    folder.mkdir(parents=True, exist_ok=True)
    total, step = 0, max(1, (len(corpus) - FILE_CHARS) // max(n, 1))
    for i in range(n):
        start = (i * step) % max(1, len(corpus) - FILE_CHARS)
        text = f"Document {i}\n\n" + corpus[start : start + FILE_CHARS]
        path = folder / f"doc-{i:06d}.txt"
        path.write_text(text, encoding="utf-8")
        total += path.stat().st_size
    return total


def _run(env: HermesEnv, folder: Path, threads: int) -> str:
    job = env.create(folder, "--concurrency", str(threads), "--fresh")
    env.drive("run", job, "--threads", str(threads))
    return job


def _sqlite_bytes(home: Path) -> int:
    return sum(p.stat().st_size for p in home.glob("bulk.db*"))


def run(ctx: Context) -> RowResult:
    n, threads = (100, 8) if ctx.quick else (5_000, 16)
    src = ctx.dir("docs")
    raw_bytes = write_text_files(src, n)
    provider = FakeProviderProc(latency_s=0.0)
    client = _redis_client(ctx)
    data: dict[str, dict] = {}
    try:
        for name in ("redis", "sqlite"):
            home = ctx.dir(name)
            url = ctx.redis_url() if name == "redis" else None
            env = HermesEnv(home, backend=url, base_url=provider.base_url, max_concurrency=threads)
            if url:  # a small job first: every script is loaded and Lua warm before `before`
                warm = ctx.dir("warm")
                write_text_files(warm, 3)
                env.cli("delete", "-y", _run(env, warm, threads))
            info0 = client.info("memory")
            before = info0["used_memory"] if url else 0
            job = env.create(src, "--concurrency", str(threads), "--fresh")
            created = client.info("memory")["used_memory"] - before if url else _sqlite_bytes(home)
            keys_created = _key_bytes(client, url) if url else {}
            env.drive("run", job, "--threads", str(threads))
            done = client.info("memory")["used_memory"] - before if url else _sqlite_bytes(home)
            keys = _key_bytes(client, url) if url else {}
            info1 = client.info("memory")
            parts = {k: info1[k] - info0[k] for k in _INFO_PARTS if k in info1}
            results = (
                _redis_result_bytes(client, url, job, n) if url else _sqlite_result_bytes(env, job)
            )
            left = None
            if url:  # what deleting the job does not give back is not the job's
                env.cli("delete", "-y", job)
                left = client.info("memory")["used_memory"] - before
            data[name] = {
                "created": created,
                "done": done,
                "results": results,
                "n": n,
                "raw": raw_bytes,
                "keys_created": keys_created,
                "keys_done": keys,
                "info_done": parts,
                "left": left,
            }
            ctx.log(
                f"  {name}: {created / n:,.0f} B/item after create, {done / n:,.0f} B/item after "
                "completion "
                f"(results {results / n:,.0f} B/item stored), after delete {left}; keys: "
                + ", ".join(
                    f"{k} {v / n:,.0f}" for k, v in sorted(keys.items(), key=lambda kv: -kv[1])
                )
                + "; INFO: "
                + ", ".join(f"{k} {v / n:,.0f}" for k, v in parts.items())
            )
    finally:
        provider.stop()
        client.close()

    result = RowResult(
        row=ROW,
        title=TITLE,
        compared_with="the raw content bytes; the results as stored",
        goal=(
            f"Redis used_memory after create <= {CONTENT_SHARE} x the raw content bytes + "
            f"{PER_ITEM} B/item; "
            f"after completion <= the stored (compressed) result bytes + {PER_ITEM} B/item"
        ),
        setup=(
            f"{n:,} English text files of about {FILE_CHARS:,} characters ({raw_bytes / n:,.0f} "
            f"bytes each, {raw_bytes / 1e6:,.1f} MB in all; see the module docstring), `create "
            f"--fresh`, then run --wait with {threads} threads against the loopback provider with "
            "no latency. Redis: the change of used_memory; SQLite: the size of bulk.db and its "
            "-wal."
        ),
        raw=data,
    )
    r = data["redis"]
    allowed = CONTENT_SHARE * r["raw"] + PER_ITEM * n
    goal, met = at_most(r["created"] / allowed, 1.0)
    result.lines.append(
        Line(
            "Redis, after create",
            f"{r['created'] / 1e6:,.2f} MB ({r['created'] / n:,.0f} B/item)",
            f"{CONTENT_SHARE} x {r['raw'] / 1e6:,.1f} MB + {PER_ITEM} B/item = "
            f"{allowed / 1e6:,.2f} MB",
            r["created"] / allowed,
            goal,
            met,
        )
    )
    allowed = r["results"] + PER_ITEM * n
    goal, met = at_most(r["done"] / allowed, 1.0)
    result.lines.append(
        Line(
            "Redis, after completion",
            f"{r['done'] / 1e6:,.2f} MB ({r['done'] / n:,.0f} B/item)",
            f"results {r['results'] / 1e6:,.2f} MB + {PER_ITEM} B/item = {allowed / 1e6:,.2f} MB",
            r["done"] / allowed,
            goal,
            met,
        )
    )
    s = data["sqlite"]
    result.lines.append(
        Line(
            "SQLite file, after create / after completion",
            f"{s['created'] / 1e6:,.2f} MB / {s['done'] / 1e6:,.2f} MB",
            f"raw content {s['raw'] / 1e6:,.1f} MB",
            s["created"] / s["raw"],
            "",
            None,
        )
    )
    for when in ("created", "done"):
        kinds = sorted(r[f"keys_{when}"].items(), key=lambda kv: -kv[1])
        result.details.append(
            f"Redis keys after {'create' if when == 'created' else 'completion'} (MEMORY USAGE, "
            "bytes/item): "
            + ", ".join(f"{k} {v / n:,.0f}" for k, v in kinds if v)
            + f"; in all {sum(v for _, v in kinds) / n:,.0f}."
        )
    result.details.append(
        f"used_memory after deleting the job: {r['left']:,} bytes above `before` (what the "
        "job's run left that is not the job's: script caches, the Lua heap)."
    )
    result.details.append(
        table(
            [
                "backend",
                "bytes/item after create",
                "bytes/item after completion",
                "stored result bytes/item",
                "raw content bytes/item",
            ],
            [
                [
                    k,
                    f"{v['created'] / n:,.0f}",
                    f"{v['done'] / n:,.0f}",
                    f"{v['results'] / n:,.0f}",
                    f"{v['raw'] / n:,.0f}",
                ]
                for k, v in data.items()
            ],
        )
    )
    return result


def _key_bytes(client, url: str) -> dict[str, int]:
    """MEMORY USAGE of each key of the run's prefix, by key kind (what the job holds, not Redis'
    own): a job's key by its name after the job's hash tag, the buckets of a per-item family
    together ("states:0", "states:1": states); P:answers as answers."""
    prefix = url.rsplit("prefix=", 1)[1]
    found: dict[str, int] = {}
    for key in client.scan_iter(match=f"*{prefix}*", count=1000):
        name = key.decode()
        kind = name.split("}:", 1)[1].split(":", 1)[0] if "}:" in name else name.rsplit(":", 1)[-1]
        found[kind] = found.get(kind, 0) + (client.memory_usage(key, samples=0) or 0)
    return found


def _redis_result_bytes(client, url: str, job: str, n: int) -> int:
    """The stored (compressed) size of the job's results: HSTRLEN of each in its bucket
    (keys.py)."""
    from hermes_bulk.store.redis.keys import RedisKeys

    keys = RedisKeys(url.rsplit("prefix=", 1)[1])
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        pipe.hstrlen(keys.bucket(job, "results", i), i)
    return sum(pipe.execute())


def _redis_client(ctx: Context):
    import redis

    return redis.Redis(port=ctx.redis.port)


def _sqlite_result_bytes(env: HermesEnv, job: str) -> int:
    import sqlite3

    with sqlite3.connect(env.home / "bulk.db") as conn:
        (total,) = conn.execute(
            "SELECT coalesce(sum(length(text)), 0) FROM results WHERE job_id = ?", (job,)
        ).fetchone()
    conn.close()
    return int(total)
