"""Row 1: dispatch overhead. The provider answers at once, so everything that is not the HTTP
call shows: claims, leases, the limiter, the queue, result writes.

Compared, round by round in alternating order, with a bare thread pool of the same size making
the same calls (bench.drive pool: httpx, same pool size, same request body). hermes-bulk runs
as `run --wait` does (embedded consumer, one process), timed from `run` to the store's count
of finished items. Each run gets a fresh data dir (SQLite) or key prefix (Redis).
"""

from __future__ import annotations

from ..core import Context, Line, RowResult, at_least, fmt_rate, median, rate, table, write_jsonl
from ..procs import FakeProviderProc, HermesEnv

ROW = 1
TITLE = "dispatch overhead (the provider answers at once)"
#: Per backend (issue 15: complete and claim in one store operation).
GOALS = {"sqlite": 0.8, "redis": 0.7}


def run(ctx: Context) -> RowResult:
    n, threads = (100, 16) if ctx.quick else (10_000, 16)
    src = write_jsonl(ctx.dir("src") / "items.jsonl", n)
    provider = FakeProviderProc(latency_s=0.0)
    sides = ["pool", "sqlite", "redis", "shared"]
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    try:
        for r in range(ctx.rounds):
            order = sides[r % 4 :] + sides[: r % 4]  # who goes first changes every round
            for side in order:
                provider.configure()
                cpu0 = provider.cpu_seconds()
                if side in ("pool", "shared"):
                    env = HermesEnv(ctx.dir(f"{side}{r}"), backend=None, base_url=provider.base_url)
                    client = "hermes" if side == "pool" else "shared"
                    out = env.drive_pool(provider.base_url, src, threads, client)
                else:
                    backend = ctx.redis_url() if side == "redis" else None
                    env = HermesEnv(
                        ctx.dir(f"{side}{r}"),
                        backend=backend,
                        base_url=provider.base_url,
                        max_concurrency=threads,
                    )
                    out = env.run_job(src, threads)
                out["server_cpu_s"] = provider.cpu_seconds() - cpu0
                out["requests"] = provider.stats()["requests"]
                out["items_per_s"] = rate(n, out["elapsed_s"])
                runs[side].append(out)
                ctx.log(f"  round {r + 1} {side}: {out['items_per_s']:,.0f} items/s")
    finally:
        provider.stop()

    result = RowResult(
        row=ROW,
        title=TITLE,
        compared_with="a bare thread pool of the same size making the same HTTP calls",
        goal=f"hermes-bulk >= {GOALS['sqlite']} (SQLite) and >= {GOALS['redis']} (Redis) of the "
        "bare pool's items/s",
        setup=(
            f"{n:,} items, {threads} threads (job --concurrency {threads}), loopback provider with "
            f"no latency in its own process; {ctx.rounds} interleaved round(s); the ratio is the "
            "median of each round's hermes-bulk / bare-pool ratio. The bare pool (bench.drive "
            "pool) is a ThreadPoolExecutor calling hermes-bulk's own HttpModelClient (httpx, one "
            "connection per thread) with the same request body, so the gap is all dispatch; a pool "
            "sharing one httpx.Client of the same size, as one would write it by hand, is shown "
            "too."
        ),
        raw=runs,
    )
    pool_median = median([o["items_per_s"] for o in runs["pool"]])
    for side, label in (
        ("sqlite", "SQLite, embedded consumer"),
        ("redis", "Redis, embedded consumer"),
    ):
        ratios = [
            h["items_per_s"] / p["items_per_s"]
            for h, p in zip(runs[side], runs["pool"], strict=True)
        ]
        ratio = median(ratios)
        goal, met = at_least(ratio, GOALS[side])
        result.lines.append(
            Line(
                label,
                fmt_rate(median([o["items_per_s"] for o in runs[side]])),
                f"bare pool {fmt_rate(pool_median)}",
                ratio,
                goal,
                met,
            )
        )
    shared = median(
        [
            s["items_per_s"] / p["items_per_s"]
            for s, p in zip(runs["shared"], runs["pool"], strict=True)
        ]
    )
    result.lines.append(
        Line(
            "bare pool, one shared httpx.Client",
            fmt_rate(median([o["items_per_s"] for o in runs["shared"]])),
            f"bare pool {fmt_rate(pool_median)}",
            shared,
            "",
            None,
        )
    )
    rows = []
    for side in sides:
        for r, o in enumerate(runs[side]):
            rows.append(
                [
                    side,
                    str(r + 1),
                    f"{o['elapsed_s']:.2f}",
                    f"{o['items_per_s']:,.0f}",
                    f"{o['cpu_s'] / n * 1000:.2f}",
                    f"{o['server_cpu_s'] / n * 1000:.2f}",
                ]
            )
    result.details.append(
        table(
            ["side", "round", "seconds", "items/s", "client CPU ms/item", "provider CPU ms/item"],
            rows,
        )
    )
    return result
