"""Row 2: latency-bound throughput. With the provider taking L seconds and C requests in
flight, nothing can beat Little's law, C / L items/s; the gap is what hermes-bulk adds.

SQLite: one process, `run --wait`'s embedded consumer with C threads. Redis: two
`hermes-bulk worker -w C` processes (a fleet of two), the job's concurrency 2 C, and `run`
from a third process that watches the store. Item counts are whole waves (a multiple of the
concurrency), so the ideal time is exactly waves x L.
"""

from __future__ import annotations

import os
import time

from ..core import Context, Line, RowResult, at_least, fmt_rate, median, rate, table, write_jsonl
from ..procs import FakeProviderProc, HermesEnv, proc_cpu_seconds, stop_process

ROW = 2
TITLE = "latency-bound throughput (provider latency, many items in flight)"


def run(ctx: Context) -> RowResult:
    latency, conc, waves = (0.05, 8, 3) if ctx.quick else (0.2, 64, 50)
    rounds = max(1, min(ctx.rounds, 2))
    provider = FakeProviderProc(latency_s=latency)
    cases = [
        # key, label, backend, worker processes, threads each, goal
        ("sqlite", f"SQLite, 1 process x {conc}", "sqlite", 0, conc, 0.9),
        ("redis2", f"Redis, 2 worker processes x {conc}", "redis", 2, conc, 0.9),
        ("redis1", f"Redis, 1 process x {conc}", "redis", 0, conc, None),
    ]
    runs: dict[str, list[dict]] = {c[0]: [] for c in cases}
    try:
        for r in range(rounds):
            for key, _label, backend, procs, threads, _goal in cases:
                total_conc = threads * max(1, procs)
                n = total_conc * waves
                src = write_jsonl(ctx.dir("src") / f"items-{n}.jsonl", n)
                home = ctx.dir(f"{key}-{r}")
                env = HermesEnv(
                    home,
                    backend=ctx.redis_url() if backend == "redis" else None,
                    base_url=provider.base_url,
                    max_concurrency=total_conc,
                )
                job = env.create(src, "--concurrency", str(total_conc))
                provider.configure()
                workers = [
                    env.spawn_worker(threads, home / f"worker-{i}.log") for i in range(procs)
                ]
                others = [provider.proc.pid] + ([ctx.redis.proc.pid] if backend == "redis" else [])
                try:
                    if procs:
                        time.sleep(
                            1.0
                        )  # let the workers finish starting: their CPU is counted from here
                    pids = {
                        "provider": [provider.proc.pid],
                        "redis": others[1:],
                        "workers": [w.pid for w in workers],
                    }
                    cpu0 = {k: sum(map(proc_cpu_seconds, v)) for k, v in pids.items()}
                    if procs:
                        out = env.drive("run", job, "--external", str(procs))
                    else:
                        out = env.drive("run", job, "--threads", str(threads))
                    cpu = {k: sum(map(proc_cpu_seconds, v)) - cpu0[k] for k, v in pids.items()}
                finally:
                    for w in workers:
                        stop_process(w)
                cpu["hermes-bulk"] = cpu.pop("workers") + out["cpu_s"]
                out["cores"] = {k: v / out["elapsed_s"] for k, v in cpu.items()}
                out["cores_busy"] = sum(out["cores"].values())
                stats = provider.stats()
                out.update(
                    n=n,
                    items_per_s=rate(n, out["elapsed_s"]),
                    ideal=total_conc / latency,
                    max_in_flight=stats["max_in_flight"],
                    requests=stats["requests"],
                )
                runs[key].append(out)
                ctx.log(
                    f"  round {r + 1} {key}: {out['items_per_s']:,.0f} items/s of "
                    f"{out['ideal']:,.0f}, {out['cores_busy']:.2f} cores busy "
                    f"({', '.join(f'{k} {v:.2f}' for k, v in out['cores'].items())})"
                )
    finally:
        provider.stop()

    result = RowResult(
        row=ROW,
        title=TITLE,
        compared_with=f"Little's law, concurrency / latency ({conc} / {latency} s "
        f"= {conc / latency:,.0f} items/s per {conc} in flight)",
        goal=">= 0.9 of it (SQLite); Redis with 2 worker processes x 64: >= 0.9 of 640/s",
        setup=(
            f"Provider latency {latency} s; {waves} waves of items (n = {waves} x concurrency); "
            f"timed from `run` to the store's count of finished items; median of {rounds} round(s)."
        ),
        raw=runs,
    )
    detail = []
    for key, label, _b, _p, _t, goal in cases:
        ideal = runs[key][0]["ideal"]
        ratio = median([o["items_per_s"] / o["ideal"] for o in runs[key]])
        goal_text, met = at_least(ratio, goal) if goal else ("", None)
        result.lines.append(
            Line(
                label,
                fmt_rate(median([o["items_per_s"] for o in runs[key]])),
                f"Little's law {fmt_rate(ideal)}",
                ratio,
                goal_text,
                met,
            )
        )
        for r, o in enumerate(runs[key]):
            detail.append(
                [
                    label,
                    str(r + 1),
                    f"{o['n']:,}",
                    f"{o['elapsed_s']:.2f}",
                    f"{o['n'] / (o['ideal']):.2f}",
                    f"{o['first_done_s']:.2f}",
                    str(o["max_in_flight"]),
                    f"{o['cores_busy']:.2f} of {os.cpu_count()} (hermes-bulk "
                    f"{o['cores']['hermes-bulk']:.2f})",
                ]
            )
    result.details.append(
        table(
            [
                "case",
                "round",
                "items",
                "seconds",
                "ideal seconds",
                "first result s",
                "most in flight",
                "cores busy",
            ],
            detail,
        )
    )
    result.details.append(
        "Cores busy: CPU seconds of every process of the run (hermes-bulk, the provider, "
        "redis-server) over the run's wall time."
    )
    return result
