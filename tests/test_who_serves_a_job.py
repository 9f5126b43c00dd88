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

from hermes_bulk.jobs.request import JobRequest
from hermes_bulk.testing.fake_provider import FakeProvider, digest

from .helpers import wait_for
from .test_eighty_columns import fits, on_terminal

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
        _says_who_is_live(cli, job_a, env, other_provider.base_url)
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


def _says_who_is_live(cli, job: str, env: dict, url_b: str) -> None:
    """Job A waits while a worker of B is live: `status` says that worker is live and what it
    serves, and the command that starts one for A (none to set in A's shell; the pure test
    has the other shells); `--json` carries the same; `workers` says what each serves. The
    words at 80 columns, as a terminal shows them, once (SQLite): they read no store."""
    st = _status(cli, job, env)
    assert (st["live_workers"], st["live_workers_total"]) == (0, 1), st
    assert [(w["reason"], w["endpoint"], w["batches"]) for w in st["workers_elsewhere"]] == [
        ("endpoint", url_b, True)
    ], st
    if "HERMES_BULK_BACKEND" in env:
        return
    said = _on_terminal(cli, env, "status", job)
    assert (
        f"1 worker is live but serves {url_b}; start one for this job's endpoint: hermes-bulk "
        f"worker, or process it here: hermes-bulk run {job} --wait"
    ) in said, said
    lines = _on_terminal(cli, env, "workers", joined=False)
    serves = "".join(row.split("│")[3] for row in lines if row.startswith("│")).replace(" ", "")
    assert serves == f"{url_b}(openai,batches)", lines  # read down its column


def _on_terminal(cli, env: dict, *args: str, joined: bool = True):
    """The command's output on an 80-column terminal, every line checked for its width, and
    its lines joined as one text (a terminal breaks a long line at spaces), or its lines."""
    saved = dict(cli.env)
    cli.env.update(env)
    try:
        rc, lines = on_terminal(cli, *args)
    finally:
        cli.env.clear()
        cli.env.update(saved)
    assert rc == 0, lines
    fits(lines, " ".join(args))
    return " ".join(" ".join(lines).split()) if joined else lines


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


def test_a_key_in_the_url_binds_the_job(cli, fake_provider, tmp_path, backend_env):
    """A job made with `?api-key=A` in the base URL and no key header is not taken by a worker
    whose URL carries key B (it says so once); its recorded endpoint hides the key; a worker
    with A does it."""
    env_a = {
        **backend_env,
        "HERMES_BULK_API_KEY": "",
        "HERMES_BULK_BASE_URL": fake_provider.base_url + "?api-key=query-key-aaaa",
    }
    env_b = {**env_a, "HERMES_BULK_BASE_URL": fake_provider.base_url + "?api-key=query-key-bbbb"}
    folder, items = _items(tmp_path, "alpha", 3)
    job = _create(cli, folder, env_a)
    cli("run", job, **env_a)
    worker_b = cli.spawn_worker("-w", "2", **env_b)
    try:
        log_b = cli.logs_dir / "worker-1.log"
        wait_for(
            lambda: log_b.exists() and f"job {job} is left to workers" in log_b.read_text(),
            timeout=30,
            message="the worker of key B says it leaves the job",
        )
        assert not fake_provider.requests
        st = _status(cli, job, env_a)
        assert (st["state"], st["completed"]) == ("waiting_for_worker", 0), st
        assert st["endpoint"] == fake_provider.base_url + "?api-key=***"
        cli("run", job, "--wait", **env_a)
    finally:
        worker_b.terminate()
        worker_b.wait(30)
    assert {r.item for r in fake_provider.requests} == items
    assert "other credentials" in log_b.read_text()


def test_every_credential_is_fingerprinted_slowly_once_per_store(settings, monkeypatch):
    """The key header, the URL's password or token and every query value each change the
    fingerprint; it is scrypt with the store's salt (recorded with its cost), computed once per
    process; a job's spec holds neither the key nor a fast hash of it."""
    import hashlib

    from hermes_bulk import credentials
    from hermes_bulk.config.provider import Endpoint
    from hermes_bulk.fleet import endpoints
    from hermes_bulk.jobs.service import Jobs

    store = Jobs(settings).backend.store
    salt = store.fingerprint_salt()
    assert salt == store.fingerprint_salt(create=False) == store.fingerprint_salt()
    assert salt.startswith("scrypt$10$8$1$")  # the suite's cost; a store records its own
    calls = []
    real = hashlib.scrypt
    monkeypatch.setattr(hashlib, "scrypt", lambda *a, **k: calls.append(1) or real(*a, **k))

    def fp(url: str, key: str | None = None) -> str:
        return endpoints.key_fingerprint(Endpoint("openai", url, key), salt)

    base = "https://gw.example/v1"
    variants = [
        fp(base, "sk-header-key"),
        fp(base, "sk-header-kez"),
        fp(f"{base}?api-key=one-query-key"),
        fp(f"{base}?api-key=one-query-kez"),
        fp(f"{base}?subscription=one-query-key"),
        fp("https://user:pass-one@gw.example/v1"),
        fp("https://user:pass-two@gw.example/v1"),
        fp("https://token-one@gw.example/v1"),
    ]
    assert len(set(variants)) == len(variants) and all(v.startswith("s1:") for v in variants)
    assert fp(base) == "" and len(calls) == len(variants)
    assert fp(f"{base}?api-key=one-query-key") == variants[2] and len(calls) == len(variants)
    other = credentials.fingerprint(
        credentials.credentials(base, "sk-header-key"), "scrypt$10$8$1$00"
    )
    assert other != variants[0]  # another store's salt, another fingerprint
    monkeypatch.delenv(credentials.COST_ENV)
    assert credentials.new_salt_record().startswith("scrypt$15$8$1$")


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


def test_jobs_of_the_old_fingerprint_are_served_where_it_said_everything(
    settings, tmp_path, monkeypatch
):
    """A job recorded with the header key's old HMAC fingerprint: a worker of that key (and no
    credential in its URL) serves it, taking it from the old route and going on on its own; a
    worker of another key, or with a key in its URL, does not."""
    from hermes_bulk import credentials
    from hermes_bulk.config.settings import load_settings
    from hermes_bulk.fleet.liveness import can_serve, serves_record
    from hermes_bulk.jobs.service import Jobs
    from hermes_bulk.runtime.worker import WorkerRuntime
    from hermes_bulk.store.protocol import WorkerInfo

    jobs = Jobs(settings)
    folder, _ = _items(tmp_path, "alpha", 2)
    job_id = jobs.create(JobRequest(instruction="Summarize", over=str(folder))).job.job_id
    old = credentials.legacy_fingerprint(settings.endpoint.api_key)
    jobs.backend.store.db.connection().execute(
        "UPDATE jobs SET spec = json_set(spec, '$.key_fingerprint', ?) WHERE id = ?", (old, job_id)
    )
    job = jobs.backend.store.get_job(job_id)
    assert job.spec.key_fingerprint == old

    def worker(**env: str) -> WorkerRuntime:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return WorkerRuntime(jobs.backend, load_settings(), threads=1)

    mine = worker()
    assert mine.serves(job) and mine.route_of(job) == mine.own_route != mine.old_route
    info = WorkerInfo("w", "h", 1, 0.0, 0.0, 1, serves_record(mine.routes()))
    assert can_serve(info, job)
    url = settings.endpoint.base_url
    assert not worker(HERMES_BULK_API_KEY="sk-another-account-key").serves(job)
    assert not worker(HERMES_BULK_BASE_URL=url + "?api-key=query-key-aaaa").serves(job)
