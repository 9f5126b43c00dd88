"""A job cut off by a crash of the Hermes gateway is never continued by a worker on its own, not
even one started with --resume-interrupted; and a worker names Hermes only where it matters."""

from __future__ import annotations

import subprocess
import sys

from ..helpers import local_jobs, wait_for, worker_passes
from .conftest import clean_env, job_id_of
from .test_bulk_plugin import rows_jsonl
from .test_gateway_shows_what_runs import (
    bulk_cli,
    gateway_killed_with_two_items_in_flight,
    status_json,
)


def test_a_flagged_worker_leaves_a_job_the_crashed_gateway_was_running_for_run(
    gateway, hermes_home, hermes_provider, tmp_path
):
    env, job = gateway_killed_with_two_items_in_flight(
        gateway, hermes_home, hermes_provider, tmp_path, 8
    )
    sent = len(hermes_provider.requests)

    log = tmp_path / "worker.log"
    worker = subprocess.Popen(
        [sys.executable, "-m", "hermes_bulk", "worker", "--resume-interrupted", "-l", str(log)],
        env={**env, "HERMES_BULK_LEASE_SECONDS": "3"},  # a maintenance pass a second
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: log.exists() and "awaits recovery" in log.read_text(),
            timeout=60,
            message="the worker's recovery line",
        )
        with local_jobs(hermes_home / "plugin-data" / "bulk") as jobs:
            worker_passes(jobs, job)  # it took the job's triggers and began two passes since
        st = status_json(env, job)
    finally:
        worker.send_signal(2)
        worker.wait(60)
    text = log.read_text()
    assert "serves jobs created in Hermes profile 'default'" in text, (
        "this worker could serve the job"
    )
    assert f"job {job} awaits recovery: its workers stopped without a graceful worker stop" in text
    assert (st["state"], st["interrupted"], st["running"]) == ("awaiting_recovery", "orphaned", 0)
    assert len(hermes_provider.requests) == sent, "nothing is sent until someone runs the job"


def test_a_worker_that_cannot_serve_hermes_names_it_only_when_such_a_job_is_running(
    gateway, hermes_home, hermes_provider, tmp_path
):
    gw = gateway()
    job = job_id_of(gw.bulk(f'"Classify" --over {rows_jsonl(2, tmp_path / "rows.jsonl")}'))
    gw.close()
    # Another shell on the same data: no Hermes configuration here, so it cannot call Hermes' model.
    env = clean_env(
        tmp_path / "no-hermes",
        HERMES_BULK_HOME=str(hermes_home / "plugin-data" / "bulk"),
        HERMES_BULK_BASE_URL=hermes_provider.base_url,
        HERMES_BULK_MODEL="fake-model",
    )

    def worker_log() -> str:
        return subprocess.run(
            [sys.executable, "-m", "hermes_bulk", "worker", "--burst"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stderr

    assert "Hermes" not in worker_log(), (
        "no job made in Hermes is running: nothing to say about Hermes"
    )
    bulk_cli(env, "run", job)
    line = next(line for line in worker_log().splitlines() if "threads on" in line)
    assert "does not serve jobs created in Hermes: no Hermes configuration at" in line
    assert f"(running: {job}, waiting for a worker that serves them)" in line
