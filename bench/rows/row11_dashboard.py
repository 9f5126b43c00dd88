"""Row 11: the dashboard over a million-item job (issue 16). A SQLite job part-way through (60%
settled, one in a thousand failed, the rest pending; bench.drive partial), a `hermes-bulk
dashboard` child process, and every page and API read timed through HTTP, side by side with
the same over a small job. Then the export download of the whole job, streamed. The
dashboard's peak RSS (VmHWM) after all of it: a page never loads every item, and a download
streams them.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import time
from pathlib import Path

from ..core import Context, Line, RowResult, table, write_csv
from ..procs import PY, HermesEnv

ROW = 11
TITLE = "dashboard pages over a 1,000,000-item job"
GOAL_MS = 300.0  # each page's read, p95
FLAT = 1.25  # peak RSS at the large size at most this many times the small size's
TOKEN = "bench-dashboard-token-0123456789"


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _start(env: HermesEnv) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [PY, "-m", "hermes_bulk", "dashboard", "--port", "0"],
        env=env.env(HERMES_BULK_DASHBOARD_TOKEN=TOKEN),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    for line in proc.stdout:
        m = re.match(r"Open: (http://[^/]+)/", line)
        if m:
            return proc, m[1]
    raise RuntimeError("the dashboard printed no URL")


def _time(client, path: str, rounds: int) -> list[float]:
    client.get(
        path
    ).raise_for_status()  # warm: the first read of a cold page cache is not what a poll costs
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        client.get(path).raise_for_status()
        times.append((time.perf_counter() - t0) * 1000)
    return times


def _p95(values: list[float]) -> float:
    return sorted(values)[max(0, int(len(values) * 0.95) - 1)]


def run(ctx: Context) -> RowResult:
    import httpx

    small, large = (200, 2_000) if ctx.quick else (1_000, 1_000_000)
    rounds = 3 if ctx.quick else 30
    data: dict[str, dict] = {}
    for n in (small, large):
        src = write_csv(ctx.dir("src") / f"rows-{n}.csv", n)
        env = HermesEnv(ctx.dir(f"home-{n}"), backend=None, base_url="http://127.0.0.1:9/v1")
        t0 = time.perf_counter()
        job_id = env.create(src)
        made = env.drive("partial", job_id, "--share", "0.6", "--fail-every", "1000")
        ctx.log(
            f"  {n:,} items: created and 60% settled in {time.perf_counter() - t0:.0f} s "
            f"({made['failed']:,} failed)"
        )
        proc, base = _start(env)
        try:
            reads = {
                "jobs page": "/",
                "jobs API": "/api/jobs",
                "job page": f"/jobs/{job_id}",
                "job API": f"/api/jobs/{job_id}",
                "workers API": "/api/workers",
                "script": "/static/dashboard.js",
            }
            times: dict[str, list[float]] = {}
            with httpx.Client(
                base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
            ) as c:
                for name, path in reads.items():
                    times[name] = _time(c, path, rounds)
                shown = c.get(f"/api/jobs/{job_id}").json()
                pages_mb = _peak_rss_mb(proc.pid)
                t0 = time.perf_counter()
                size = 0
                with c.stream("GET", f"/api/jobs/{job_id}/export?format=csv") as response:
                    for chunk in response.iter_bytes():
                        size += len(chunk)
                export_s = time.perf_counter() - t0
            peak_mb = _peak_rss_mb(proc.pid)
        finally:
            proc.terminate()
            proc.wait(30)
            proc.stdout.close()
        data[str(n)] = {
            "median_ms": {k: statistics.median(v) for k, v in times.items()},
            "p95_ms": {k: _p95(v) for k, v in times.items()},
            "pages_rss_mb": pages_mb,
            "peak_rss_mb": peak_mb,
            "export_s": export_s,
            "export_mb": size / 1e6,
            "failed_shown": shown["failed_shown"],
            "settled": shown["job"]["completed"] + shown["job"]["failed"],
        }
        ctx.log(
            f"  {n:,}: p95 "
            + ", ".join(f"{k} {v:.0f} ms" for k, v in data[str(n)]["p95_ms"].items())
            + f"; RSS {pages_mb:.0f} MB after the pages, {peak_mb:.0f} MB after a "
            f"{size / 1e6:.0f} MB export "
            f"in {export_s:.1f} s"
        )

    result = RowResult(
        row=ROW,
        title=TITLE,
        compared_with=f"the same reads over {small:,} items",
        goal=f"every page's read p95 < {GOAL_MS:.0f} ms at {large:,} items; the dashboard's peak "
        f"RSS at {large:,} "
        f"<= {FLAT} x at {small:,}, the export download included",
        setup=(
            f"SQLite jobs of {small:,} and {large:,} CSV rows, 60% settled (one in a thousand "
            "failed) set-wise by bench.drive partial, the job running; `hermes-bulk dashboard "
            f"--port 0` as a child process; each read {rounds} times after one warm-up, over HTTP "
            "with the Bearer token (httpx, keep-alive); peak RSS is the dashboard's VmHWM; then "
            "`GET /api/jobs/ID/export?format=csv` streamed to the end."
        ),
        raw=data,
    )
    a, b = data[str(small)], data[str(large)]
    for name in b["p95_ms"]:
        p95 = b["p95_ms"][name]
        result.lines.append(
            Line(
                f"{name}, {large:,} items",
                f"p95 {p95:.0f} ms (median {b['median_ms'][name]:.0f})",
                f"{small:,} items: p95 {a['p95_ms'][name]:.0f} ms",
                p95 / max(a["p95_ms"][name], 0.1),
                f"< {GOAL_MS:.0f} ms",
                p95 < GOAL_MS,
            )
        )
    growth = b["peak_rss_mb"] / a["peak_rss_mb"]
    result.lines.append(
        Line(
            f"dashboard peak RSS, {large:,} items (pages and a {b['export_mb']:.0f} MB export)",
            f"{b['peak_rss_mb']:.0f} MB",
            f"{small:,} items: {a['peak_rss_mb']:.0f} MB",
            growth,
            f"<= {FLAT}",
            growth <= FLAT,
        )
    )
    result.details.append(
        table(
            ["read", *(f"{n:,} items: median / p95" for n in (small, large))],
            [
                [
                    name,
                    *(
                        f"{data[str(n)]['median_ms'][name]:.1f} / "
                        f"{data[str(n)]['p95_ms'][name]:.1f} ms"
                        for n in (small, large)
                    ),
                ]
                for name in b["p95_ms"]
            ],
        )
    )
    result.details.append(
        table(
            [
                "size",
                "RSS after the pages",
                "peak RSS after the export",
                "export",
                "failed items listed",
            ],
            [
                [
                    f"{n:,}",
                    f"{data[str(n)]['pages_rss_mb']:.0f} MB",
                    f"{data[str(n)]['peak_rss_mb']:.0f} MB",
                    f"{data[str(n)]['export_mb']:.0f} MB in {data[str(n)]['export_s']:.1f} s",
                    str(data[str(n)]["failed_shown"]),
                ]
                for n in (small, large)
            ],
        )
    )
    result.details.append(
        "Raw: " + json.dumps({k: {"p95_ms": v["p95_ms"]} for k, v in data.items()})
    )
    return result
