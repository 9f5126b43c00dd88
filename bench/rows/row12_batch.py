"""Row 12: a job run through the provider's Batch API (create --batch, issue 13). From `create` to
`completed` for a job of 10,000 and of 100,000 items, against the loopback provider's batch
endpoints; what hermes-bulk adds beyond the provider's own processing (the seconds during which
the provider was processing a batch, which it reports), and the worker's peak RSS at both sizes:
batch files are written from the store and read back line by line, so it stays flat.

SQLite; one `hermes-bulk worker` child process (peak RSS from wait4), polling every 0.5 s; the
provider processes lines as fast as it can (no per-line delay), so its time is what it took.
"""

from __future__ import annotations

import json
import os
import signal
import time

from ..core import Context, Line, RowResult, fmt_s, table, write_jsonl
from ..procs import FakeProviderProc, HermesEnv

ROW = 12
TITLE = "a `--batch` job: overhead beyond the provider's batch time, memory"
#: hermes-bulk's own time (create to completed, less the provider's) for the large job, at most:
#: a tenth of an hour for 100,000 items, against a provider that may take up to its 24 h window.
#: The loopback provider answers 100,000 lines in seconds, so a ratio to its time would measure
#: the fake; most of ours is the store's per-item completion, the same step a live answer takes.
GOAL_OVERHEAD_S = 600.0
FLAT = 1.25  # the worker's peak RSS at the large size at most this many times the small size's


def _one(ctx: Context, provider: FakeProviderProc, n: int) -> dict:
    src = write_jsonl(ctx.dir("src") / f"items-{n}.jsonl", n)
    env = HermesEnv(
        ctx.dir(f"batch-{n}"), backend=None, base_url=provider.base_url, batch_poll_seconds=0.5
    )
    provider.configure()  # clears the records (and the provider's busy time)
    started = time.perf_counter()
    m = env.cli(
        "create",
        "Summarize this item in one line",
        "--over",
        str(src),
        "--batch",
        "--fresh",
        "--json",
    )
    job_id = json.loads(m.stdout)["job_id"]
    env.cli("run", job_id)
    worker = env.spawn_worker(4, ctx.dir("logs") / f"worker-{n}.log")
    try:
        while True:
            status = json.loads(env.cli("status", job_id, "--json").stdout)
            if status["completed"] + status["failed"] == n:
                break
            time.sleep(0.5)
        total = time.perf_counter() - started
    finally:
        worker.send_signal(signal.SIGINT)
        _, wait_status, rusage = os.wait4(
            worker.pid, 0
        )  # reaped here: peak RSS of that child alone
        worker.returncode = os.waitstatus_to_exitcode(wait_status)
    stats = provider.stats()
    busy = stats["batch_busy_s"]
    return {
        "items": n,
        "total_s": total,
        "provider_s": busy,
        "overhead_s": total - busy,
        "create_s": m.wall_s,
        "worker_mb": rusage.ru_maxrss / 1024,
        "batches": len(status["batches"]),
        "live_requests": stats["requests"],
        "batch_lines": stats["batch_lines"],
        "completed": status["completed"],
    }


def run(ctx: Context) -> RowResult:
    small, large = (100, 400) if ctx.quick else (10_000, 100_000)
    provider = FakeProviderProc()
    try:
        data = {str(n): _one(ctx, provider, n) for n in (small, large)}
    finally:
        provider.stop()
    for d in data.values():
        ctx.log(
            f"  {d['items']:,} items: {d['total_s']:.1f} s create-to-completed, provider "
            f"{d['provider_s']:.1f} s, worker {d['worker_mb']:.0f} MB, {d['batches']} batches"
        )
    a, b = data[str(small)], data[str(large)]
    result = RowResult(
        row=ROW,
        title=TITLE,
        compared_with="the provider's own processing time",
        goal="hermes-bulk's own time (create to completed minus the provider's batch time) <= "
        f"{GOAL_OVERHEAD_S:.0f} s "
        f"at {large:,} items; worker peak RSS at {large:,} <= {FLAT} x at {small:,}",
        setup=(
            f"JSONL of {small:,} and {large:,} items; create --batch, run, one `hermes-bulk worker "
            "-w 4` (HERMES_BULK_BATCH_POLL_SECONDS=0.5); SQLite; the loopback provider in its own "
            "process, answering batch lines without delay and reporting the seconds it spent "
            "processing batches; batches of 50,000 (the default). Timed from the start of create "
            "to the status that shows every item done."
        ),
        raw=data,
    )
    ratio = b["overhead_s"] / GOAL_OVERHEAD_S
    result.lines.append(
        Line(
            f"create to completed, {large:,} items",
            f"{fmt_s(b['total_s'])} ({fmt_s(b['overhead_s'])} ours, "
            f"{1000 * b['overhead_s'] / large:.1f} ms an item)",
            f"provider {fmt_s(b['provider_s'])}; {GOAL_OVERHEAD_S:.0f} s",
            ratio,
            "<= 1.00",
            ratio <= 1.0 and b["completed"] == large and b["live_requests"] == 0,
        )
    )
    growth = b["worker_mb"] / a["worker_mb"]
    result.lines.append(
        Line(
            f"worker peak RSS, {small:,} -> {large:,} items",
            f"{a['worker_mb']:.0f} -> {b['worker_mb']:.0f} MB",
            f"{small:,} items",
            growth,
            f"<= {FLAT}",
            growth <= FLAT,
        )
    )
    result.details.append(
        table(
            [
                "items",
                "create",
                "create to completed",
                "provider's time",
                "ours",
                "batches",
                "worker peak RSS",
            ],
            [
                [
                    f"{d['items']:,}",
                    fmt_s(d["create_s"]),
                    fmt_s(d["total_s"]),
                    fmt_s(d["provider_s"]),
                    fmt_s(d["overhead_s"]),
                    str(d["batches"]),
                    f"{d['worker_mb']:.0f} MB",
                ]
                for d in (a, b)
            ],
        )
    )
    return result
