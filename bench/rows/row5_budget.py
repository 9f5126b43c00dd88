"""Row 5: budget admission latency. 8 processes x 2,000 admissions against a cap of 5,000:
p50 and p99 of one admission, and exactly 5,000 admitted (DESIGN.md invariant 8).

Each admission goes through `Budget.admit`, the path a bulk request or a cron call takes
(settings, the window, the policy and the ledger's one atomic check-and-count), in enforce mode
with `daily_limit` = the cap and no chat reserve.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
import time

from ..core import Context, Line, RowResult, at_most, table
from ..procs import PY, HermesEnv

ROW = 5
TITLE = "budget admission latency"
GOAL_P99_MS = {"sqlite": 2.0, "redis": 1.0}


def available() -> str | None:
    try:
        found = importlib.util.find_spec("hermes_bulk.budget") is not None
    except ImportError:
        found = False
    return None if found else "hermes_bulk.budget is not installed"


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
    for key, value in (("chat_reserve", "0"), ("daily_limit", str(cap)), ("mode", "enforce"),
                       ("ledger", backend_url if backend_url.startswith("redis") else "")):
        settings.set(key, value)
    budget = Budget(directory)
    call = CallRecord(call_class=BULK, profile="bench", job_id="bench", provider="bench", model="m",
                      api_mode="chat_completions")
    return lambda: budget.admit(call).decision == ALLOWED


def run(ctx: Context) -> RowResult:
    processes, per_process, cap = (8, 50, 200) if ctx.quick else (8, 2_000, 5_000)
    runs: dict[str, dict] = {}
    for backend in ("sqlite", "redis"):
        url = ctx.redis_url() if backend == "redis" else f"sqlite:///{ctx.dir('sqlite') / 'bulk.db'}"
        env = HermesEnv(ctx.dir(backend), backend=url, base_url="http://127.0.0.1:9/v1")
        start_at = time.time() + 3.0  # every process imports first, then all start together
        children = [subprocess.Popen([PY, "-m", "bench.drive", "admit", "--factory", f"{__name__}:make_admit",
                                      "--backend", url, "--cap", str(cap), "--count", str(per_process),
                                      "--start-at", str(start_at)], env=env.env(), stdout=subprocess.PIPE,
                                     text=True) for _ in range(processes)]
        outs = [json.loads(c.communicate()[0].strip().splitlines()[-1]) for c in children]
        latencies = sorted(x for o in outs for x in o["latencies_ms"])
        q = statistics.quantiles(latencies, n=100)
        runs[backend] = {"p50": q[49], "p99": q[98], "admitted": sum(o["admitted"] for o in outs),
                         "calls": len(latencies)}
    result = RowResult(
        row=ROW, title=TITLE, compared_with="-",
        goal="p99 <= 2 ms (SQLite), <= 1 ms (Redis); exactly the cap admitted",
        setup=f"{processes} processes x {per_process:,} admissions, started together, against a cap of {cap:,}.",
        raw=runs)
    for backend, o in runs.items():
        goal, met = at_most(o["p99"] / GOAL_P99_MS[backend], 1.0)
        result.lines.append(Line(f"{backend}: p99", f"{o['p99']:.2f} ms (p50 {o['p50']:.2f} ms)",
                                 f"{GOAL_P99_MS[backend]:g} ms", o["p99"] / GOAL_P99_MS[backend], goal, met))
        result.lines.append(Line(f"{backend}: admitted", f"{o['admitted']:,} of {o['calls']:,}", f"cap {cap:,}",
                                 o["admitted"] / cap, "= 1.00", o["admitted"] == cap))
    result.details.append(table(["backend", "p50 ms", "p99 ms", "admitted"],
                                [[b, f"{o['p50']:.3f}", f"{o['p99']:.3f}", str(o["admitted"])] for b, o in runs.items()]))
    return result
