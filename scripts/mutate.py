"""Run cosmic-ray over the targets of scripts/mutate_targets.toml, each in a throwaway copy.

Why cosmic-ray: it writes each mutant into the source file on disk and runs a test command, so
every process the tests start (`hermes-bulk` commands, workers, a Hermes gateway) runs the
mutant too. mutmut 3 switches mutants inside the test interpreter, which those processes never
see. The copy keeps the mutants away from the working tree; PYTHONPATH points every process at
the copy's src/ (it comes before the editable install's path).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ROOT / "scripts" / "mutate_targets.toml"
COPIED = ("src", "tests", "pyproject.toml")


def load_targets() -> dict[str, dict]:
    return tomllib.loads(TARGETS.read_text())["target"]


def copy_tree(into: Path) -> None:
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, into / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(src, into / name)


def config(target: dict, timeout_s: float) -> str:
    tests = " ".join(target["tests"])
    select = f" -k '{target['select']}'" if target.get("select") else ""
    return (f'[cosmic-ray]\nmodule-path = "{target["module"]}"\ntimeout = {timeout_s}\n'
            f'excluded-modules = []\n'
            f'test-command = "{sys.executable} -m pytest -x -q -p no:cacheprovider -p no:randomly '
            f'{tests}{select}"\n\n[cosmic-ray.distributor]\nname = "local"\n')


def outcomes(session: Path) -> dict[str, int]:
    with sqlite3.connect(session) as db:
        rows = db.execute("SELECT test_outcome, COUNT(*) FROM work_results GROUP BY test_outcome").fetchall()
    return {str(outcome).rsplit(".", 1)[-1].lower(): n for outcome, n in rows}


_SIGNATURE = re.compile(r"^-\s*(async\s+)?def |^-\s*\w+\s*:\s*[^=]+(=|$)")


def _in_annotation(block: str) -> bool:
    """A mutant of a signature or an annotated field: with `from __future__ import annotations`
    annotations are never evaluated, so `str | None` -> `str + None` cannot change behaviour.
    (Its default value can: a mutant of the part after `=` is counted as any other.)"""
    removed = [line for line in block.splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line for line in block.splitlines() if line.startswith("+") and not line.startswith("+++")]
    if len(removed) != 1 or len(added) != 1 or not _SIGNATURE.match(removed[0]):
        return False
    if removed[0].lstrip("- ").startswith(("def ", "async def ")):  # only `X | None` in a signature
        return "ReplaceBinaryOperator_BitOr_" in block
    before, after = removed[0][1:], added[0][1:]
    if "=" in before and not before.lstrip().startswith("def "):  # a field: compare the defaults
        return before.split("=", 1)[1] == after.split("=", 1)[1]
    return True


def run(name: str, target: dict, *, timeout_s: float, keep: bool) -> dict[str, int]:
    work = Path(tempfile.mkdtemp(prefix=f"hermes-bulk-mutate-{name}-"))
    try:
        copy_tree(work)
        (work / "cosmic-ray.toml").write_text(config(target, timeout_s))
        env = {**os.environ, "PYTHONPATH": str(work / "src"), "PYTHONDONTWRITEBYTECODE": "1"}
        cr = [sys.executable, "-m", "cosmic_ray.cli"]
        subprocess.run([*cr, "init", "cosmic-ray.toml", "session.sqlite"], cwd=work, env=env, check=True)
        baseline = subprocess.run([*cr, "baseline", "cosmic-ray.toml"], cwd=work, env=env)
        if baseline.returncode:
            raise SystemExit(f"mutate: the tests of {name} fail without a mutant; fix them first")
        started = time.monotonic()
        subprocess.run([*cr, "exec", "cosmic-ray.toml", "session.sqlite"], cwd=work, env=env, check=True)
        counts = outcomes(work / "session.sqlite")
        report = subprocess.run([str(Path(sys.executable).parent / "cr-report"), "session.sqlite", "--show-diff"], cwd=work, env=env,
                                capture_output=True, text=True).stdout
        survivors = [block for block in report.split("\n[job-id]") if "test outcome: TestOutcome.SURVIVED" in block]
        in_annotations = [block for block in survivors if _in_annotation(block)]
        survivors = [block for block in survivors if block not in in_annotations]
        out = ROOT / "mutation-reports"
        out.mkdir(exist_ok=True)
        (out / f"{name}.txt").write_text(report)
        killed, survived = counts.get("killed", 0), len(survivors)
        total = sum(counts.values())
        score = killed / max(1, killed + survived)
        print(f"{name}: {target['module']}: {total} mutants, {killed} killed, {survived} survived, "
              f"{len(in_annotations)} only in annotations, score {score:.0%} "
              f"({time.monotonic() - started:.0f} s); report in mutation-reports/{name}.txt")
        if survivors:
            print("  first survivor:\n  " + survivors[0].strip().replace("\n", "\n  ")[:1500])
        return counts
    finally:
        if keep:
            print(f"mutate: kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    targets = load_targets()
    parser = argparse.ArgumentParser(prog="scripts/mutate", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="TARGET", help=f"any of: {', '.join(targets)}")
    parser.add_argument("--list", action="store_true", help="list the targets and exit")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a mutant's tests may take")
    parser.add_argument("--keep", action="store_true", help="keep the working copy (to read the session)")
    args = parser.parse_args()
    if args.list:
        for name, target in targets.items():
            print(f"{name:14} {target['module']:40} {' '.join(target['tests'])}")
        return 0
    unknown = [n for n in args.names if n not in targets]
    if unknown:
        parser.error(f"unknown target {', '.join(unknown)}; see --list")
    for name in args.names or list(targets):
        run(name, targets[name], timeout_s=args.timeout, keep=args.keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
