"""/bulk … --batch in a real Hermes: the job is created there, and a hermes-bulk worker with its own
endpoint runs it through the provider's Batch API (Hermes' ctx.llm has no batch call)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from hermes_bulk.testing.fake_provider import expected_answer

from ..helpers import wait_for
from .conftest import clean_env, config_set, job_id_of
from .test_fleet_worker import bulk_cli


def _worker_env(
    home: Path, redis_url: str, tmp_path: Path, base_url: str, api_key: str, **settings: str
) -> dict[str, str]:
    """A hermes-bulk worker's environment beside the Hermes home: the same Redis, a data
    directory of its own, and its own endpoint and key."""
    return clean_env(
        home,
        HERMES_BULK_BACKEND=redis_url,
        HERMES_BULK_HOME=str(tmp_path / "worker-data"),
        HERMES_BULK_BASE_URL=base_url,
        HERMES_BULK_API_KEY=api_key,
        HERMES_BULK_BATCH_POLL_SECONDS="0.1",
        **settings,
    )


def _worker_completes(env: dict[str, str], job: str, tmp_path: Path) -> None:
    """A hermes-bulk worker with env's own endpoint runs until the job has completed."""
    worker = subprocess.Popen(
        [sys.executable, "-m", "hermes_bulk", "worker", "-l", str(tmp_path / "w.log")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: (
                json.loads(bulk_cli(env, "status", job, "--json").stdout)["state"] == "completed"
            ),
            timeout=120,
            interval=0.3,
            message=f"batch job {job} to complete",
        )
    finally:
        worker.send_signal(signal.SIGINT)
        worker.wait(60)


def test_a_batch_job_created_in_hermes_says_who_runs_it_and_a_worker_with_an_endpoint_does(
    gateway, hermes_home, hermes_provider, redis_url, tmp_path
):
    config_set(hermes_home, "plugins.entries.bulk.settings.backend", redis_url)
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(20)))
    before = len(hermes_provider.batches.created)  # the provider lives for the session
    gw = gateway()
    # A live job first: the worker in this Hermes is live, and it serves no batch (issue 46, 11).
    live = tmp_path / "live.jsonl"
    live.write_text('{"live": 1}\n')
    first = job_id_of(gw.bulk(f'"Summarise" --over {live} --fresh'))
    assert gw.bulk(f"run {first}").startswith(f"Job {first} is running in the background")
    created = gw.bulk(f'"Summarise" --over {src} --batch --fresh --poll 1')
    job = job_id_of(created)
    status = " ".join(gw.bulk(f"status {job}").split())  # unwrapped
    assert "Batch API): 0 batches, 0 open; polled every 1 s" in status, status
    unwrapped = " ".join(created.split())
    assert "Batch API" in created and "Hermes' model has no batch call" in created
    assert (
        "No worker that serves it is live: start one where HERMES_BULK_BASE_URL and the key are "
        "set: hermes-bulk worker"
    ) in unwrapped, unwrapped
    ran = " ".join(gw.bulk(f"run {job}").split())
    assert ran == (
        f"Job {job} waits for a worker: 20 items pending. It runs through the provider's Batch "
        "API (about half the price; answers within the batch window), submitted by a "
        "hermes-bulk worker with its own endpoint. No worker that serves it is live: start one "
        "where HERMES_BULK_BASE_URL and the key are set: hermes-bulk worker Check it with: "
        f"/bulk status {job}"
    ), ran
    gw.close()

    env = _worker_env(hermes_home, redis_url, tmp_path, hermes_provider.base_url, "sk-worker-own")
    _worker_completes(env, job, tmp_path)
    rows = [
        json.loads(line)
        for line in Path(bulk_cli(env, "export", job, "--format", "jsonl").stdout.strip())
        .read_text()
        .splitlines()
    ]
    assert [r["result"] for r in rows] == [expected_answer(json.dumps({"n": i})) for i in range(20)]
    assert len(hermes_provider.batches.created) == before + 1 and hermes_provider.requests == []


def test_a_claude_users_batch_job_goes_to_message_batches_through_a_worker_set_for_anthropic(
    gateway, hermes_home, hermes_provider, redis_url, tmp_path
):
    """Hermes' own model is Claude's: `/bulk … --batch` makes a Claude batch job, says which
    worker serves it, and a worker set for Anthropic runs it through Message Batches."""
    config_set(hermes_home, "plugins.entries.bulk.settings.backend", redis_url)
    config_set(hermes_home, "model.provider", "anthropic")
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(12)))
    gw = gateway()
    created = gw.bulk(f'"Summarise" --over {src} --batch --fresh --poll 1')
    job = job_id_of(created)
    unwrapped = " ".join(created.split())
    assert "start one where HERMES_BULK_PROVIDER=anthropic and ANTHROPIC_API_KEY are set" in (
        unwrapped
    ), unwrapped
    gw.bulk(f"run {job}")
    gw.close()

    env = _worker_env(
        hermes_home,
        redis_url,
        tmp_path,
        hermes_provider.base_url,
        "sk-ant-worker-own",
        HERMES_BULK_PROVIDER="anthropic",
    )
    assert json.loads(bulk_cli(env, "status", job, "--json").stdout)["protocol"] == "anthropic"
    before = len(hermes_provider.batches.created)
    _worker_completes(env, job, tmp_path)
    created_now = hermes_provider.batches.created[before:]
    assert len(created_now) == 1 and created_now[0].startswith("msgbatch_"), created_now
    assert {r.protocol for r in hermes_provider.batches.lines} == {"anthropic"}
    assert hermes_provider.requests == [], "no live call: Hermes' model was not asked"
