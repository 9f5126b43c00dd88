"""Row 10: a fleet-size job (issue 15): 1,000,000 items through Redis with 4 worker processes
on two hosts, and 100,000 to show growth.

Hosts are network namespaces on a bridge, as tests/fleet/test_cross_host.py makes them (its
Hosts class): redis-server on one (password, no persistence: it is a bench), two `hermes-bulk
worker` processes on each of two others, each with its own data directory; the loopback
provider on the bridge, answering at once; `create` and the watching `run` on the bench's own
namespace. Measured: items/s from `run` to the store's count of finished items, Redis' peak
used_memory (INFO, a fresh server per size), and each worker's peak RSS (VmHWM) when the job
has finished. Root and iproute2 are needed; without them the row says it is not available.

BENCH_FLEET_SIZES (comma-separated) replaces the two sizes, e.g. to run only 100,000 on a
loaded machine.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

from ..core import (
    Context,
    Line,
    RowResult,
    at_least,
    at_most,
    fmt_rate,
    fmt_s,
    rate,
    table,
    write_jsonl,
)
from ..procs import PY, FakeProviderProc, HermesEnv, stop_process

ROW = 10
TITLE = "a fleet-size job: Redis, 4 worker processes on two hosts"
PROCS_PER_HOST, HOSTS, THREADS = 2, ("a", "b"), 16
FLAT = 1.25  # worker peak RSS at the large size at most this many times the small size's


if os.geteuid() != 0 or shutil.which("ip") is None:  # the runner lists the row as not available
    raise ImportError(name="network namespaces (root and iproute2)")


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _one_size(ctx: Context, Hosts, n: int) -> dict:
    import redis

    src = write_jsonl(ctx.dir("src") / f"items-{n}.jsonl", n)
    password = secrets.token_hex(12)
    with Hosts(["store", *HOSTS]) as hosts:
        provider = FakeProviderProc(latency_s=0.0, host=hosts.gateway)
        redis_dir = ctx.dir(f"redis-{n}")
        exe = shutil.which("redis-server") or "/usr/bin/redis-server"
        hosts.procs.append(
            subprocess.Popen(
                hosts.argv(
                    "store",
                    [
                        exe,
                        "--port",
                        "6379",
                        "--bind",
                        "0.0.0.0",
                        "--requirepass",
                        password,
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--dir",
                        str(redis_dir),
                        "--logfile",
                        str(redis_dir / "redis.log"),
                    ],
                ),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        ip = hosts.ips["store"]
        client = redis.Redis(host=ip, port=6379, password=password)
        try:
            for _ in range(150):
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    time.sleep(0.1)
            url = f"redis://:{password}@{ip}:6379/0?prefix=fleet"
            total = PROCS_PER_HOST * len(HOSTS) * THREADS
            cli = HermesEnv(
                ctx.dir(f"cli-{n}"), backend=url, base_url=provider.base_url, max_concurrency=total
            )
            created = cli.cli(
                "create",
                "Summarize this item in one line",
                "--over",
                str(src),
                "--concurrency",
                str(total),
                "--json",
                timeout=7200,
            )
            job = json.loads(created.stdout)["job_id"]
            after_create = client.info("memory")["used_memory"]
            workers = []
            for host in HOSTS:
                for k in range(PROCS_PER_HOST):
                    home = ctx.dir(f"{host}{k}-{n}")
                    env = HermesEnv(
                        home, backend=url, base_url=provider.base_url, max_concurrency=total
                    )
                    proc = subprocess.Popen(
                        hosts.argv(
                            host,
                            [
                                PY,
                                "-m",
                                "hermes_bulk",
                                "worker",
                                "-w",
                                str(THREADS),
                                "-q",
                                "-l",
                                str(home / "worker.log"),
                            ],
                        ),
                        env=env.env(),
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    hosts.procs.append(proc)
                    workers.append(proc)
            out = cli.drive(
                "run", job, "--external", str(len(workers)), "--poll", "0.5", timeout=7200
            )
            rss = [_peak_rss_mb(w.pid) for w in workers]
            info = client.info("memory")
            for w in workers:
                stop_process(w)
        finally:
            client.close()
            provider.stop()
    return {
        "n": n,
        "elapsed_s": out["elapsed_s"],
        "items_per_s": rate(n, out["elapsed_s"]),
        "completed": out["completed"],
        "failed": out["failed"],
        "create_s": created.wall_s,
        "redis_after_create": after_create,
        "redis_peak": info["used_memory_peak"],
        "redis_end": info["used_memory"],
        "worker_rss_mb": rss,
    }


def run(ctx: Context) -> RowResult:
    from tests.fleet.test_cross_host import Hosts  # the fleet tests' hosts: one way to make them

    sizes = (100, 200) if ctx.quick else (100_000, 1_000_000)  # quick: does it run (smoke test)
    if os.environ.get("BENCH_FLEET_SIZES"):
        sizes = tuple(int(s) for s in os.environ["BENCH_FLEET_SIZES"].split(","))
    data = {}
    for n in sizes:
        data[n] = d = _one_size(ctx, Hosts, n)
        ctx.log(
            f"  {n:,} items: {d['items_per_s']:,.0f} items/s ({d['completed']:,} completed, "
            f"{d['failed']} failed), Redis peak {d['redis_peak'] / 1e6:,.0f} MB, worker peak RSS "
            f"{max(d['worker_rss_mb']):.0f} MB"
        )
    result = RowResult(
        row=ROW,
        title=TITLE,
        compared_with="the same fleet at the smaller size (memory flat as items grow)",
        goal="the largest job finishes, every item completed; worker peak RSS at the largest "
        f"size <= {FLAT} x at the "
        "smallest",
        setup=(
            f"{' and '.join(f'{n:,}' for n in sizes)} JSONL items (about 120 bytes each); "
            f"redis-server on its own network namespace, {PROCS_PER_HOST} `hermes-bulk worker -w "
            f"{THREADS}` on each of {len(HOSTS)} other namespaces (job --concurrency "
            f"{PROCS_PER_HOST * len(HOSTS) * THREADS}), the loopback provider answering at once on "
            "the bridge; create and the watching `run` on the bench's namespace. items/s from "
            "`run` to the store's count of finished items; Redis peak used_memory from INFO (a "
            "fresh server per size); worker peak RSS is VmHWM at the end."
        ),
        raw={str(k): v for k, v in data.items()},
    )
    small, large = data[sizes[0]], data[sizes[-1]]
    for n, d in data.items():
        result.lines.append(
            Line(
                f"{n:,} items, 4 workers on 2 hosts",
                f"{fmt_rate(d['items_per_s'])} in {fmt_s(d['elapsed_s'])}, Redis peak "
                f"{d['redis_peak'] / 1e6:,.0f} MB, worker RSS {max(d['worker_rss_mb']):.0f} MB",
                f"{n:,} items",
                d["completed"] / n,
                *at_least(d["completed"] / n, 1.0),
            )
        )
    if len(data) > 1:
        growth = max(large["worker_rss_mb"]) / max(small["worker_rss_mb"])
        goal, met = at_most(growth, FLAT)
        result.lines.append(
            Line(
                f"worker peak RSS, {sizes[-1]:,} vs {sizes[0]:,}",
                f"x{growth:.2f}",
                f"{max(small['worker_rss_mb']):.0f} MB at {sizes[0]:,}",
                growth,
                goal,
                met,
            )
        )
    result.details.append(
        table(
            [
                "items",
                "create s",
                "run s",
                "items/s",
                "Redis after create MB",
                "Redis peak MB",
                "Redis at end MB",
                "worker peak RSS MB (each)",
            ],
            [
                [
                    f"{n:,}",
                    f"{d['create_s']:.1f}",
                    f"{d['elapsed_s']:.1f}",
                    f"{d['items_per_s']:,.0f}",
                    f"{d['redis_after_create'] / 1e6:,.0f}",
                    f"{d['redis_peak'] / 1e6:,.0f}",
                    f"{d['redis_end'] / 1e6:,.0f}",
                    ", ".join(f"{r:.0f}" for r in d["worker_rss_mb"]),
                ]
                for n, d in data.items()
            ],
        )
    )
    return result
