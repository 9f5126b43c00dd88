"""`python -m bench`: discover the rows, run them, print the tables, rewrite docs/benchmarks.md.

A row is a module `bench/rows/row<N>_<name>.py` with ROW (its number), TITLE and
`run(ctx) -> RowResult`. Adding a row is adding a module. A row whose module cannot be imported
prints "row N: not available (reason)" and produces no numbers.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import pkgutil
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import ModuleType

from . import report, rows
from .core import Context, RowResult, now_text, table
from .procs import ROOT

DOC = ROOT / "docs" / "benchmarks.md"
STORE = ROOT / "docs" / "benchmarks.json"
RESULTS = ROOT / "bench" / "results"
PACKAGES = ("hermes-bulk", "huey", "redis", "httpx", "httpcore", "tenacity", "pydantic")


def discover() -> dict[int, tuple[str, ModuleType | None, str | None]]:
    """{row number: (module name, module or None, why it is not available or None)}."""
    found: dict[int, tuple[str, ModuleType | None, str | None]] = {}
    for info in pkgutil.iter_modules(rows.__path__):
        name = info.name
        if not name.startswith("row") or not name[3:].split("_", 1)[0].isdigit():
            continue
        number = int(name[3:].split("_", 1)[0])
        try:
            module = importlib.import_module(f"{rows.__name__}.{name}")
        except ImportError as exc:
            found[number] = (name, None, f"{exc.name or exc} is not installed")
            continue
        found[number] = (name, module, None)
    return dict(sorted(found.items()))


def machine_info(redis_version: str | None = None) -> dict:
    mem_kib = 0
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    packages = {}
    for name in PACKAGES:
        try:
            packages[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            packages[name] = "-"
    import sqlite3

    packages["SQLite"] = sqlite3.sqlite_version
    exe = shutil.which("redis-server")
    if redis_version is None and exe:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.split()
        redis_version = out[2].removeprefix("v=") if len(out) > 2 else "?"
    packages["redis-server"] = redis_version or "-"
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--", "src"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "packages": packages,
        "commit": commit + (" (modified)" if dirty else ""),
    }


def parse_rows(text: str | None) -> list[int] | None:
    if not text:
        return None
    return sorted({int(part) for part in text.replace(" ", "").split(",") if part})


def run_rows(
    wanted: list[int] | None, *, quick: bool, rounds: int | None = None, log=print
) -> tuple[list[RowResult], dict[int, str]]:
    """Run the wanted rows (all when None); (results, {row: why it is not available})."""
    found = discover()
    results: list[RowResult] = []
    unavailable: dict[int, str] = {}
    for number in wanted or list(found):
        if number not in found:
            unavailable[number] = "no such row in bench/rows/"
            log(f"row {number}: not available (no such row in bench/rows/)")
            continue
        name, module, reason = found[number]
        if reason is not None:
            unavailable[number] = reason
            log(f"row {number}: not available ({reason})")
            continue
        with tempfile.TemporaryDirectory(prefix=f"hermes-bench-{number}-") as tmp:
            ctx = Context(quick=quick, tmp=Path(tmp), rounds=rounds or (1 if quick else 3), log=log)
            log(f"row {number}: {module.TITLE} …")
            started, load_before = time.monotonic(), os.getloadavg()[0]
            try:
                result = module.run(ctx)
            finally:
                ctx.close()
                from hermes_bulk.fleet import broker

                broker.close_all()
            result.quick, result.measured_at = quick, now_text()
            result.elapsed_s = time.monotonic() - started
            result.load = (load_before, os.getloadavg()[0])
            results.append(result)
            log(report.terminal_text(result) + "\n")
    return results, unavailable


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke sizes (seconds, not minutes); writes bench/results/quick.md, never docs/",
    )
    parser.add_argument("--rows", metavar="N,M", help="only these rows (default: all)")
    parser.add_argument(
        "--rounds", type=int, help="interleaved rounds where a row repeats (default 3, quick 1)"
    )
    parser.add_argument("--no-write", action="store_true", help="print only; write no files")
    args = parser.parse_args(argv)

    command = (
        "scripts/bench"
        + (" --quick" if args.quick else "")
        + (f" --rows {args.rows}" if args.rows else "")
    )
    log = lambda text: print(text, flush=True)  # noqa: E731
    log(
        f"{command}: {sys.executable}, results in {DOC if not args.quick else RESULTS / 'quick.md'}"
    )
    try:
        results, unavailable = run_rows(
            parse_rows(args.rows), quick=args.quick, rounds=args.rounds, log=log
        )
    except Exception:
        traceback.print_exc()
        return 1
    machine = machine_info()
    log("summary\n" + table(report.SUMMARY_HEADER, report.summary_rows(results)))
    for row, reason in sorted(unavailable.items()):
        log(f"row {row}: not available ({reason})")
    if args.no_write:
        return 0
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.quick:
        text = report.render(results, unavailable, command=command, machine=machine, analysis="")
        (RESULTS / "quick.md").write_text(text, encoding="utf-8")
        return 0
    store = report.load_store(STORE)
    store["machine"], store["command"] = machine, "scripts/bench"
    for r in results:
        store["rows"][str(r.row)] = r.as_dict()
        store["unavailable"].pop(str(r.row), None)
    for row, reason in unavailable.items():
        store["rows"].pop(str(row), None)
        store["unavailable"][str(row)] = reason
    report.save_store(STORE, store)
    all_results = [RowResult.from_dict(d) for d in store["rows"].values()]
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(
        report.render(
            all_results,
            {int(k): v for k, v in store["unavailable"].items()},
            command="scripts/bench",
            machine=machine,
            analysis=report.existing_analysis(DOC),
        ),
        encoding="utf-8",
    )
    log(f"wrote {DOC.relative_to(ROOT)} and {STORE.relative_to(ROOT)}")
    return 0
