"""One answer index, several worker processes: identical items of a job are asked once
however many workers race for them, and two jobs over the same data, made before either had an
answer, ask once each. Real `hermes-bulk worker` processes on SQLite and on Redis; the loopback
provider counts what was really sent."""

from __future__ import annotations

import collections
import csv
import json
import subprocess

DISTINCT = 30
ROWS = 300


def _rows_with_repeats(tmp_path):
    """ROWS rows, DISTINCT texts, each repeated ROWS / DISTINCT times, interleaved so that the
    repeats of one text are claimed by different threads of different workers at once."""
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text"])
        for i in range(ROWS):
            w.writerow([f"ticket {(i * 7) % DISTINCT}"])
    return path


def _export(cli, job_id: str) -> list[dict]:
    out = cli("export", job_id, "--format", "jsonl", "--output", "-").stdout
    return [json.loads(line) for line in out.splitlines()]


def test_workers_racing_over_repeats_ask_once_per_text_per_job(
    backend_cli, tmp_path, fake_provider
):
    cli = backend_cli
    fake_provider.configure(
        latency_s=0.05
    )  # long enough that repeats are claimed while the first is asked
    path = _rows_with_repeats(tmp_path)
    a = cli.create("Classify", path, "--concurrency", "8")
    b = cli.create(
        "Classify", path, "--concurrency", "8"
    )  # made before A answered anything: reuses nothing
    assert cli.json("status", b, "--json")["reused"] == 0
    workers = [cli.spawn_worker("-w", "4") for _ in range(3)]
    try:
        cli("run", a)
        cli("run", b)
        for job in (a, b):
            cli("wait", job, "--timeout", "180", timeout=200)
    finally:
        for proc in workers:
            proc.terminate()
        for proc in workers:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    asked = collections.Counter(r.item for r in fake_provider.requests)
    assert sum(asked.values()) == 2 * DISTINCT, (
        f"{sum(asked.values())} requests for {DISTINCT} texts in 2 jobs"
    )
    assert len(asked) == DISTINCT and set(asked.values()) == {2}, "each text asked once per job"

    for job in (a, b):
        rows = _export(cli, job)
        assert [r["status"] for r in rows] == ["completed"] * ROWS
        assert len({r["result"] for r in rows}) == DISTINCT, (
            "repeats carry their first item's answer"
        )

    # A third job over the same rows finds every answer in the index and asks nothing.
    fake_provider.reset_records()
    made = cli.json("create", "Classify", "--over", str(path), "--json")
    assert made["reused"] == ROWS
    assert cli.json("status", made["job_id"], "--json")["state"] == "completed"
    assert fake_provider.requests == []
