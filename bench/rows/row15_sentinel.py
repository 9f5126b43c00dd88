"""Row 15: Redis Sentinel (issue 47). What confirming each saved answer with a replica costs (WAIT
on, the default where a replica exists, against wait_replicas=0), in items/s and client CPU per
item; and how long a kill -9 of the primary stops the work: from the kill to the first item saved
on the promoted replica.

A primary, its replica and three Sentinels on loopback (hermes_bulk.testing.sentinels: the
Sentinels call a primary down after 1 s of silence), the loopback provider answering at once in
its own process, one `run --wait`-style process of 16 threads (bench.drive run) per case.
"""

from __future__ import annotations

import subprocess
import time

from ..core import Context, Line, RowResult, median, table, write_jsonl
from ..procs import FakeProviderProc, HermesEnv, stop_process

ROW = 15
TITLE = "Redis Sentinel: WAIT for a replica, and a failover"
THREADS = 16
#: A failover may stop the work for the Sentinels' down-after (1 s here) plus this much.
FAILOVER_GOAL_S = 5.0


def _first_save_after_kill(env: HermesEnv, cluster, src, n: int, ctx: Context) -> dict:
    """A job on one worker process; kill -9 of the primary mid-job; the seconds until the new
    primary holds more completed items than the old one had passed on."""
    import redis

    from hermes_bulk.store.redis.keys import RedisKeys

    job = env.create(src, "--concurrency", str(THREADS))
    env.cli("run", job)
    worker = env.spawn_worker(THREADS, ctx.dir("failover") / "worker.log")
    replica = redis.Redis(port=cluster.replica.port, db=1, socket_timeout=1)
    meta = RedisKeys("bench-failover").job_key(job, "meta")

    def completed() -> int:
        return int(replica.hget(meta, "completed") or 0)

    try:
        deadline = time.monotonic() + 60
        while completed() < n // 3:
            if time.monotonic() > deadline:
                raise RuntimeError("the job did not get under way")
            time.sleep(0.02)
        cluster.primary.kill()
        killed = time.monotonic()
        time.sleep(0.05)  # what the replica had received by the kill
        before = completed()
        while completed() <= before:
            if time.monotonic() - killed > 60:
                raise RuntimeError("nothing was saved on the new primary within 60 s")
            time.sleep(0.01)
        first_save_s = time.monotonic() - killed
    finally:
        stop_process(worker)
        replica.close()
    return {"first_save_s": first_save_s, "completed_at_kill": before}


def run(ctx: Context) -> RowResult:
    from hermes_bulk.testing.sentinels import DOWN_AFTER_MS, SentinelCluster

    n = 100 if ctx.quick else 3000
    src = write_jsonl(ctx.dir("src") / "items.jsonl", n)
    provider = FakeProviderProc(latency_s=0.0)
    runs: dict[str, list[dict]] = {"on": [], "off": []}
    failovers: list[dict] = []
    try:
        for r in range(ctx.rounds):
            cluster = SentinelCluster(ctx.dir(f"cluster-{r}")).start()
            try:
                for side in ("on", "off") if r % 2 == 0 else ("off", "on"):
                    # A prefix a case: no case reuses another's answers (they share the items).
                    query = f"prefix=bench-{side}-{r}" + (
                        "&wait_replicas=0" if side == "off" else ""
                    )
                    env = HermesEnv(
                        ctx.dir(f"{side}-{r}"),
                        backend=cluster.url(0, query),
                        base_url=provider.base_url,
                        max_concurrency=THREADS,
                    )
                    out = env.run_job(src, THREADS)
                    runs[side].append(out)
                    ctx.log(
                        f"  round {r + 1} WAIT {side}: {n / out['elapsed_s']:.0f} items/s, "
                        f"{out['cpu_s'] / n * 1000:.2f} ms CPU/item"
                    )
                env = HermesEnv(
                    ctx.dir(f"failover-{r}"),
                    backend=cluster.url(1, "prefix=bench-failover"),
                    base_url=provider.base_url,
                    max_concurrency=THREADS,
                    lease_seconds=30,
                )
                failovers.append(_first_save_after_kill(env, cluster, src, n, ctx))
                ctx.log(f"  round {r + 1} failover: {failovers[-1]}")
            finally:
                cluster.stop()
    except (RuntimeError, subprocess.SubprocessError) as exc:
        ctx.log(f"  row 15 failed: {exc}")
        raise
    finally:
        provider.stop()

    rate = {s: median([n / o["elapsed_s"] for o in runs[s]]) for s in runs}
    cpu = {s: median([o["cpu_s"] / n * 1000 for o in runs[s]]) for s in runs}
    first_save = median([f["first_save_s"] for f in failovers])
    limit_s = DOWN_AFTER_MS / 1000 + FAILOVER_GOAL_S
    result = RowResult(
        row=ROW,
        title=TITLE,
        compared_with="the same job with wait_replicas=0; the Sentinels' down-after",
        goal=f"a failover stops the work <= down-after + {FAILOVER_GOAL_S:.0f} s",
        setup=(
            f"{n:,} items a case at {THREADS} threads (job --concurrency the same); a primary, a "
            "replica and three Sentinels on loopback (down-after-milliseconds "
            f"{DOWN_AFTER_MS}); the loopback provider answers at once; {ctx.rounds} interleaved "
            "round(s), the median. WAIT on is the default where the primary has a replica: WAIT "
            "1 after each saved answer, on the connection that saved it. The failover: one "
            f"worker of {THREADS} threads, kill -9 of the primary after a third of the items, "
            "then the replica polled every 10 ms until it holds more completed items than it had "
            "received by the kill."
        ),
        raw={"on": runs["on"], "off": runs["off"], "failovers": failovers},
    )
    result.lines += [
        Line(
            "items/s, WAIT on",
            f"{rate['on']:.0f} items/s",
            f"WAIT off {rate['off']:.0f} items/s",
            rate["on"] / rate["off"],
            "",
            None,
        ),
        Line(
            "client CPU per item, WAIT on",
            f"{cpu['on']:.2f} ms/item",
            f"WAIT off {cpu['off']:.2f} ms/item",
            cpu["on"] / cpu["off"],
            "",
            None,
        ),
        Line(
            "kill -9 of the primary to the first item saved on the new one",
            f"{first_save:.2f} s",
            f"down-after {DOWN_AFTER_MS / 1000:.0f} s + {FAILOVER_GOAL_S:.0f} s",
            first_save / limit_s,
            "<= 1.00",
            first_save <= limit_s,
        ),
    ]
    result.details.append(
        table(
            ["case", "round", "seconds", "items/s", "client CPU ms/item"],
            [
                [f"WAIT {s}", str(r + 1), f"{o['elapsed_s']:.2f}", f"{n / o['elapsed_s']:.0f}"]
                + [f"{o['cpu_s'] / n * 1000:.2f}"]
                for s, outs in runs.items()
                for r, o in enumerate(outs)
            ]
            + [
                ["failover", str(r + 1), f"{f['first_save_s']:.2f}", "", ""]
                for r, f in enumerate(failovers)
            ],
        )
    )
    return result
