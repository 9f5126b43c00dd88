"""Start-up before and after: `path`, `list` and `status JOB` of two checkouts, interleaved.

    python bench/startup_ab.py OLD_SRC [ROUNDS]

OLD_SRC is the `src` folder of another checkout (a `git worktree add /tmp/old <commit>`); the
current one is this repository's. Both run under this interpreter, each on a SQLite data
directory of 3 jobs that its own code made (a store's schema may differ between them),
bytecode compiled first, in a user's environment (endpoint, key, model),
each command's rounds interleaved so that load hits both alike. Prints the median and the
fastest of each, beside `python -c pass`.
"""

from __future__ import annotations

import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NEW_SRC = Path(__file__).resolve().parents[1] / "src"


def main() -> None:
    old_src, rounds = Path(sys.argv[1]).resolve(), int(sys.argv[2]) if len(sys.argv) > 2 else 15
    for src in (old_src, NEW_SRC):
        compileall.compile_dir(str(src / "hermes_bulk"), quiet=1)
    root = Path(tempfile.mkdtemp())
    (root / "a.txt").write_text("hello")
    env = {
        **os.environ,
        "HERMES_BULK_MODEL": "fake-model",
        "HERMES_BULK_BASE_URL": "http://127.0.0.1:9/v1",
        "HERMES_BULK_API_KEY": "sk-bench-not-a-secret",
    }
    cases = {("interpreter", "python -c pass"): ([sys.executable, "-c", "pass"], env)}
    for side, src in (("before", old_src), ("after", NEW_SRC)):
        side_env = {**env, "PYTHONPATH": str(src), "HERMES_BULK_HOME": str(root / side)}
        for _ in range(3):
            made = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "hermes_bulk",
                    "create",
                    "Summarize",
                    "--over",
                    str(root / "a.txt"),
                    "--json",
                ],
                env=side_env,
                check=True,
                capture_output=True,
                text=True,
            )
        job = json.loads(made.stdout)["job_id"]
        for argv in (["path"], ["list"], ["status", job]):
            cases[(side, argv[0])] = ([sys.executable, "-m", "hermes_bulk", *argv], side_env)
    times: dict[tuple[str, str], list[float]] = {case: [] for case in cases}
    for _ in range(rounds):
        for case, (argv, case_env) in cases.items():
            started = time.perf_counter()
            subprocess.run(
                argv, env=case_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True
            )
            times[case].append(time.perf_counter() - started)
    print(f"{rounds} interleaved rounds, load average {os.getloadavg()[0]:.2f} at the end")
    for (side, name), values in times.items():
        print(
            f"{side:12} {name:15} median {statistics.median(values) * 1000:5.0f} ms   "
            f"fastest {min(values) * 1000:5.0f} ms"
        )


if __name__ == "__main__":
    main()
