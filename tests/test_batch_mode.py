"""create --batch: a job run through the provider's Batch API, by real CLI and worker processes,
on both backends, against the loopback provider's batch endpoints (issue 13)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from hermes_bulk.testing.fake_provider import digest, expected_answer

from .helpers import wait_for

BACKENDS = ["sqlite", "redis"]
FAST = {"HERMES_BULK_BATCH_POLL_SECONDS": "0.1"}


@pytest.fixture(params=BACKENDS)
def backend_env(request, tmp_path) -> dict[str, str]:
    if request.param == "sqlite":
        return {"HERMES_BULK_BACKEND": f"sqlite:///{tmp_path / 'bulk.db'}", **FAST}
    return {"HERMES_BULK_BACKEND": request.getfixturevalue("redis_url"), **FAST}


def _source(tmp_path: Path, n: int, name: str = "items.jsonl", marks: dict[int, str] | None = None) -> Path:
    src = tmp_path / name
    marks = marks or {}
    src.write_text("".join(json.dumps({"n": i, "mark": marks.get(i, "")}) + "\n" for i in range(n)))
    return src


def _rows(cli, job_id: str, env: dict[str, str]) -> list[dict]:
    out = Path(cli("export", job_id, "--format", "jsonl", **env).stdout.strip())
    return [json.loads(line) for line in out.read_text().splitlines()]


def _finish(cli, job_id: str, env: dict[str, str], *, timeout: float = 120, workers: int = 1) -> dict:
    procs = [cli.spawn_worker("-w", "2", **env) for _ in range(workers)]
    try:
        return wait_for(lambda: (st := cli.json("status", job_id, "--json", **env))["state"]
                        in ("completed", "completed_with_errors", "failed") and st, timeout=timeout,
                        interval=0.3, message="the job to end")
    finally:
        for p in procs:
            p.send_signal(signal.SIGINT)
            p.wait(60)


def test_a_batch_job_answers_every_item_as_the_same_job_run_live_does(cli, backend_env, fake_provider, tmp_path):
    env = {**backend_env, "HERMES_BULK_BATCH_MAX_ITEMS": "700"}
    src = _source(tmp_path, 2000)
    batch_job = cli.json("create", "Summarise", "--over", str(src), "--batch", "--fresh", "--json", **env)["job_id"]
    cli("run", batch_job, **env)
    status = _finish(cli, batch_job, env)
    assert status["state"] == "completed" and status["mode"] == "batch"
    assert fake_provider.requests == [], "no live chat-completions call was made"
    bodies = fake_provider.batches.bodies()
    assert len(bodies) == 2000 and len(fake_provider.batches.created) == 3, "2,000 items split at 700 a batch"
    assert sorted(b["id"] for b in status["batches"]) == sorted(fake_provider.batches.created)
    assert all(b["status"] == "done" for b in status["batches"])
    assert sum(b["items"] for b in status["batches"]) == 2000
    batch_rows = _rows(cli, batch_job, env)

    live_job = cli.json("create", "Summarise", "--over", str(src), "--fresh", "--concurrency", "16", "--json",
                        **env)["job_id"]
    cli("run", live_job, **env)
    live = _finish(cli, live_job, env)
    assert live["mode"] == "live" and live["batches"] == []
    assert len(fake_provider.requests) == 2000
    live_rows = _rows(cli, live_job, env)
    assert batch_rows == live_rows, "item for item: name, status, result, tokens, provider, model"
    assert [r["result"] for r in batch_rows] == [expected_answer(json.dumps({"n": i, "mark": ""})) for i in range(2000)]
    # One chat-completions body per item, each the body a live call sent.
    assert sorted(digest(json.dumps({"n": i, "mark": ""})) for i in range(2000)) == \
        sorted(r.item for r in fake_provider.batches.lines)
