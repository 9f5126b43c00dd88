"""Rows of the benchmark suite, two checkouts side by side: is a change within noise?

    .venv/bin/python -m bench.checkouts_ab OLD_CHECKOUT [--rows 1,2,7] [--rounds 2]

OLD_CHECKOUT is another checkout of this repository (`git worktree add /tmp/old <commit>`).
Each checkout runs its own bench/ over its own src/ under this interpreter, full sizes; the
rounds alternate which goes first, so load drifting over the run hits both alike. What is
compared is each line's ratio (hermes-bulk against what the row measures it by, in the same
run), never an absolute time: the ratio carries its own reference through the noise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

NEW = Path(__file__).resolve().parents[1]

#: Run in a checkout: its rows at full size, one JSON line per figure on stdout.
ONE_SIDE = """
import json, sys
from bench import runner
results, unavailable = runner.run_rows(
    [int(r) for r in sys.argv[1].split(",")], quick=sys.argv[2] == "quick", log=lambda text: None
)
for r in results:
    for line in r.lines:
        print(json.dumps({"row": r.row, "case": line.case, "ratio": line.ratio}))
"""


def run_side(checkout: Path, rows: str, quick: bool) -> dict[tuple[int, str], float]:
    env = {**os.environ, "PYTHONPATH": f"{checkout / 'src'}{os.pathsep}{checkout}"}
    done = subprocess.run(
        [sys.executable, "-c", ONE_SIDE, rows, "quick" if quick else "full"],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    figures = {}
    for text in done.stdout.splitlines():
        line = json.loads(text)
        if line["ratio"] is not None:
            figures[(line["row"], line["case"])] = line["ratio"]
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.checkouts_ab", description=__doc__)
    parser.add_argument("old", type=Path, help="the other checkout")
    parser.add_argument("--rows", default="1,2,7")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="smoke sizes: does it run")
    args = parser.parse_args(argv)
    sides = {"before": args.old.resolve(), "after": NEW}
    seen: dict[str, list[dict]] = {"before": [], "after": []}
    for round_ in range(args.rounds):
        order = ["before", "after"] if round_ % 2 == 0 else ["after", "before"]
        for side in order:
            print(f"round {round_ + 1}: {side} ({sides[side]})", file=sys.stderr, flush=True)
            seen[side].append(run_side(sides[side], args.rows, args.quick))
    keys = sorted(set().union(*seen["before"], *seen["after"]))
    print(f"{'row':>3}  {'case':<40} {'before':>15} {'after':>15} {'change':>7}")
    for key in keys:
        before = [r[key] for r in seen["before"] if key in r]
        after = [r[key] for r in seen["after"] if key in r]
        if not before or not after:
            print(f"{key[0]:>3}  {key[1][:40]:<40} only {'before' if before else 'after'}")
            continue
        b, a = statistics.median(before), statistics.median(after)
        spread = lambda xs: f"{min(xs):.2f}-{max(xs):.2f}"  # noqa: E731
        print(
            f"{key[0]:>3}  {key[1][:40]:<40} {spread(before):>15} {spread(after):>15} "
            f"{(a / b - 1) * 100:>+6.0f}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
