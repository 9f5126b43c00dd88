"""create --batch under kill -9: workers killed between creating a batch at the provider and
recording it, and in the middle of ingesting its output, five times each, on both backends.
Every item is answered once, and no item is sent in two batches (a batch left unrecorded is
found by its metadata and adopted)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter

import pytest

from hermes_bulk.fleet import broker
from hermes_bulk.testing.fake_provider import expected_answer

from .helpers import wait_for
from .test_batch_mode import BACKENDS, _finish, _rows, _source
from .test_batch_mode import FAST as POLL_FAST

# Rounds of kill -9 on both backends take minutes: `-m "not slow"` skips them locally; CI runs them.
pytestmark = pytest.mark.slow


@pytest.fixture(params=BACKENDS)
def backend_env(request, tmp_path) -> dict[str, str]:
    url = (
        f"sqlite:///{tmp_path / 'bulk.db'}"
        if request.param == "sqlite"
        else request.getfixturevalue("redis_url")
    )
    return {"HERMES_BULK_BACKEND": url, **POLL_FAST}


ROUNDS = 5
FAST = {"HERMES_BULK_LEASE_SECONDS": "0.5"}  # a killed worker's batch is taken over after 10 leases


def _kill(proc, cli, job_id, env) -> None:
    """kill -9, then `run` the job: after a crash a job waits for someone to run it (invariant
    9)."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    cli("run", job_id, **env)


def _batched_items(fake) -> Counter:
    """How many created batches each item was sent in."""
    seen: Counter = Counter()
    for batch_id in fake.batches.created:
        path = fake.batches.files[fake.batches.batches[batch_id]["input_file_id"]]
        seen.update(
            json.loads(line)["custom_id"] for line in path.read_text().splitlines() if line.strip()
        )
    return seen


def _check_answered_once(cli, job_id, env, fake, n: int) -> None:
    rows = _rows(cli, job_id, env)
    assert [r["result"] for r in rows] == [
        expected_answer(json.dumps({"n": i, "mark": ""})) for i in range(n)
    ]
    sent = _batched_items(fake)
    assert len(sent) == n and set(sent.values()) == {1}, "no item went in two batches"
    answered = Counter(r.item for r in fake.batches.lines if r.status == 200)
    assert len(answered) == n and set(answered.values()) == {1}, "every item answered once"
    assert fake.requests == []


def test_workers_killed_before_their_batch_is_recorded_leave_it_to_be_adopted(
    cli, backend_env, fake_provider, tmp_path
):
    env = {**backend_env, **FAST, "HERMES_BULK_BATCH_MAX_ITEMS": "40"}
    n = 40 * (ROUNDS + 1)
    job_id = cli.json(
        "create",
        "Summarise",
        "--over",
        str(_source(tmp_path, n)),
        "--batch",
        "--fresh",
        "--json",
        **env,
    )["job_id"]
    cli("run", job_id, **env)
    fake_provider.configure(batch_create_delay_s=30, batch_line_s=0.001)
    for round_ in range(ROUNDS):
        worker = cli.spawn_worker(**env)
        try:
            wait_for(
                lambda r=round_: len(fake_provider.batches.created) > r,
                timeout=90,
                message="a batch created at the provider",
            )
        finally:
            _kill(
                worker, cli, job_id, env
            )  # while the provider is still answering the create: the id is never recorded
    assert len(fake_provider.batches.created) == ROUNDS
    fake_provider.configure(batch_create_delay_s=0)
    status = _finish(cli, job_id, env, timeout=180)
    assert status["completed"] == n
    assert len(fake_provider.batches.created) == ROUNDS + 1, (
        "each killed worker's batch adopted, none made twice"
    )
    _check_answered_once(cli, job_id, env, fake_provider, n)


def test_workers_killed_mid_upload_leave_nothing_paid_twice(
    cli, backend_env, fake_provider, tmp_path
):
    env = {**backend_env, **FAST}
    n = 50
    job_id = cli.json(
        "create",
        "Summarise",
        "--over",
        str(_source(tmp_path, n)),
        "--batch",
        "--fresh",
        "--json",
        **env,
    )["job_id"]
    cli("run", job_id, **env)
    fake_provider.configure(batch_upload_delay_s=30)
    for round_ in range(ROUNDS):
        worker = cli.spawn_worker(**env)
        try:
            wait_for(
                lambda r=round_: len(fake_provider.batches.uploaded) > r,
                timeout=90,
                message="an upload",
            )
        finally:
            _kill(worker, cli, job_id, env)
    fake_provider.configure(batch_upload_delay_s=0)
    status = _finish(cli, job_id, env, timeout=180)
    assert status["completed"] == n and len(fake_provider.batches.created) == 1
    _check_answered_once(cli, job_id, env, fake_provider, n)


def test_workers_killed_mid_ingest_lose_and_duplicate_nothing(
    cli, backend_env, fake_provider, tmp_path
):
    env = {**backend_env, **FAST}
    n = 3000
    job_id = cli.json(
        "create",
        "Summarise",
        "--over",
        str(_source(tmp_path, n)),
        "--batch",
        "--fresh",
        "--json",
        **env,
    )["job_id"]
    cli("run", job_id, **env)
    backend = broker.build_backend(env["HERMES_BULK_BACKEND"])
    kills = 0
    try:
        last = 0
        for _ in range(ROUNDS):
            worker = cli.spawn_worker(**env)
            try:
                last = wait_for(
                    lambda before=last: (
                        (c := backend.store.get_job(job_id).completed) > before + 100 and c
                    ),
                    timeout=120,
                    interval=0.005,
                    message="ingest under way",
                )
            finally:
                _kill(worker, cli, job_id, env)
            if last < n:
                kills += 1
        job = backend.store.get_job(job_id)
    finally:
        backend.close()
    assert kills >= 3, f"killed mid-ingest only {kills} times (ingest too fast to catch)"
    assert job.completed + job.running == n and job.failed == 0
    status = _finish(cli, job_id, env, timeout=180)
    assert status["completed"] == n and len(fake_provider.batches.created) == 1
    rows = _rows(cli, job_id, env)
    assert status["tokens_in"] == sum(r["tokens_in"] for r in rows), "nothing charged twice"
    _check_answered_once(cli, job_id, env, fake_provider, n)


def test_a_killed_workers_batch_is_taken_over_at_once_not_after_its_lease(
    cli, backend_env, fake_provider, tmp_path
):
    """The default lease (30 s: a batch step's lease is 5 min): a worker killed -9 while the
    provider answers its create holds the batch's lease, but it is dead (its lock file is free),
    so the next worker takes the batch over at once and adopts it by its metadata."""
    n = 30
    job_id = cli.json(
        "create",
        "Summarise",
        "--over",
        str(_source(tmp_path, n)),
        "--batch",
        "--fresh",
        "--json",
        **backend_env,
    )["job_id"]
    cli("run", job_id, **backend_env)
    fake_provider.configure(batch_create_delay_s=60)
    worker = cli.spawn_worker(**backend_env)
    try:
        wait_for(
            lambda: fake_provider.batches.created,
            timeout=60,
            message="a batch created at the provider",
        )
    finally:
        _kill(worker, cli, job_id, backend_env)
    fake_provider.configure(batch_create_delay_s=0)
    started = time.monotonic()
    status = _finish(cli, job_id, backend_env, timeout=90)  # the lease alone would hold it 300 s
    assert status["completed"] == n and time.monotonic() - started < 90
    assert len(fake_provider.batches.created) == 1, "adopted, not made again"
    _check_answered_once(cli, job_id, backend_env, fake_provider, n)


def test_a_live_worker_keeps_its_batch_however_slow_its_upload(
    cli, backend_env, fake_provider, tmp_path
):
    """Two live workers: the one uploading slowly keeps the batch it prepares; the other, seeing
    its lease held by a live worker, takes nothing (a takeover would upload the items again)."""
    n = 30
    job_id = cli.json(
        "create",
        "Summarise",
        "--over",
        str(_source(tmp_path, n)),
        "--batch",
        "--fresh",
        "--json",
        **backend_env,
    )["job_id"]
    cli("run", job_id, **backend_env)
    fake_provider.configure(batch_upload_delay_s=6)
    status = _finish(cli, job_id, backend_env, timeout=90, workers=2)
    assert status["completed"] == n
    assert len(fake_provider.batches.uploaded) == 1 and len(fake_provider.batches.created) == 1
    _check_answered_once(cli, job_id, backend_env, fake_provider, n)
