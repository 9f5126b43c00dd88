"""Row 7: start-up. How long `hermes-bulk path`, `list` and `status JOB` take on SQLite, from
process start to exit, side by side in one run with `python -c pass` (the interpreter alone) and
`python -c "import pydantic_settings"` (the configuration library these commands no longer load
when the environment leaves no doubt: quick_settings). The environment is a user's as the README
sets it up (endpoint, key, model, a limit). Rounds interleave the commands, so load hits them alike.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import hermes_bulk

from ..core import Context, Line, RowResult, at_most, median, table, write_jsonl
from ..procs import PY, FakeProviderProc, HermesEnv

ROW = 7
TITLE = "start-up of a read command"
GOAL_S = 0.2  #: issue 17: `status`, `list` and `path` on SQLite within 0.2 s on this machine


def run(ctx: Context) -> RowResult:
    rounds = 2 if ctx.quick else 15
    provider = FakeProviderProc(latency_s=0.0)
    try:
        env = HermesEnv(ctx.dir("home"), backend=None, base_url=provider.base_url)
        src = write_jsonl(ctx.dir("src") / "items.jsonl", 100)
        jobs = [env.create(src) for _ in range(10)]
    finally:
        provider.stop()
    # As installed: a wheel install compiles every module's bytecode, and an editable checkout
    # writes it at the first run, unless PYTHONDONTWRITEBYTECODE is set (as on this machine), which
    # would add compiling all of hermes_bulk (about 70 ms) to every command measured.
    subprocess.run(
        [PY, "-m", "compileall", "-q", str(Path(hermes_bulk.__file__).parent)],
        stdout=subprocess.DEVNULL,
        check=True,
    )
    commands = {
        "python -c pass": [PY, "-c", "pass"],
        "python -c 'import pydantic_settings'": [PY, "-c", "import pydantic_settings"],
        "hermes-bulk path": [PY, "-m", "hermes_bulk", "path"],
        "hermes-bulk list": [PY, "-m", "hermes_bulk", "list"],
        "hermes-bulk status JOB": [PY, "-m", "hermes_bulk", "status", jobs[0]],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(rounds):
        for name, argv in commands.items():
            started = time.perf_counter()
            subprocess.run(
                argv,
                env=env.env(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=True,
            )
            times[name].append(time.perf_counter() - started)
    med = {name: median(values) for name, values in times.items()}
    result = RowResult(
        row=ROW,
        title=TITLE,
        compared_with=f"the goal of {GOAL_S:g} s, beside `python -c pass` and the import of "
        "pydantic-settings, in the same run",
        goal=f"<= {GOAL_S:g} s for path, list and status on SQLite",
        setup=(
            f"A SQLite data directory with {len(jobs)} jobs of 100 items; each command run "
            f"{rounds} times, the rounds interleaved; bytecode compiled first, as an install does; "
            "wall time from spawning the process to its exit, stdout to /dev/null (so `list` "
            "prints its table at full width, as into a pipe); median per command."
        ),
        raw={"seconds": times},
    )
    for name in ("hermes-bulk path", "hermes-bulk list", "hermes-bulk status JOB"):
        goal, met = at_most(med[name] / GOAL_S, 1.0)
        result.lines.append(
            Line(
                name,
                f"{med[name] * 1000:,.0f} ms",
                f"goal {GOAL_S * 1000:.0f} ms",
                med[name] / GOAL_S,
                goal,
                met,
            )
        )
    avoided = med["python -c 'import pydantic_settings'"]
    result.details.append(
        table(
            ["command", "median", "min", "max", "beyond the interpreter"],
            [
                [
                    name,
                    f"{med[name] * 1000:,.0f} ms",
                    f"{min(v) * 1000:,.0f} ms",
                    f"{max(v) * 1000:,.0f} ms",
                    f"{(med[name] - med['python -c pass']) * 1000:,.0f} ms",
                ]
                for name, v in times.items()
            ],
        )
    )
    result.details.append(
        f"Importing pydantic-settings alone takes {avoided * 1000:,.0f} ms here, "
        f"{avoided / GOAL_S:.2f} of the goal: these commands read their settings with "
        "quick_settings instead, and load pydantic-settings only for a value it cannot judge. They "
        "load nothing else they do not use (tests/test_import_rules.py: no pydantic, huey, redis, "
        "httpx, tenacity or rich)."
    )
    return result
