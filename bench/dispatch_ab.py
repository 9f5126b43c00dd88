"""Dispatch before and after: one job run by `bench.drive run` (the embedded consumer) under two
checkouts, rounds interleaved, or under this one at several thread counts beside the bare pool.

    python bench/dispatch_ab.py ab OLD_SRC [--rounds 4] [--items 3200] [--threads 64] [--latency
    0.2] python bench/dispatch_ab.py threads [--items 4000] [--threads 1,4,16,64] [--latency 0]

OLD_SRC is the `src` folder of another checkout (`git worktree add /tmp/old <commit>`). Each
run gets a fresh SQLite data directory whose job its own code created; the loopback provider
runs in this process. Prints items/s and the run's CPU per item (the whole process: the
worker threads, the watching loop, SQLite); the load average is printed beside each round.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from hermes_bulk.testing.fake_provider import FakeProvider  # noqa: E402


def _source(n: int) -> str:
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", encoding="utf-8", delete=False) as f:
        for i in range(n):
            f.write(json.dumps({"id": i, "text": f"item {i} with a few words of text"}) + "\n")
    return f.name


def _env(src_dir: Path, base_url: str, threads: int) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": f"{src_dir}{os.pathsep}{ROOT}",
        "HERMES_BULK_HOME": tempfile.mkdtemp(),
        "HERMES_BULK_BASE_URL": base_url,
        "HERMES_BULK_API_KEY": "sk-bench-not-a-secret",
        "HERMES_BULK_MODEL": "fake-model",
        "HERMES_BULK_MAX_CONCURRENCY": str(max(threads, 16)),
    }


def _last_json(args: list[str], env: dict[str, str]) -> dict:
    out = subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, check=True, cwd=ROOT
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_job(src_dir: Path, source: str, n: int, threads: int, base_url: str) -> tuple[float, float]:
    """(items/s, CPU ms an item) of one job of n items run with `threads` threads."""
    env = _env(src_dir, base_url, threads)
    try:
        job = _last_json(
            [
                "-m",
                "hermes_bulk",
                "create",
                "Do",
                "--over",
                source,
                "--concurrency",
                str(threads),
                "--json",
            ],
            env,
        )["job_id"]
        out = _last_json(["-m", "bench.drive", "run", job, "--threads", str(threads)], env)
    finally:
        shutil.rmtree(env["HERMES_BULK_HOME"], ignore_errors=True)
    return n / out["elapsed_s"], 1000 * out["cpu_s"] / n


def bare_pool(source: str, n: int, threads: int, base_url: str) -> tuple[float, float]:
    env = _env(ROOT / "src", base_url, threads)
    try:
        out = _last_json(
            [
                "-m",
                "bench.drive",
                "pool",
                "--base-url",
                base_url,
                "--source",
                source,
                "--threads",
                str(threads),
            ],
            env,
        )
    finally:
        shutil.rmtree(env["HERMES_BULK_HOME"], ignore_errors=True)
    return n / out["elapsed_s"], 1000 * out["cpu_s"] / n


def main() -> None:
    parser = argparse.ArgumentParser(prog="python bench/dispatch_ab.py")
    sub = parser.add_subparsers(dest="what", required=True)
    ab = sub.add_parser("ab")
    ab.add_argument("old_src", type=Path)
    ab.add_argument("--rounds", type=int, default=4)
    ab.add_argument("--items", type=int, default=3200)
    ab.add_argument("--threads", type=int, default=64)
    ab.add_argument("--latency", type=float, default=0.2)
    scale = sub.add_parser("threads")
    scale.add_argument("--items", type=int, default=4000)
    scale.add_argument("--threads", default="1,4,16,64")
    scale.add_argument("--latency", type=float, default=0.0)
    args = parser.parse_args()
    provider = FakeProvider(latency_s=args.latency).start()
    source = _source(args.items)
    try:
        if args.what == "ab":
            sides = {"before": args.old_src.resolve(), "after": ROOT / "src"}
            got: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
            for r in range(args.rounds):
                order = list(sides) if r % 2 == 0 else list(sides)[::-1]
                for side in order:
                    got[side].append(
                        run_job(sides[side], source, args.items, args.threads, provider.base_url)
                    )
                    rate, cpu = got[side][-1]
                    print(
                        f"round {r + 1} {side}: {rate:,.0f} items/s, {cpu:.2f} ms CPU an item, "
                        f"load {os.getloadavg()[0]:.1f}",
                        flush=True,
                    )
            for side, runs in got.items():
                print(
                    f"{side}: median {statistics.median(x[0] for x in runs):,.0f} items/s, "
                    f"{statistics.median(x[1] for x in runs):.2f} ms CPU an item"
                )
        else:
            print(
                "| threads | hermes-bulk items/s | its CPU ms/item | bare pool items/s | its CPU "
                "ms/item | ratio |"
            )
            print("|---|---|---|---|---|---|")
            for threads in (int(t) for t in args.threads.split(",")):
                ours = run_job(ROOT / "src", source, args.items, threads, provider.base_url)
                pool = bare_pool(source, args.items, threads, provider.base_url)
                print(
                    f"| {threads} | {ours[0]:,.0f} | {ours[1]:.2f} | {pool[0]:,.0f} | "
                    f"{pool[1]:.2f} | {ours[0] / pool[0]:.2f} |  (load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
    finally:
        provider.stop()
        os.unlink(source)


if __name__ == "__main__":
    main()
