"""Where a worker's time goes: `hermes-bulk run --wait` under py-spy, summed by frame.

    python bench/profile_run.py [--backend sqlite|REDIS_URL] [--items 6000] [--threads 16] [--gil]

The loopback provider answers at once in this process; the job is created by the CLI in a
fresh data directory; py-spy (not a dependency of hermes-bulk: `pip install py-spy`) samples
the `run --wait` process at 200 Hz (PROFILE_HZ). Prints the 15 frames (PROFILE_TOP) with the
most samples of their own and hermes-bulk's 40 frames with the most inclusive share. --gil
samples only the thread holding the GIL (CPU spent in Python), else every thread's wall time
(waits included).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from hermes_bulk.testing.fake_provider import FakeProvider  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--backend", default="sqlite")
    parser.add_argument("--items", type=int, default=6000)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--gil", action="store_true")
    args = parser.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        raise SystemExit("py-spy is not installed: pip install py-spy")
    data = Path(tempfile.mkdtemp(prefix="profile-run-"))
    src = data / "items.jsonl"
    src.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(args.items)))
    provider = FakeProvider().start()
    backend = f"sqlite:///{data / 'bulk.db'}" if args.backend == "sqlite" else args.backend
    env = {
        **os.environ,
        "HERMES_BULK_BASE_URL": provider.base_url,
        "HERMES_BULK_API_KEY": "sk-profile-not-a-secret",
        "HERMES_BULK_MODEL": "fake-model",
        "HERMES_BULK_DATA_DIR": str(data),
        "HERMES_BULK_BACKEND": backend,
        "HERMES_BULK_MAX_CONCURRENCY": str(max(16, args.threads)),
    }
    hb = [sys.executable, "-m", "hermes_bulk"]
    created = subprocess.run(
        [*hb, "create", "Summarise", "--over", str(src), "--json", "--fresh"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    job = json.loads(created.stdout)["job_id"]
    samples = data / "samples.txt"
    spy_args = [
        "record",
        "--format",
        "raw",
        "-r",
        os.environ.get("PROFILE_HZ", "200"),
        "-o",
        str(samples),
    ]
    try:
        subprocess.run(
            [spy, *spy_args, *(["--gil"] if args.gil else []), "--", *hb, "run", job, "--wait"]
            + ["-w", str(args.threads)],
            env=env,
            capture_output=True,
            check=True,
        )
    finally:
        provider.stop()
    own, inclusive, total = collections.Counter(), collections.Counter(), 0
    for line in samples.read_text().splitlines():
        stack, count = line.rsplit(" ", 1)
        frames = stack.split(";")
        total += int(count)
        own[frames[-1]] += int(count)
        for frame in set(frames):
            inclusive[frame] += int(count)
    print(f"{total} samples ({'GIL holder' if args.gil else 'every thread'})")
    print("own time:")
    for frame, n in own.most_common(int(os.environ.get("PROFILE_TOP", "15"))):
        print(f"  {100 * n / total:5.1f} %  {frame}")
    print("hermes-bulk frames, inclusive:")
    ours = [(f, n) for f, n in inclusive.most_common() if "hermes_bulk" in f]
    for frame, n in ours[:40]:
        print(f"  {100 * n / total:5.1f} %  {frame}")
    shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
