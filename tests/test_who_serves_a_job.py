"""Who serves a job: `run JOB --wait` serves JOB alone; states say who the job waits for.

Real `hermes-bulk` processes (run --wait, status) on SQLite and on Redis, the loopback provider,
whose request log is the proof of what was sent.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hermes_bulk.testing.fake_provider import FakeProvider, digest

from .helpers import wait_for

BACKENDS = ["sqlite", "redis"]


@pytest.fixture(params=BACKENDS)
def backend_env(request) -> dict[str, str]:
    if request.param == "sqlite":
        return {}
    return {"HERMES_BULK_BACKEND": request.getfixturevalue("redis_url")}


def _items(tmp_path: Path, name: str, n: int) -> tuple[Path, set[str]]:
    folder = tmp_path / name
    folder.mkdir()
    texts = [f"{name} item number {i}\n" for i in range(n)]
    for i, text in enumerate(texts):
        (folder / f"{i:03d}.txt").write_text(text)
    return folder, {digest(t) for t in texts}


def _create(cli, folder: Path, env, *flags: str) -> str:
    return cli.json("create", "Summarize", "--over", str(folder), *flags, "--json", **env)["job_id"]


def _status(cli, job_id, env):
    return cli.status(job_id, **env)


def test_run_wait_serves_only_the_job_it_names(cli, fake_provider, tmp_path, backend_env):
    """Job A was run with no worker alive; `run B --wait` answers B and none of A's items.
    A's triggers were queued first, so by the time B is done run --wait has met them all."""
    folder_a, items_a = _items(tmp_path, "alpha", 10)
    folder_b, items_b = _items(tmp_path, "beta", 4)
    job_a = _create(cli, folder_a, backend_env)
    job_b = _create(cli, folder_b, backend_env)
    cli("run", job_a, **backend_env)
    cli("run", job_b, "--wait", **backend_env)
    sent = {r.item for r in fake_provider.requests}
    assert items_b <= sent
    assert not sent & items_a, f"{len(sent & items_a)} of job A's items were sent by run B --wait"
    st = _status(cli, job_a, backend_env)
    assert st["completed"] == 0 and st["pending"] == 10, st
    assert st["state"] == "waiting_for_worker", st
    text = cli("status", job_a, **backend_env).stdout
    assert "waiting for a worker" in text.lower() and "hermes-bulk worker" in text, text
    # A's triggers were not lost: a background worker serves A now.
    worker = cli.spawn_worker("-w", "2", **backend_env)
    wait_for(
        lambda: _status(cli, job_a, backend_env)["completed"] == 10, timeout=60, message="A done"
    )
    worker.terminate()
    worker.wait(30)


@pytest.fixture
def other_provider():
    server = FakeProvider().start()
    yield server
    server.stop()


def test_a_job_is_served_only_by_workers_of_its_endpoint(
    cli, fake_provider, other_provider, tmp_path, backend_env
):
    """Job A is made for provider A; a worker configured for provider B never takes its items
    (B's own job, run after A, is done first: A's triggers were queued before it), says so once
    in its log, and `status` names the endpoint A waits for. A worker of A then does it."""
    env = {**backend_env, "HERMES_BULK_LEASE_SECONDS": "3"}
    env_b = {**env, "HERMES_BULK_BASE_URL": other_provider.base_url}
    folder_a, items_a = _items(tmp_path, "alpha", 6)
    folder_b, items_b = _items(tmp_path, "beta", 3)
    job_a = _create(cli, folder_a, env)
    job_b = _create(cli, folder_b, env_b)
    cli("run", job_a, **env)
    worker_b = cli.spawn_worker("-w", "2", **env_b)
    try:
        cli("run", job_b, **env_b)
        wait_for(
            lambda: _status(cli, job_b, env)["state"] == "completed", timeout=60, message="B done"
        )
        log_b = cli.logs_dir / "worker-1.log"
        wait_for(
            lambda: f"job {job_a} is left to workers of its endpoint" in log_b.read_text(),
            timeout=30,
            message="worker B says it leaves A",
        )
        assert not {r.item for r in other_provider.requests} & items_a
        assert not fake_provider.requests
        st = _status(cli, job_a, env)
        assert (st["state"], st["completed"], st["live_workers"]) == ("waiting_for_worker", 0, 0), (
            st
        )
        assert st["endpoint"] == fake_provider.base_url
        text = cli("status", job_a, **env).stdout
        assert f"waits for a hermes-bulk worker for {fake_provider.base_url}" in text, text
        worker_a = cli.spawn_worker("-w", "2", **env)
        wait_for(
            lambda: _status(cli, job_a, env)["state"] == "completed", timeout=60, message="A done"
        )
        worker_a.terminate()
        worker_a.wait(30)
    finally:
        worker_b.terminate()
        worker_b.wait(30)
    assert {r.item for r in fake_provider.requests} == items_a
    assert {r.item for r in other_provider.requests} == items_b
    assert log_b.read_text().count(f"job {job_a} is left to workers") == 1


def test_answers_are_reused_only_from_the_same_endpoint_and_key(
    cli, fake_provider, other_provider, tmp_path, backend_env
):
    folder, items = _items(tmp_path, "gamma", 4)
    first = _create(cli, folder, backend_env)
    cli("run", first, "--wait", **backend_env)
    assert {r.item for r in fake_provider.requests} == items
    # Same items and instruction, another endpoint: asked again there, nothing reused.
    env_b = {**backend_env, "HERMES_BULK_BASE_URL": other_provider.base_url}
    second = _create(cli, folder, env_b)
    cli("run", second, "--wait", **env_b)
    assert {r.item for r in other_provider.requests} == items
    assert _status(cli, second, env_b)["reused"] == 0
    # Same endpoint, another key (another account): asked again too.
    env_key = {**backend_env, "HERMES_BULK_API_KEY": "sk-another-account-not-a-secret"}
    third = _create(cli, folder, env_key)
    cli("run", third, "--wait", **env_key)
    assert len(fake_provider.requests) == 8
    # Same endpoint and key: reused when created, nothing left to send.
    fourth = _create(cli, folder, backend_env)
    st = _status(cli, fourth, backend_env)
    assert (st["reused"], st["pending"]) == (4, 0), st
    assert len(fake_provider.requests) == 8


def test_the_key_fingerprint_is_keyed_and_never_the_key():
    from hermes_bulk.fleet import endpoints

    fp = endpoints.key_fingerprint("sk-secret-value")
    assert (
        fp
        == endpoints.key_fingerprint("sk-secret-value")
        != endpoints.key_fingerprint("sk-secret-valuf")
    )
    assert "secret" not in fp and len(fp) == 16
    assert (
        endpoints.endpoint_url("https://user:pw@host.example/v1/?api_key=abc")
        == "https://user:***@host.example/v1/?api_key=***"
    )


def test_a_killed_run_wait_is_seen_at_once_and_named(
    cli, fake_provider, other_provider, tmp_path, backend_env
):
    """kill -9 of the only `run --wait` serving a job, while a worker of another endpoint lives:
    `status` says at once that no live worker serves the job (never "processing"), the items
    come back with an event naming the dead worker, and the concurrency in force is the threads
    of the live workers that serve the job."""
    env = {**backend_env, "HERMES_BULK_LEASE_SECONDS": "60"}  # the lease is not what tells
    folder, _ = _items(tmp_path, "delta", 6)
    job = _create(cli, folder, env, "--concurrency", "4")
    other = cli.spawn_worker("-w", "1", **{**env, "HERMES_BULK_BASE_URL": other_provider.base_url})
    try:
        fake_provider.configure(latency_s=60)
        waiting = subprocess.Popen(
            [sys.executable, "-m", "hermes_bulk", "run", job, "--wait"],
            env=cli.full_env(**env),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
        try:
            wait_for(
                lambda: fake_provider.requests, timeout=60, message="an item reaches the provider"
            )
            assert _status(cli, job, env)["state"] == "processing"
        finally:
            os.kill(waiting.pid, signal.SIGKILL)
            waiting.wait()
        fake_provider.configure(latency_s=0)
        st = _status(cli, job, env)  # at once: its lock file is free
        assert (st["state"], st["live_workers"]) == ("awaiting_recovery", 0), st
        assert "State: processing" not in cli("status", job, **env).stdout
        wait_for(
            lambda: "recovered" in cli("events", job, **env).stdout,
            timeout=30,
            message="the other worker returns the dead one's items",
        )
        events = cli("events", job, **env).stdout
        assert re.search(rf"returned to the queue from worker [^\s]+:{waiting.pid}:", events), (
            events
        )
        fake_provider.configure(latency_s=0.5)
        serving = cli.spawn_worker("-w", "2", **env)
        cli("run", job, **env)
        wait_for(lambda: _status(cli, job, env)["running"] >= 1, timeout=60, message="served again")
        st = _status(cli, job, env)
        assert (st["state"], st["concurrency"], st["concurrency_in_force"]) == (
            "processing",
            4,
            2,
        ), st
        assert "the live workers that serve it have 2 threads" in cli("status", job, **env).stdout
        fake_provider.configure(latency_s=0)
        wait_for(lambda: _status(cli, job, env)["state"] == "completed", timeout=60, message="done")
        serving.terminate()
        serving.wait(30)
    finally:
        other.terminate()
        other.wait(30)
