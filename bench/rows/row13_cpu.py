"""Row 13: client CPU per item (issue 31). What a fleet buys is CPU per item: the provider
answers at once, and the CPU seconds the client process spent from `run` to the last item are
divided by the items, at 1, 16 and 64 threads, on both backends, beside a bare thread pool making
the same HTTP calls with the same client (bench.drive pool --client hermes).

One process each (`run --wait`'s embedded consumer); interleaved rounds, the median per case.
"""

from __future__ import annotations

from ..core import Context, Line, RowResult, median, table, write_jsonl
from ..procs import FakeProviderProc, HermesEnv

ROW = 13
TITLE = "client CPU per item (the provider answers at once)"
THREADS = (1, 16, 64)
#: Issue 31: at most this many CPU milliseconds an item at 16 threads, on both backends.
GOAL_MS = 1.2


def _cpu_ms(out: dict, n: int) -> float:
    return out["cpu_s"] / n * 1000


def run(ctx: Context) -> RowResult:
    n = 60 if ctx.quick else 3000
    src = write_jsonl(ctx.dir("src") / "items.jsonl", n)
    provider = FakeProviderProc(latency_s=0.0)
    sides = ["pool", "sqlite", "redis"]
    runs: dict[tuple[str, int], list[dict]] = {(s, t): [] for s in sides for t in THREADS}
    try:
        for r in range(ctx.rounds):
            order = sides[r % 3 :] + sides[: r % 3]
            for threads in THREADS:
                for side in order:
                    provider.configure()
                    name = f"{side}-{threads}-{r}"
                    if side == "pool":
                        env = HermesEnv(ctx.dir(name), backend=None, base_url=provider.base_url)
                        out = env.drive_pool(provider.base_url, src, threads)
                    else:
                        env = HermesEnv(
                            ctx.dir(name),
                            backend=ctx.redis_url() if side == "redis" else None,
                            base_url=provider.base_url,
                            max_concurrency=max(threads, 16),
                        )
                        out = env.run_job(src, threads)
                    runs[(side, threads)].append(out)
                    ctx.log(f"  round {r + 1} {side} x {threads}: {_cpu_ms(out, n):.2f} ms/item")
    finally:
        provider.stop()

    result = RowResult(
        row=ROW,
        title=TITLE,
        compared_with="a bare thread pool of the same size making the same HTTP calls",
        goal=f"<= {GOAL_MS} ms of client CPU an item at 16 threads, on both backends",
        setup=(
            f"{n:,} items per case, 1, 16 and 64 threads (job --concurrency the same), loopback "
            f"provider with no latency in its own process; {ctx.rounds} interleaved round(s), the "
            "median per case. CPU is the client process's user + system time (getrusage) from "
            "`run` (or the pool's first call) to the last item, so start-up is left out."
        ),
        raw={f"{s}-{t}": o for (s, t), o in runs.items()},
    )
    pool = {t: median([_cpu_ms(o, n) for o in runs[("pool", t)]]) for t in THREADS}
    for side, label in (("sqlite", "SQLite"), ("redis", "Redis")):
        for threads in THREADS:
            ms = median([_cpu_ms(o, n) for o in runs[(side, threads)]])
            goal, met = (f"<= {GOAL_MS} ms", ms <= GOAL_MS) if threads == 16 else ("", None)
            result.lines.append(
                Line(
                    f"{label}, {threads} thread{'s' if threads > 1 else ''}",
                    f"{ms:.2f} ms/item",
                    f"bare pool {pool[threads]:.2f} ms/item",
                    ms / pool[threads] if pool[threads] else None,
                    goal,
                    met,
                )
            )
    result.details.append(
        table(
            ["side", "threads", "round", "seconds", "client CPU ms/item"],
            [
                [side, str(t), str(r + 1), f"{o['elapsed_s']:.2f}", f"{_cpu_ms(o, n):.2f}"]
                for (side, t), outs in runs.items()
                for r, o in enumerate(outs)
            ],
        )
    )
    return result
