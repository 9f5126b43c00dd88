"""A job created in Hermes, on the Redis backend, served by `hermes-bulk worker` processes.

Such a worker calls Hermes' model the way the plugin does (Hermes' PluginLlm, the profile's
config and .env), when hermes-agent is installed beside it and HERMES_HOME is the profile the
job was created in. A worker that cannot leaves the job alone: nothing goes to its own
HERMES_BULK_BASE_URL.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hermes_bulk.testing.fake_provider import FakeProvider, expected_answer

from ..helpers import job_status, local_jobs, wait_for, worker_passes
from .conftest import clean_env, config_set, job_id_of
from .test_bulk_plugin import REPORTS, files_of


def bulk_cli(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hermes_bulk", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )


def test_a_fleet_worker_serves_a_job_created_in_hermes(
    gateway, hermes_home, hermes_provider, redis_url, tmp_path
):
    config_set(hermes_home, "plugins.entries.bulk.settings.backend", redis_url)
    gw = gateway()
    job = job_id_of(gw.bulk(f'"Summarize this report" --over {REPORTS}'))
    gw.close()  # Hermes is gone: the fleet does the work

    # Another machine: its own data directory, the same Redis, the same Hermes profile.
    env = clean_env(
        hermes_home, HERMES_BULK_BACKEND=redis_url, HERMES_BULK_HOME=str(tmp_path / "worker-data")
    )
    bulk_cli(env, "run", job)
    worker = subprocess.run(
        [
            sys.executable,
            "-m",
            "hermes_bulk",
            "worker",
            "--burst",
            "-w",
            "2",
            "-l",
            str(tmp_path / "worker.log"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert worker.returncode == 0, worker.stderr
    log = (tmp_path / "worker.log").read_text()
    assert (
        "serves jobs created in Hermes profile 'default' through Hermes' model configuration" in log
    )

    status = json.loads(bulk_cli(env, "status", job, "--json").stdout)
    assert (status["state"], status["completed"], status["failed"]) == ("completed", 5, 0)
    rows = [
        json.loads(line)
        for line in Path(bulk_cli(env, "export", job, "--format", "jsonl").stdout.strip())
        .read_text()
        .splitlines()
    ]
    answers = {row["item"]: row["result"] for row in rows}
    assert answers == {
        name: expected_answer(content) for name, content in files_of(REPORTS).items()
    }
    assert {(row["provider"], row["model"]) for row in rows} == {("custom", "fake-model")}
    assert len(hermes_provider.requests) == 5


def test_a_worker_that_cannot_call_hermes_model_leaves_the_job_alone(
    gateway, hermes_home, hermes_provider, redis_url, tmp_path
):
    config_set(hermes_home, "plugins.entries.bulk.settings.backend", redis_url)
    gw = gateway()
    job = job_id_of(gw.bulk(f'"Summarize this report" --over {REPORTS}'))
    gw.close()
    own_endpoint = FakeProvider().start()
    try:
        # A named profile with a model of its own: not the profile the job was created in.
        work = tmp_path / "root" / "profiles" / "work"
        work.mkdir(parents=True)
        config_set(work, "model.provider", "custom")
        config_set(work, "model.base_url", own_endpoint.base_url)
        config_set(work, "model.default", "other-model")
        env = clean_env(
            work,
            HERMES_BULK_BACKEND=redis_url,
            HERMES_BULK_HOME=str(tmp_path / "worker-data"),
            HERMES_BULK_BASE_URL=own_endpoint.base_url,
            HERMES_BULK_MODEL="fake-model",
            HERMES_BULK_API_KEY="sk-test-not-a-secret",
        )
        bulk_cli(env, "run", job)
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hermes_bulk",
                "worker",
                "-w",
                "2",
                "-l",
                str(tmp_path / "worker.log"),
            ],
            env={**env, "HERMES_BULK_LEASE_SECONDS": "3"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # a pass a second
        try:
            with local_jobs(tmp_path / "worker-data", redis_url) as jobs:
                wait_for(
                    lambda: any(
                        e.kind == "worker_cannot_serve" for e in jobs.status(job, events=50).events
                    ),
                    timeout=30,
                    message="the worker to say it leaves the job",
                )
                worker_passes(jobs, job)  # its triggers taken, two maintenance passes since
                status = job_status(jobs, job)
            events = bulk_cli(env, "events", job).stdout
        finally:
            worker.terminate()
            worker.wait(30)
    finally:
        own_endpoint.stop()
    assert "created in Hermes profile 'default' and this worker runs profile 'work'" in events
    assert events.count("worker_cannot_serve") == 1
    assert (status["completed"], status["failed"], status["pending"]) == (0, 0, 5), (
        "no item failed or was lost"
    )
    assert own_endpoint.requests == [] and hermes_provider.requests == [], (
        "nothing sent to another endpoint"
    )
