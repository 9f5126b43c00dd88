"""Run cosmic-ray over the targets of scripts/mutate_targets.toml, each in a throwaway copy.

Why cosmic-ray: it writes each mutant into the source file on disk and runs a test command, so
every process the tests start (`hermes-bulk` commands, workers, a Hermes gateway) runs the
mutant too. mutmut 3 switches mutants inside the test interpreter, which those processes never
see. The copy keeps the mutants away from the working tree; PYTHONPATH points every process at
the copy's src/ (it comes before the editable install's path).

Lua is not Python, so cosmic-ray cannot mutate the Redis store's scripts: a target whose
modules are `.lua` files is mutated here instead (lua_mutants), with the same report and score.
"""

from __future__ import annotations

import argparse
import ast
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
            shutil.copytree(
                src, into / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
            )
        else:
            shutil.copy2(src, into / name)


def test_env(work: Path) -> dict[str, str]:
    """The environment a mutant's tests run in: every process on the copy's src/."""
    return {
        **os.environ,
        "PYTHONPATH": str(work / "src"),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPYCACHEPREFIX": "",  # no bytecode cached from scripts/test read for a mutant
        # A mutant needs the stateful test's verdict, not its smallest failing example.
        "HERMES_BULK_STATEFUL_SHRINK": "0",
    }


def modules_of(target: dict) -> list[str]:
    """`module` is one file or a list of files."""
    return [target["module"]] if isinstance(target["module"], str) else list(target["module"])


def config(target: dict, timeout_s: float) -> str:
    tests = " ".join(target["tests"])
    select = f" -k '{target['select']}'" if target.get("select") else ""
    if target.get(
        "args"
    ):  # e.g. --noconftest for tests that need no fixture: a second less a mutant
        select += " " + target["args"]
    paths = ", ".join(f'"{m}"' for m in modules_of(target))
    return (
        f"[cosmic-ray]\nmodule-path = [{paths}]\ntimeout = {timeout_s}\n"
        f"excluded-modules = []\n"
        f'test-command = "{sys.executable} -m pytest -x -q -p no:cacheprovider -p no:randomly '
        f'{tests}{select}"\n\n[cosmic-ray.distributor]\nname = "local"\n'
    )


def line_ranges(source: str, names: list[str]) -> dict[str, tuple[int, int]]:
    """The lines (decorators included) of each function or class named `name` or
    `Class.method`, or each module constant named `NAME`, that is defined in source."""
    found: dict[str, tuple[int, int]] = {}

    def walk(body, prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and not prefix:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name) and target.id in names:
                        found[target.id] = (node.lineno, node.end_lineno or node.lineno)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + node.name
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if name in names:
                    found[name] = (first, node.end_lineno or node.lineno)
                if isinstance(node, ast.ClassDef):
                    walk(node.body, name + ".")

    walk(ast.parse(source).body, "")
    return found


def annotation_spans(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Where the annotations are ((line, column) from, to), in a module that never evaluates them
    (`from __future__ import annotations`; nothing here reads type hints at run time)."""
    tree = ast.parse(source)
    if not any(
        isinstance(node, ast.ImportFrom)
        and node.module == "__future__"
        and any(a.name == "annotations" for a in node.names)
        for node in tree.body
    ):
        return []
    spans = []
    for node in ast.walk(tree):
        found = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            found.append(node.returns)
        elif isinstance(node, (ast.arg, ast.AnnAssign)) and node.annotation is not None:
            found.append(node.annotation)
        spans += [((a.lineno, a.col_offset), (a.end_lineno, a.end_col_offset)) for a in found]
    return spans


def prefilter(session: Path, work: Path, target: dict) -> tuple[int, int]:
    """Mark as skipped, before anything runs: every mutant outside the functions the target's `only`
    names (a part of a module too big to mutate whole in one sitting), and every mutant of an
    annotation (never evaluated, so it cannot change behaviour: no test run is spent on it). Returns
    (outside `only`, in annotations)."""
    from cosmic_ray.work_db import use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    names = list(target.get("only") or [])
    ranges: dict[str, list[tuple[int, int]]] = {}
    annotations: dict[str, list] = {}
    seen: set[str] = set()
    for module in modules_of(target):
        source = (work / module).read_text()
        found = line_ranges(source, names)
        ranges[str(Path(module))] = list(found.values())
        annotations[str(Path(module))] = annotation_spans(source)
        seen |= set(found)
    missing = sorted(set(names) - seen)
    if missing:
        raise SystemExit(f"mutate: `only` names what no module defines: {', '.join(missing)}")
    outside = in_annotations = 0
    skip = WorkResult(
        output=None, test_outcome=None, diff=None, worker_outcome=WorkerOutcome.SKIPPED
    )
    with use_db(str(session)) as db:
        for item in db.work_items:
            spots = [(str(m.module_path), tuple(m.start_pos)) for m in item.mutations]
            if names and not all(
                any(a <= at[0] <= b for a, b in ranges.get(path, [])) for path, at in spots
            ):
                db.set_result(item.job_id, skip)
                outside += 1
            elif all(any(a <= at < b for a, b in annotations.get(path, [])) for path, at in spots):
                db.set_result(item.job_id, skip)
                in_annotations += 1
    return outside, in_annotations


def outcomes(session: Path) -> dict[str, int]:
    with sqlite3.connect(session) as db:
        rows = db.execute(
            "SELECT test_outcome, COUNT(*) FROM work_results GROUP BY test_outcome"
        ).fetchall()
    return {str(outcome).rsplit(".", 1)[-1].lower(): n for outcome, n in rows}


_SIGNATURE = re.compile(r"^-\s*(async\s+)?def |^-\s*\w+\s*:\s*[^=]+(=|$)")


def _in_annotation(block: str) -> bool:
    """A mutant of a signature or an annotated field: with `from __future__ import annotations`
    annotations are never evaluated, so `str | None` -> `str + None` cannot change behaviour.
    (Its default value can: a mutant of the part after `=` is counted as any other.)"""
    removed = [
        line for line in block.splitlines() if line.startswith("-") and not line.startswith("---")
    ]
    added = [
        line for line in block.splitlines() if line.startswith("+") and not line.startswith("+++")
    ]
    if len(removed) != 1 or len(added) != 1 or not _SIGNATURE.match(removed[0]):
        return False
    if removed[0].lstrip("- ").startswith(("def ", "async def ")):  # only `X | None` in a signature
        return "ReplaceBinaryOperator_BitOr_" in block
    before, after = removed[0][1:], added[0][1:]
    if "=" in before and not before.lstrip().startswith("def "):  # a field: compare the defaults
        return before.split("=", 1)[1] == after.split("=", 1)[1]
    return True


def _mutant_of(block: str) -> tuple[str, str, int]:
    """(module path, operator, occurrence) of one cr-report block: what names a mutant across
    sessions of an unchanged module."""
    path, operator, occurrence = next(
        line for line in block.splitlines() if line.startswith("src/")
    ).split()
    return path, operator, int(occurrence)


def last_survivors(name: str) -> tuple[set[tuple[str, str, int]], int]:
    """The survivors of the target's last full run (mutation-reports/NAME.txt), and its kills."""
    report = (ROOT / "mutation-reports" / f"{name}.txt").read_text()
    blocks = report.split("\n[job-id]")
    survivors = {
        _mutant_of(b)
        for b in blocks
        if "test outcome: TestOutcome.SURVIVED" in b and not _in_annotation(b)
    }
    return survivors, sum("test outcome: TestOutcome.KILLED" in b for b in blocks)


def keep_only(session: Path, mutants: set[tuple[str, str, int]]) -> None:
    """Skip every mutant but these."""
    from cosmic_ray.work_db import use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    skip = WorkResult(
        output=None, test_outcome=None, diff=None, worker_outcome=WorkerOutcome.SKIPPED
    )
    with use_db(str(session)) as db:
        done = {job_id for job_id, _ in db.results}
        for item in db.work_items:
            m = item.mutations[0]
            if (
                item.job_id not in done
                and (str(m.module_path), m.operator_name, m.occurrence) not in mutants
            ):
                db.set_result(item.job_id, skip)


def _work_items(session: Path):
    from cosmic_ray.work_db import use_db

    with use_db(str(session)) as db:
        return list(db.work_items)


# Lua: the changes cosmic-ray makes to Python, made to the code of a script (never inside a
# comment or a string): a comparison turned (`<` to `<=`, `==` to `~=`, ...), `and`/`or` swapped,
# `+`/`-` swapped, a `not` dropped, `math.min`/`math.max` swapped, an integer moved by one.
_LUA_SWAPS = {
    "<=": "<",
    "<": "<=",
    ">=": ">",
    ">": ">=",
    "==": "~=",
    "~=": "==",
    " and ": " or ",
    " or ": " and ",
    " + ": " - ",
    " - ": " + ",
    "not ": "",
    "math.min": "math.max",
    "math.max": "math.min",
}
_LUA_TOKEN = re.compile(
    r"<=|>=|==|~=|<|>| and | or | \+ | - |\bnot |math\.min|math\.max|(?<![\w.\[])\d+(?![\w.])"
)


def _lua_code_spans(line: str) -> list[tuple[int, int]]:
    """The parts of one line of Lua that are code: not a '…' or "…" string, not a -- comment. Long
    brackets (`[[…]]`, `--[[…]]`) are not read: no script of ours uses them (a test says so)."""
    spans, start, i, quote = [], 0, 0, ""
    while i < len(line):
        ch = line[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote, start = "", i + 1
        elif ch in "'\"":
            spans.append((start, i))
            quote = ch
        elif line.startswith("--", i):
            spans.append((start, i))
            return [s for s in spans if s[1] > s[0]]
        i += 1
    if not quote:
        spans.append((start, len(line)))
    return [s for s in spans if s[1] > s[0]]


def lua_mutants(text: str) -> list[tuple[int, int, str, str]]:
    """Every mutant of a Lua script as (line number, column, what was there, what replaces it)."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for start, end in _lua_code_spans(line):
            for match in _LUA_TOKEN.finditer(line, start, end):
                token = match.group(0)
                if token.isdigit():
                    found.append((number, match.start(), token, str(int(token) + 1)))
                    if token != "0":
                        found.append((number, match.start(), token, str(int(token) - 1)))
                else:
                    found.append((number, match.start(), token, _LUA_SWAPS[token]))
    return found


_LUA_FUNCTION = re.compile(r"^local function (\w+)\(")


def lua_ranges(text: str, names: list[str]) -> dict[str, tuple[int, int]]:
    """The lines of each top-level `local function NAME(` of a script that `names` lists, from
    that line to the first line after it that is `end` alone (how every script of ours ends
    one: a test holds the mutator to it)."""
    found: dict[str, tuple[int, int]] = {}
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        match = _LUA_FUNCTION.match(line)
        if match and match.group(1) in names:
            last = next(
                (n for n, rest in enumerate(lines[number:], number + 1) if rest.rstrip() == "end"),
                len(lines),
            )
            found[match.group(1)] = (number, last)
    return found


def lua_in_only(target: dict) -> tuple[list[tuple], int]:
    """The target's Lua mutants within its `only` (all of them without one): a name is a
    top-level local function of a script, or a script's file name (the whole script); and how
    many were left out."""
    every = [
        (module, *m)
        for module in modules_of(target)
        for m in lua_mutants((ROOT / module).read_text())
    ]
    names = list(target.get("only") or [])
    if not names:
        return every, 0
    ranges: dict[str, list[tuple[int, int]]] = {}
    seen: set[str] = set()
    for module in modules_of(target):
        text = (ROOT / module).read_text()
        if Path(module).name in names:
            ranges[module] = [(1, len(text.splitlines()))]
            seen.add(Path(module).name)
            continue
        found = lua_ranges(text, names)
        ranges[module] = list(found.values())
        seen |= set(found)
    missing = sorted(set(names) - seen)
    if missing:
        raise SystemExit(f"mutate: `only` names what no script defines: {', '.join(missing)}")
    kept = [m for m in every if any(a <= m[1] <= b for a, b in ranges[m[0]])]
    return kept, len(every) - len(kept)


def run_lua(
    name: str,
    target: dict,
    *,
    timeout_s: float,
    count_only: bool,
    only_mutants=None,
    killed_before: int = 0,
) -> dict[str, int]:
    """Mutate each Lua module of the target one change at a time and run its tests on each
    (within the target's `only`: lua_in_only)."""
    mutants, outside = lua_in_only(target)
    if only_mutants is not None:
        mutants = [m for m in mutants if m in only_mutants]
    if count_only:
        print(
            f"{name}: {', '.join(modules_of(target))}: {len(mutants)} mutants to run "
            f"({outside} outside `only`: not run)"
        )
        return {}
    work = Path(tempfile.mkdtemp(prefix=f"hermes-bulk-mutate-{name}-"))
    try:
        copy_tree(work)
        env = test_env(work)
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-x",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "-p",
            "no:xdist",
            *target["tests"],
            *(["-k", target["select"]] if target.get("select") else []),
            *target.get("args", "").split(),
        ]

        def tests_pass() -> bool | None:
            try:
                done = subprocess.run(
                    command, cwd=work, env=env, capture_output=True, timeout=timeout_s
                )
            except subprocess.TimeoutExpired:
                return False  # a mutant that hangs the tests is caught, as cosmic-ray counts it
            return None if done.returncode in (2, 3, 4, 5) else done.returncode == 0

        if not tests_pass():
            raise SystemExit(f"mutate: the tests of {name} fail without a mutant; fix them first")
        started, report, survivors = time.monotonic(), [], []
        killed = broken = 0
        for done, (module, number, column, before, after) in enumerate(mutants, 1):
            path = work / module
            original = path.read_text()
            lines = original.splitlines(keepends=True)
            line = lines[number - 1]
            lines[number - 1] = line[:column] + after + line[column + len(before) :]
            path.write_text("".join(lines))
            try:
                passed = tests_pass()
            finally:
                path.write_text(original)
            outcome = "broke the test run" if passed is None else "SURVIVED" if passed else "KILLED"
            block = (
                f"{module} {number}:{column} {before.strip() or before!r} -> "
                f"{after.strip() or after!r}\n"
                f"test outcome: {outcome}\n-{line.rstrip()}\n+{lines[number - 1].rstrip()}\n"
            )
            report.append(block)
            print(
                f"[{done}/{len(mutants)}] {outcome.lower()}: {module.rsplit('/', 1)[-1]} line "
                f"{number}: {before.strip() or before!r} -> {after.strip() or after!r}",
                flush=True,
            )
            if passed is None:
                broken += 1
            elif passed:
                survivors.append(block)
            else:
                killed += 1
        out = ROOT / "mutation-reports"
        out.mkdir(exist_ok=True)
        suffix = ".rerun" if only_mutants is not None else ""
        (out / f"{name}{suffix}.txt").write_text("\n".join(report))
        (out / f"{name}.survivors.txt").write_text("\n".join(survivors))
        score = (killed_before + killed) / max(1, killed_before + killed + len(survivors))
        broke = f", {broken} broke the test run (counted as neither)" if broken else ""
        before = (
            f" (with the {killed_before} killed in the last full run)"
            if only_mutants is not None
            else ""
        )
        left_out = f" ({outside} outside `only`: not run)" if outside else ""
        print(
            f"{name}: {', '.join(modules_of(target))}: {len(mutants)} mutants{left_out}: "
            f"{killed} killed, {len(survivors)} survived{broke}: score {score:.0%}{before} "
            f"({time.monotonic() - started:.0f} s); mutation-reports/{name}{suffix}.txt"
        )
        for block in survivors[:3]:
            print("  survivor: " + block.strip().replace("\n", "\n  "))
        return {"killed": killed, "survived": len(survivors)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def last_lua_survivors(name: str) -> tuple[set[tuple], int]:
    """The survivors of the target's last full Lua run, as lua_mutants names them (module, line,
    column, what was there, what replaced it), and how many it killed."""
    found = set()
    for block in (ROOT / "mutation-reports" / f"{name}.survivors.txt").read_text().split("\n\n"):
        if block.strip():
            module, at, _ = block.splitlines()[0].split(" ", 2)
            minus, plus = (line[1:] for line in block.splitlines()[2:4])
            number, column = (int(x) for x in at.split(":"))
            before = after = None
            for candidate in lua_mutants(minus):  # the one change at that column that gives plus
                if (
                    candidate[1] == column
                    and minus[:column] + candidate[3] + minus[column + len(candidate[2]) :] == plus
                ):
                    before, after = candidate[2], candidate[3]
            found.add((module, number, column, before, after))
    report = (ROOT / "mutation-reports" / f"{name}.txt").read_text()
    return found, report.count("test outcome: KILLED")


def run(
    name: str,
    target: dict,
    *,
    timeout_s: float,
    keep: bool,
    count_only: bool = False,
    survivors_only: bool = False,
) -> dict[str, int]:
    if all(module.endswith(".lua") for module in modules_of(target)):
        if survivors_only:
            again, killed_before = last_lua_survivors(name)
            chosen = {m for m in lua_in_only(target)[0] if m in again}
            return run_lua(
                name,
                target,
                timeout_s=timeout_s,
                count_only=count_only,
                only_mutants=chosen,
                killed_before=killed_before,
            )
        return run_lua(name, target, timeout_s=timeout_s, count_only=count_only)
    work = Path(tempfile.mkdtemp(prefix=f"hermes-bulk-mutate-{name}-"))
    try:
        copy_tree(work)
        (work / "cosmic-ray.toml").write_text(config(target, timeout_s))
        env = test_env(work)
        cr = [sys.executable, "-m", "cosmic_ray.cli"]
        subprocess.run(
            [*cr, "init", "cosmic-ray.toml", "session.sqlite"], cwd=work, env=env, check=True
        )
        outside, annotated = prefilter(work / "session.sqlite", work, target)
        if count_only:
            total = len(_work_items(work / "session.sqlite"))
            print(
                f"{name}: {', '.join(modules_of(target))}: {total - outside - annotated} mutants "
                f"to run ({annotated} in annotations, {outside} outside `only`: not run)"
            )
            return {}
        if survivors_only:
            again, killed_before = last_survivors(name)
            keep_only(work / "session.sqlite", again)
        baseline = subprocess.run([*cr, "baseline", "cosmic-ray.toml"], cwd=work, env=env)
        if baseline.returncode:
            raise SystemExit(f"mutate: the tests of {name} fail without a mutant; fix them first")
        started = time.monotonic()
        subprocess.run(
            [*cr, "exec", "cosmic-ray.toml", "session.sqlite"], cwd=work, env=env, check=True
        )
        counts = outcomes(work / "session.sqlite")
        report = subprocess.run(
            [
                str(Path(sys.executable).parent / "cr-report"),
                "session.sqlite",
                "--show-diff",
                "--show-output",
            ],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
        ).stdout
        survivors = [
            block
            for block in report.split("\n[job-id]")
            if "test outcome: TestOutcome.SURVIVED" in block
        ]
        in_annotations = [block for block in survivors if _in_annotation(block)]  # a fallback
        survivors = [block for block in survivors if block not in in_annotations]
        out = ROOT / "mutation-reports"
        out.mkdir(exist_ok=True)
        killed, survived = counts.get("killed", 0), len(survivors)
        broken = counts.get("incompetent", 0)
        broke = f", {broken} broke the test run (counted as neither)" if broken else ""
        took = f"({time.monotonic() - started:.0f} s)"
        if survivors_only:
            (out / f"{name}.rerun.txt").write_text(report)
            (out / f"{name}.survivors.txt").write_text("\n[job-id]".join(survivors))
            score = (killed_before + killed) / max(1, killed_before + killed + survived)
            print(
                f"{name}: the {len(again)} survivors of mutation-reports/{name}.txt again: "
                f"{killed} killed now, {survived} survive{broke}: score {score:.0%} with the "
                f"{killed_before} killed before {took}; mutation-reports/{name}.rerun.txt"
            )
        else:
            (out / f"{name}.txt").write_text(report)
            (out / f"{name}.survivors.txt").write_text("\n[job-id]".join(survivors))
            score = killed / max(1, killed + survived)
            print(
                f"{name}: {', '.join(modules_of(target))}: {sum(counts.values())} mutants: "
                f"{annotated + len(in_annotations)} only in annotations, {outside} outside `only`; "
                f"{killed} killed, {survived} survived{broke}: score {score:.0%} {took}; "
                f"mutation-reports/{name}.txt"
            )
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
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="seconds a mutant's tests may take"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the working copy (to read the session)"
    )
    parser.add_argument(
        "--count", action="store_true", help="only count the mutants each target would run"
    )
    parser.add_argument(
        "--survivors",
        action="store_true",
        help="run only the survivors of the last full run (after adding tests)",
    )
    args = parser.parse_args()
    if args.list:
        for name, target in targets.items():
            only = f" (only {', '.join(target['only'])})" if target.get("only") else ""
            print(f"{name:20} {' '.join(modules_of(target))}{only}: {' '.join(target['tests'])}")
        return 0
    unknown = [n for n in args.names if n not in targets]
    if unknown:
        parser.error(f"unknown target {', '.join(unknown)}; see --list")
    for name in args.names or list(targets):
        run(
            name,
            targets[name],
            timeout_s=args.timeout,
            keep=args.keep,
            count_only=args.count,
            survivors_only=args.survivors,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
