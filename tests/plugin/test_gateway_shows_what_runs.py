"""What a user of a long-lived Hermes gateway sees matches what runs.

Real hermes-agent 0.19.0 through its TUI gateway, as in test_bulk_plugin.py; jobs made by
`hermes-bulk create` share the gateway's data directory (HERMES_HOME is set, so the CLI uses
<profile home>/plugin-data/bulk too).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from ..helpers import job_status, local_jobs
from .conftest import clean_env, config_set, job_id_of
from .test_bulk_plugin import completed, rows_jsonl, wait_for_state


def bulk_cli(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hermes_bulk", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )


def cli_env(hermes_home, provider) -> dict[str, str]:
    """`hermes-bulk` in the gateway's profile, with an endpoint of its own for its jobs."""
    return clean_env(
        hermes_home,
        HERMES_BULK_BASE_URL=provider.base_url,
        HERMES_BULK_MODEL="fake-model",
        HERMES_BULK_API_KEY="sk-test-not-a-secret",
    )


def status_json(env, job: str) -> dict:
    """What `hermes-bulk status JOB --json` says in that environment, read in this process."""
    home = env.get("HERMES_BULK_HOME") or Path(env["HERMES_HOME"]) / "plugin-data" / "bulk"
    with local_jobs(home, env.get("HERMES_BULK_BACKEND")) as jobs:
        return job_status(jobs, job)


def line_of(status: str, prefix: str) -> str:
    """The line that starts with prefix, with the continuation lines a reply wraps it onto (80
    columns)."""
    lines = status.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(prefix))
    end = next((i for i in range(at + 1, len(lines)) if not lines[i].startswith("  ")), len(lines))
    return " ".join(line.strip() for line in lines[at:end])


# 1. The concurrency shown is the one in force
# ------------------------------------------------------


def test_the_concurrency_shown_is_the_one_the_gateways_worker_applies(
    gateway, hermes_home, hermes_provider, tmp_path
):
    src = rows_jsonl(16, tmp_path / "rows.jsonl")
    hermes_provider.configure(latency_s=0.6)
    gw = gateway()
    job = job_id_of(gw.bulk(f'"Classify" --over {src} --concurrency 6'))
    config_set(hermes_home, "plugins.entries.bulk.settings.max_concurrency", "2")

    ran = gw.bulk(f"run {job}")
    assert (
        line_of(ran, "Job ")
        == f"Job {job} is running in the background: 16 items pending, up to 2 at once."
    )
    status = gw.bulk(f"status {job}")
    assert line_of(status, "Concurrency: ") == (
        "Concurrency: up to 2 items at once (the job asks for 6; max_concurrency is 2)"
    )

    # Raised while the worker lives: it keeps 2 until it stops, and the replies say so.
    config_set(hermes_home, "plugins.entries.bulk.settings.max_concurrency", "8")
    status = gw.bulk(f"status {job}")
    assert line_of(status, "Concurrency: ") == (
        "Concurrency: up to 2 items at once (the job asks for 6; max_concurrency is 2)"
    )
    assert (
        "max_concurrency is now 8; the workers running this job started with 2 and keep it until "
        "they stop. The new value applies when workers next start."
    ) in " ".join(status.split())
    again = gw.bulk(f"run {job}")
    assert "up to 2 at once." in line_of(again, "Job ") and "max_concurrency is now 8" in again
    wait_for_state(gw, job, "completed", timeout=90)
    assert hermes_provider.max_in_flight == 2, "what was shown is what ran"


# 2. Every next step works from where it is shown
# ---------------------------------------------------


def test_hints_for_a_job_made_by_the_cli_name_commands_that_work_from_hermes(
    gateway, hermes_home, hermes_provider, tmp_path
):
    env = cli_env(hermes_home, hermes_provider)
    src = rows_jsonl(2, tmp_path / "rows.jsonl")
    job = json.loads(bulk_cli(env, "create", "Do", "--over", str(src), "--json").stdout)["job_id"]
    gw = gateway()

    status = gw.bulk(f"status {job}")
    assert line_of(status, "Start it with: ") == (
        f"Start it with: hermes-bulk run {job} --wait (in a shell, or "
        "keep a hermes-bulk worker running)"
    )
    assert f"/bulk run {job}" not in status
    refused = gw.bulk(f"run {job}")
    assert " ".join(refused.split()).endswith(f"Process it with: hermes-bulk run {job} --wait")

    paused = gw.bulk(f"pause {job}")
    assert line_of(paused, "Continue with: ") == (
        f"Continue with: hermes-bulk resume {job} --wait (in a shell, or keep a "
        "hermes-bulk worker running)"
    )
    assert f"Paused. Continue with: hermes-bulk resume {job} --wait" in " ".join(
        gw.bulk(f"status {job}").split()
    )
    # ... and the command shown does what it says, from a shell.
    done = subprocess.run(
        [sys.executable, "-m", "hermes_bulk", "resume", job, "--wait"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert status_json(env, job)["state"] == "completed"

    # A job made in Hermes, seen from the shell, names /bulk.
    hermes_job = job_id_of(gw.bulk(f'"Do" --over {src}'))
    cli_status = bulk_cli(env, "status", hermes_job).stdout
    assert (
        f"Start it with: /bulk run {hermes_job} (in Hermes, in the profile the job was created in)"
        in cli_status
    )
    assert f"Start it with: /bulk run {hermes_job}" in gw.bulk(f"status {hermes_job}")
    ran = bulk_cli(env, "run", hermes_job).stdout
    assert "(start one with: hermes-bulk worker)" not in ran
    assert (
        "a hermes-bulk worker with HERMES_HOME set to the profile it was created in, or Hermes "
        f"itself: /bulk run {hermes_job} (in Hermes, in the profile the job was created in)."
    ) in ran


# 3. A worker that cannot serve a job never takes its triggers
# --------------------------------------


def test_the_gateways_worker_does_not_slow_a_cli_job(
    gateway, hermes_home, hermes_provider, tmp_path
):
    hermes_provider.configure(latency_s=0.1)
    env = cli_env(hermes_home, hermes_provider)
    gw = gateway()
    # The gateway's embedded worker starts with a /bulk job, and lives on (a minute after its last
    # job).
    hermes_job = job_id_of(gw.bulk(f'"Do" --over {rows_jsonl(2, tmp_path / "h.jsonl")}'))
    gw.bulk(f"run {hermes_job}")
    wait_for_state(gw, hermes_job, "completed")

    def run_cli_job(name: str) -> tuple[str, float]:
        src = rows_jsonl(24, tmp_path / f"{name}.jsonl")
        job = json.loads(
            bulk_cli(env, "create", f"Do {name}", "--over", str(src), "--json").stdout
        )["job_id"]
        started = time.monotonic()
        bulk_cli(env, "run", job, "--wait")
        return job, time.monotonic() - started

    assert status_json(env, hermes_job)["live_workers"] == 1, "the gateway's worker is alive"
    with_gateway_job, with_gateway = run_cli_job("with-gateway")
    live_after = status_json(env, hermes_job)["live_workers"]
    gw.close()
    without_job, without = run_cli_job("without-gateway")
    print(
        f"\nhermes-bulk run --wait, 24 items: {with_gateway:.2f} s with the gateway's worker "
        f"alive, {without:.2f} s without"
    )

    # Before queues were per kind of client: 50 s against 4.3 s (each trigger the gateway took
    # waited 5 s); the margin only absorbs a busy machine.
    assert with_gateway < 1.5 * without + 2.0, (with_gateway, without)
    assert live_after == 1, "the gateway's worker was alive throughout"
    for job in (with_gateway_job, without_job):
        st = status_json(env, job)
        assert (st["state"], st["completed"]) == ("completed", 24)
        assert "worker_cannot_serve" not in bulk_cli(env, "events", job, "--limit", "500").stdout, (
            "no worker took a trigger of the job it could not serve"
        )


# 4. Interrupted items are not shown as running
# -----------------------------------------------------


def gateway_killed_with_two_items_in_flight(
    gateway, hermes_home, hermes_provider, tmp_path, rows: int
):
    """A job of `rows` rows run by a gateway that is killed (-9) while two of its items are in
    flight, one item completed: (the CLI's environment for that Hermes home, the job id)."""
    src = rows_jsonl(rows, tmp_path / "rows.jsonl")
    env = cli_env(hermes_home, hermes_provider)
    gw = gateway()
    job = job_id_of(gw.bulk(f'"Classify" --over {src} --concurrency 2'))
    hermes_provider.hold(let_through=1)  # one answered; the other, and the one claimed next, wait
    try:
        gw.bulk(f"run {job}")
        hermes_provider.wait_held(2)
        gw.kill()  # kill -9: nothing of Hermes gets to clean up
    finally:
        hermes_provider.release()  # their answers go to a dead process
    return env, job


def test_after_a_kill_interrupted_items_are_back_in_the_queue_and_wait_for_run(
    gateway, hermes_home, hermes_provider, tmp_path
):
    env, job = gateway_killed_with_two_items_in_flight(
        gateway, hermes_home, hermes_provider, tmp_path, 12
    )
    before = status_json(env, job)
    assert before["running"] == 2
    # Before Bulk starts again, what status shows is still true: those items are not running.
    cli_status = bulk_cli(env, "status", job).stdout
    assert line_of(cli_status, "Items: ").endswith(f"{before['pending']} pending, 2 interrupted")
    sent = len(hermes_provider.requests)

    second = gateway()
    # Bulk starts when this Hermes loads its plugins (the TUI gateway: at its first slash command)
    # and returns them to the queue; the command's answer comes after that.
    status = second.bulk(f"status {job}")
    assert status_json(env, job)["running"] == 0, (
        "released in the store, not only shown differently"
    )
    done = completed(status)
    assert "State: awaiting recovery" in status
    assert (
        line_of(status, "Items: ")
        == f"Items: {done}/12 completed, 0 failed, {12 - done} pending, 0 running"
    )
    assert "Items that were in progress when its workers stopped go back to the queue" in " ".join(
        status.split()
    )
    assert f"Continue with: /bulk run {job}" in status
    # Bulk in this Hermes runs no worker until /bulk run: nothing here can send anything.
    home = hermes_home / "plugin-data" / "bulk"
    with local_jobs(home) as jobs:
        assert jobs.liveness.live_workers() == [], "no worker runs in the restarted Hermes"
    assert len(hermes_provider.requests) == sent == 3, "nothing is sent again until /bulk run"

    second.bulk(f"run {job}")
    wait_for_state(second, job, "completed", timeout=90)
    counts = Counter(r.item for r in hermes_provider.requests)
    assert len(counts) == 12 and sum(counts.values()) - 12 == 2, (
        "the two in flight at the kill are sent again"
    )
