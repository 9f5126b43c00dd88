"""Row 5: budget admission latency. 8 processes x 2,000 admissions against a cap of 5,000:
p50 and p99 of one admission, and exactly 5,000 admitted (DESIGN.md invariant 8).

Each admission goes through `Budget.admit`, the path a bulk request or a cron call takes
(settings, the window, the policy and the ledger's one atomic check-and-count), in enforce mode
with `daily_limit` = the cap and no chat reserve.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time

from ..core import Context, Line, RowResult, at_most, table
from ..procs import PY, HermesEnv, proc_cpu_seconds

ROW = 5
TITLE = "budget admission latency"
GOAL_P99_MS = {"sqlite": 2.0, "redis": 1.0}


def make_admit(backend_url: str, cap: int):
    """A callable that makes one background admission against a ledger capped at `cap` on
    `backend_url` and returns True when it was admitted. Runs in each child process."""
    import os
    from pathlib import Path

    from hermes_bulk.budget.ledger import CallRecord
    from hermes_bulk.budget.policy import ALLOWED, BULK
    from hermes_bulk.budget.service import Budget
    from hermes_bulk.budget.settings import SettingsFile

    directory = Path(os.environ["HERMES_BULK_HOME"]) / "cron-budget"
    settings = SettingsFile(directory)
    for key, value in (
        ("chat_reserve", "0"),
        ("daily_limit", str(cap)),
        ("mode", "enforce"),
        ("ledger", backend_url if backend_url.startswith("redis") else ""),
    ):
        settings.set(key, value)
    budget = Budget(directory)
    call = CallRecord(
        call_class=BULK,
        profile="bench",
        job_id="bench",
        provider="bench",
        model="m",
        api_mode="chat_completions",
    )
    return lambda: budget.admit(call).decision == ALLOWED


def _measure(
    ctx: Context,
    backend: str,
    name: str,
    *,
    processes: int,
    per_process: int,
    cap: int,
    rate: float,
) -> dict:
    """One case on a fresh ledger: `processes` children, started together, each making
    `per_process` admissions (at `rate` a second each, 0 = back to back)."""
    url = (
        ctx.redis_url()
        if backend == "redis"
        else f"sqlite:///{ctx.dir(f'{backend}-{name}') / 'bulk.db'}"
    )
    env = HermesEnv(ctx.dir(f"{backend}-{name}"), backend=url, base_url="http://127.0.0.1:9/v1")
    redis_cpu0 = proc_cpu_seconds(ctx.redis.proc.pid) if backend == "redis" else 0.0
    start_at = time.time() + 3.0  # every process imports first, then all start together
    children = [
        subprocess.Popen(
            [
                PY,
                "-m",
                "bench.drive",
                "admit",
                "--factory",
                f"{__name__}:make_admit",
                "--backend",
                url,
                "--cap",
                str(cap),
                "--count",
                str(per_process),
                "--start-at",
                str(start_at),
                "--rate",
                str(rate),
            ],
            env=env.env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    outs = [json.loads(c.communicate()[0].strip().splitlines()[-1]) for c in children]
    redis_cpu = proc_cpu_seconds(ctx.redis.proc.pid) - redis_cpu0 if backend == "redis" else 0.0
    # A process's first admission opens the ledger (connection, schema, scripts): shown apart.
    first = [o["latencies_ms"][0] for o in outs]
    latencies = sorted(x for o in outs for x in o["latencies_ms"][1:])
    q = statistics.quantiles(latencies, n=100)
    wall = max(o["wall_s"] for o in outs)
    cpu = sum(o["cpu_s"] for o in outs)
    return {
        "p50": q[49],
        "p99": q[98],
        "max": latencies[-1],
        "first_max": max(first),
        "admitted": sum(o["admitted"] for o in outs),
        "calls": len(latencies) + len(first),
        "cpu_ms_per_call": 1000 * cpu / len(latencies),
        "cores_busy": (cpu + redis_cpu) / wall if wall else 0.0,
        "processes": processes,
        "rate": rate,
    }


def run(ctx: Context) -> RowResult:
    processes, per_process, cap = (2, 30, 40) if ctx.quick else (8, 2_000, 5_000)
    paced_rate = 100.0  # admissions a second per process: 800/s together, far above any provider's
    cases = {  # name: (processes, admissions each, cap, rate)
        "hammer": (processes, per_process, cap, 0.0),
        "alone": (1, per_process, per_process, 0.0),
        "paced": (processes, per_process // 4, cap, paced_rate),
    }
    runs: dict[str, dict] = {}
    for backend in ("sqlite", "redis"):
        for name, (n, each, case_cap, rate) in cases.items():
            runs[f"{backend}-{name}"] = _measure(
                ctx, backend, name, processes=n, per_process=each, cap=case_cap, rate=rate
            )
    result = RowResult(
        row=ROW,
        title=TITLE,
        compared_with="-",
        goal="p99 <= 2 ms (SQLite), <= 1 ms (Redis); exactly the cap admitted",
        setup=(
            f"{processes} processes x {per_process:,} admissions, started together and back to "
            f"back, against a cap of {cap:,} (the row's case, judged). For context, on fresh "
            f"ledgers: one process alone, {per_process:,} admissions back to back; and {processes} "
            f"processes at {paced_rate:g} admissions a second each ({per_process // 4:,} each), "
            "concurrent but without saturating the cores."
        ),
        raw=runs,
    )
    for backend in ("sqlite", "redis"):
        o = runs[f"{backend}-hammer"]
        goal, met = at_most(o["p99"] / GOAL_P99_MS[backend], 1.0)
        result.lines.append(
            Line(
                f"{backend}: p99, {processes} processes back to back",
                f"{o['p99']:.2f} ms (p50 {o['p50']:.2f} ms)",
                f"{GOAL_P99_MS[backend]:g} ms",
                o["p99"] / GOAL_P99_MS[backend],
                goal,
                met,
            )
        )
        result.lines.append(
            Line(
                f"{backend}: admitted",
                f"{o['admitted']:,} of {o['calls']:,}",
                f"cap {cap:,}",
                o["admitted"] / cap,
                "= 1.00",
                o["admitted"] == cap,
            )
        )
        for name, label in (
            ("alone", "one process alone"),
            ("paced", f"{processes} processes at {paced_rate:g}/s each"),
        ):
            c = runs[f"{backend}-{name}"]
            result.lines.append(
                Line(
                    f"{backend}: p99, {label}",
                    f"{c['p99']:.2f} ms (p50 {c['p50']:.2f} ms)",
                    f"{GOAL_P99_MS[backend]:g} ms",
                    c["p99"] / GOAL_P99_MS[backend],
                    "",
                    None,
                )
            )
    result.details.append(
        table(
            [
                "case",
                "processes",
                "admissions",
                "admitted",
                "p50 ms",
                "p99 ms",
                "max ms",
                "first, max ms",
                "CPU ms per admission",
                "cores busy",
            ],
            [
                [
                    k,
                    str(o["processes"]),
                    f"{o['calls']:,}",
                    f"{o['admitted']:,}",
                    f"{o['p50']:.3f}",
                    f"{o['p99']:.3f}",
                    f"{o['max']:.1f}",
                    f"{o['first_max']:.1f}",
                    f"{o['cpu_ms_per_call']:.3f}",
                    f"{o['cores_busy']:.2f} of {os.cpu_count()}",
                ]
                for k, o in runs.items()
            ],
        )
    )
    result.details.append(
        "p50, p99 and max leave out each process's first admission, which opens the ledger (its "
        "connection, schema check and scripts); the slowest first admission is shown apart. CPU ms "
        "per admission: the admitting processes' CPU (user + system) over their admissions. Cores "
        "busy: their CPU and redis-server's over the case's wall time. Back to back, eight "
        "processes keep every core busy, so an admission's latency includes waiting for a core "
        "(and, on SQLite, for the process holding the write lock to be scheduled again)."
    )
    return result
