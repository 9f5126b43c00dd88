"""create --batch: a job run through the provider's Batch API, by real CLI and worker processes,
on both backends and both protocols (OpenAI's Batch API, Anthropic's Message Batches), against
the loopback provider's batch endpoints."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
from pathlib import Path

import pytest

from hermes_bulk.config.settings import load_settings
from hermes_bulk.errors import InvalidTransition
from hermes_bulk.fleet import broker
from hermes_bulk.jobs.service import Jobs
from hermes_bulk.providers.pacing import RATE_LIMIT_BASE_S, RATE_LIMIT_CAP_S
from hermes_bulk.runtime.batch_delete import DELETE_WAIT_S
from hermes_bulk.testing.fake_provider import digest, expected_answer

from .helpers import wait_for

BACKENDS = ["sqlite", "redis"]
FAST = {"HERMES_BULK_BATCH_POLL_SECONDS": "0.1"}
#: The settings that choose each protocol's batch API (the fake serves both at one base URL).
PROTOCOLS = {"openai": {}, "anthropic": {"HERMES_BULK_PROVIDER": "anthropic"}}


def backend_settings(request, backend: str) -> dict[str, str]:
    if backend == "sqlite":
        return {
            "HERMES_BULK_BACKEND": f"sqlite:///{request.getfixturevalue('tmp_path') / 'bulk.db'}"
        }
    return {"HERMES_BULK_BACKEND": request.getfixturevalue("redis_url")}


@pytest.fixture(
    params=[(b, p) for p in PROTOCOLS for b in BACKENDS], ids=lambda bp: f"{bp[0]}-{bp[1]}"
)
def backend_env(request) -> dict[str, str]:
    """Each backend on each protocol: the same end-to-end tests hold both batch APIs."""
    backend, protocol = request.param
    return {**backend_settings(request, backend), **FAST, **PROTOCOLS[protocol]}


def batch_prefix(env: dict[str, str]) -> str:
    """How the provider's ids of batches begin on the env's protocol."""
    return "msgbatch_" if env.get("HERMES_BULK_PROVIDER") == "anthropic" else "batch_"


def _source(
    tmp_path: Path, n: int, name: str = "items.jsonl", marks: dict[int, str] | None = None
) -> Path:
    src = tmp_path / name
    marks = marks or {}
    src.write_text("".join(json.dumps({"n": i, "mark": marks.get(i, "")}) + "\n" for i in range(n)))
    return src


def _rows(cli, job_id: str, env: dict[str, str]) -> list[dict]:
    out = Path(cli("export", job_id, "--format", "jsonl", **env).stdout.strip())
    return [json.loads(line) for line in out.read_text().splitlines()]


def _finish(
    cli, job_id: str, env: dict[str, str], *, timeout: float = 120, workers: int = 1
) -> dict:
    procs = [cli.spawn_worker("-w", "2", **env) for _ in range(workers)]
    try:
        return wait_for(
            lambda: (
                (st := cli.status(job_id, **env))["state"]
                in ("completed", "completed_with_errors", "failed")
                and st
            ),
            timeout=timeout,
            interval=0.3,
            message="the job to end",
        )
    finally:
        for p in procs:
            p.send_signal(signal.SIGINT)
            p.wait(60)


def test_a_batch_job_answers_every_item_as_the_same_job_run_live_does(
    cli, backend_env, fake_provider, tmp_path
):
    env = {**backend_env, "HERMES_BULK_BATCH_MAX_ITEMS": "700"}
    src = _source(tmp_path, 2000)
    batch_job = cli.json(
        "create", "Summarise", "--over", str(src), "--batch", "--fresh", "--json", **env
    )["job_id"]
    cli("run", batch_job, **env)
    status = _finish(cli, batch_job, env)
    assert status["state"] == "completed" and status["mode"] == "batch"
    assert fake_provider.requests == [], "no live chat-completions call was made"
    bodies = fake_provider.batches.bodies()
    assert len(bodies) == 2000 and len(fake_provider.batches.created) == 3, (
        "2,000 items split at 700 a batch"
    )
    assert sorted(b["id"] for b in status["batches"]) == sorted(fake_provider.batches.created)
    assert all(b["status"] == "completed" for b in status["batches"]), (
        "the provider's final status, not ours"
    )
    assert sum(b["items"] for b in status["batches"]) == 2000
    batch_rows = _rows(cli, batch_job, env)

    live_job = cli.json(
        "create", "Summarise", "--over", str(src), "--fresh", "--concurrency", "16", "--json", **env
    )["job_id"]
    cli("run", live_job, **env)
    live = _finish(cli, live_job, env)
    assert live["mode"] == "live" and live["batches"] == []
    assert len(fake_provider.requests) == 2000
    live_rows = _rows(cli, live_job, env)
    assert batch_rows == live_rows, "item for item: name, status, result, tokens, provider, model"
    assert [r["result"] for r in batch_rows] == [
        expected_answer(json.dumps({"n": i, "mark": ""})) for i in range(2000)
    ]
    # One chat-completions body per item, each the body a live call sent.
    assert sorted(digest(json.dumps({"n": i, "mark": ""})) for i in range(2000)) == sorted(
        r.item for r in fake_provider.batches.lines
    )


def _create(cli, src: Path, env: dict[str, str], *flags: str) -> str:
    job_id = cli.json(
        "create", "Summarise", "--over", str(src), "--batch", "--fresh", *flags, "--json", **env
    )["job_id"]
    cli("run", job_id, **env)
    return job_id


def test_a_transient_line_is_retried_in_a_later_batch_and_a_permanent_one_fails(
    cli, backend_env, fake_provider, tmp_path
):
    src = _source(tmp_path, 60, marks={3: "T-3", 7: "T-7", 5: "PERMANENT-400"})
    fake_provider.configure(
        fail_once={"T-3": "500", "T-7": "503"}, item_faults={"PERMANENT-400": "400"}
    )
    job_id = _create(cli, src, backend_env)
    status = _finish(cli, job_id, backend_env)
    assert (status["state"], status["completed"], status["failed"]) == (
        "completed_with_errors",
        59,
        1,
    )
    assert len(fake_provider.batches.created) == 2, "the two transient lines went in a second batch"
    assert (
        "Mode: batch (the provider's Batch API): 2 batches, 0 open"
        in cli("status", job_id, **backend_env).stdout
    )
    second = fake_provider.batches.batches[fake_provider.batches.created[1]]
    assert second["request_counts"]["total"] == 2
    rows = _rows(cli, job_id, backend_env)
    failed = [r for r in rows if r["status"] == "failed"]
    assert [r["item"] for r in failed] == ["line:6"]
    assert "400" in failed[0]["error"] and "LEAKED" not in json.dumps(rows), (
        "no provider text in the records"
    )
    assert fake_provider.requests == []


def test_a_permanently_transient_line_fails_after_its_retries(
    cli, backend_env, fake_provider, tmp_path
):
    src = _source(tmp_path, 5, marks={2: "ALWAYS-503"})
    fake_provider.configure(item_faults={"ALWAYS-503": "503"})
    job_id = _create(cli, src, backend_env, "--retries", "1")
    status = _finish(cli, job_id, backend_env)
    assert (status["completed"], status["failed"]) == (4, 1)
    assert len(fake_provider.batches.created) == 2, "one retry: the item was in two batches"


def test_an_expired_batch_returns_its_unfinished_items_and_they_run_again(
    cli, backend_env, fake_provider, tmp_path
):
    src = _source(tmp_path, 50)
    fake_provider.configure(batch_expire_after=30)
    job_id = _create(cli, src, backend_env)
    status = _finish(cli, job_id, backend_env)
    assert (status["state"], status["completed"]) == ("completed", 50)
    first, second = (fake_provider.batches.batches[b] for b in fake_provider.batches.created)
    assert first["status"] == "expired" and first["request_counts"]["completed"] == 30
    assert second["status"] == "completed" and second["request_counts"]["total"] == 20
    assert [b["status"] for b in status["batches"]] == ["expired", "completed"]
    assert len([r for r in fake_provider.batches.lines if r.status == 200]) == 50, (
        "each item answered once"
    )


def test_pause_cancels_the_batch_keeping_finished_lines_and_resume_finishes(
    cli, backend_env, fake_provider, tmp_path
):
    src = _source(tmp_path, 100)
    fake_provider.configure(batch_line_s=0.05)
    job_id = _create(cli, src, backend_env)
    worker = cli.spawn_worker(**backend_env)
    try:
        wait_for(
            lambda: len(fake_provider.batches.lines) >= 10,
            timeout=60,
            message="the batch to be under way",
        )
        cli("pause", job_id, **backend_env)
        paused = wait_for(
            lambda: (
                (st := cli.status(job_id, **backend_env))["batches"]
                and all(b["status"] == "cancelled" for b in st["batches"])
                and st["running"] == 0
                and st
            ),
            timeout=60,
            message="the batch to be cancelled and ingested",
        )
        (batch,) = fake_provider.batches.batches.values()
        assert batch["status"] == "cancelled"
        assert paused["state"] == "paused" and 10 <= paused["completed"] < 100
        assert paused["completed"] + paused["pending"] == 100 and paused["running"] == 0
        fake_provider.configure(batch_line_s=0)
        cli("resume", job_id, **backend_env)
        done = wait_for(
            lambda: (st := cli.status(job_id, **backend_env))["state"] == "completed" and st,
            timeout=60,
            message="the resumed job to finish",
        )
    finally:
        worker.send_signal(signal.SIGINT)
        worker.wait(60)
    assert done["completed"] == 100 and len(fake_provider.batches.created) == 2
    answered = [r.item for r in fake_provider.batches.lines if r.status == 200]
    assert len(answered) == len(set(answered)) == 100, "no item answered twice"
    assert fake_provider.requests == []


def test_items_still_in_a_batch_at_the_deadline_run_live(cli, backend_env, fake_provider, tmp_path):
    src = _source(tmp_path, 40)
    fake_provider.configure(batch_hold=True)
    job_id = _create(cli, src, backend_env, "--batch-deadline", "2s", "--concurrency", "8")
    status = _finish(cli, job_id, backend_env)
    assert (status["state"], status["completed"]) == ("completed", 40)
    (batch,) = fake_provider.batches.batches.values()
    assert batch["status"] == "cancelled" and fake_provider.batches.lines == []
    assert len(fake_provider.requests) == 40, "the rest ran live"
    assert status["batches"][0]["run_rest_live"] is True


def test_bad_batch_flags_are_one_line_and_exit_2(cli, tmp_path):
    src = _source(tmp_path, 3)
    for flags, words in (
        (["--batch", "--batch-deadline", "soon"], "is not a duration"),
        (["--batch-deadline", "1h"], "--batch-deadline is for batch jobs; add --batch."),
    ):
        proc = cli("create", "x", "--over", str(src), *flags, check=False)
        assert proc.returncode == 2, proc.stderr
        (line,) = proc.stderr.strip().splitlines()[-1:]
        assert words in line and "Traceback" not in proc.stderr


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"  # nothing listens there once the socket is closed


def _wait_for_a_recorded_batch(cli, job_id: str, backend_env: dict) -> None:
    """Until the job has a batch with the provider's id recorded (submitted, not only prepared)."""
    prefix = batch_prefix(backend_env)
    wait_for(
        lambda: any(
            b["id"].startswith(prefix) for b in cli.status(job_id, **backend_env)["batches"]
        ),
        timeout=60,
        message="the batch submitted and recorded",
    )


def test_delete_cancels_the_batches_open_at_the_provider_or_deletes_nothing(
    cli, backend_env, fake_provider, tmp_path
):
    """A batch job whose worker was killed (awaiting recovery): its submitted batch, and one a
    worker created but never recorded (found by its metadata), are paid for while they run.
    delete cancels both there; with the provider out of reach it deletes nothing, in one line."""
    fake_provider.configure(batch_hold=True)
    submitted = _create(cli, _source(tmp_path, 20), backend_env)
    worker = cli.spawn_worker(**backend_env)
    try:
        _wait_for_a_recorded_batch(cli, submitted, backend_env)
        fake_provider.configure(batch_create_delay_s=60)
        unrecorded = _create(cli, _source(tmp_path, 10, name="more.jsonl"), backend_env)
        wait_for(
            lambda: len(fake_provider.batches.created) == 2,
            timeout=60,
            message="a second batch created",
        )
    finally:
        os.kill(worker.pid, signal.SIGKILL)  # while the provider still answers the second create
        worker.wait()
    first, second = fake_provider.batches.created
    assert cli.status(unrecorded, **backend_env)["batches"][0]["status"] == "preparing"

    for job_id in (submitted, unrecorded):
        proc = cli(
            "delete", job_id, check=False, HERMES_BULK_BASE_URL=_closed_port_url(), **backend_env
        )
        assert proc.returncode != 0 and "Traceback" not in proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert f"Job {job_id} was not deleted" in line and "--abandon-batches" in line, line
        assert cli.status(job_id, **backend_env)["total"] > 0, "nothing deleted"
    assert {fake_provider.batches.batches[b]["status"] for b in (first, second)} == {"in_progress"}

    for job_id in (submitted, unrecorded):
        assert f"Deleted job {job_id}." in cli("delete", job_id, **backend_env).stdout
    wait_for(
        lambda: (
            {fake_provider.batches.batches[b]["status"] for b in (first, second)} == {"cancelled"}
        ),
        timeout=30,
        message="both batches cancelled at the provider",
    )
    assert fake_provider.requests == []


def test_delete_in_a_long_429_pause_refuses_at_once_and_sits_out_a_short_one(
    cli, backend_env, fake_provider, tmp_path, monkeypatch
):
    """Cancelling at the provider goes through the key's shared 429 wait, which a Retry-After
    may make an hour long: delete waits out a few seconds of it, and refuses a longer one in
    one line that says how long, deleting nothing."""
    fake_provider.configure(batch_hold=True)
    job_id = _create(cli, _source(tmp_path, 5), backend_env)
    worker = cli.spawn_worker(**backend_env)
    try:
        _wait_for_a_recorded_batch(cli, job_id, backend_env)
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
    for key, value in cli.full_env(**backend_env).items():
        monkeypatch.setenv(key, value)
    jobs = Jobs(load_settings())
    try:
        # The jobs API speaks to no provider: without a front end's canceller it deletes nothing.
        with pytest.raises(InvalidTransition, match="cannot cancel them here"):
            jobs.delete(job_id)
        assert jobs.get(job_id).total == 5
        key = jobs.get(job_id).spec.provider_key
        pause_s = DELETE_WAIT_S + 6
        ends = jobs.backend.limits.pause(
            key, seconds=pause_s, base_s=RATE_LIMIT_BASE_S, cap_s=RATE_LIMIT_CAP_S, epoch=0
        )
        proc = cli("delete", job_id, check=False, **backend_env)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert (
            f"Job {job_id} was not deleted" in line
            and "HTTP 429" in line
            and "--abandon-batches" in line
        ), line
        assert jobs.store.now() < ends - DELETE_WAIT_S + 3, "refused without sitting out the pause"
        assert cli.status(job_id, **backend_env)["total"] == 5, "nothing deleted"
        (batch,) = fake_provider.batches.batches.values()
        assert batch["status"] == "in_progress"
        wait_for(
            lambda: jobs.store.now() > ends - DELETE_WAIT_S + 2,
            timeout=30,
            message="the pause nearly over",
        )
        assert f"Deleted job {job_id}." in cli("delete", job_id, **backend_env).stdout
        assert jobs.store.now() >= ends - 0.5, "the cancel was sent after the pause, not during it"
        assert batch["status"] in ("cancelling", "cancelled")
    finally:
        broker.close_all()


def test_delete_abandon_batches_deletes_without_the_provider(
    cli, backend_env, fake_provider, tmp_path
):
    fake_provider.configure(batch_hold=True)
    job_id = _create(cli, _source(tmp_path, 5), backend_env)
    worker = cli.spawn_worker(**backend_env)
    try:
        _wait_for_a_recorded_batch(cli, job_id, backend_env)
        cli("pause", job_id, **backend_env)  # the worker cancels it: nothing open is left to cancel
        wait_for(
            lambda: cli.status(job_id, **backend_env)["running"] == 0,
            timeout=60,
            message="the batch cancelled and ingested",
        )
    finally:
        worker.send_signal(signal.SIGINT)
        worker.wait(60)
    (batch,) = fake_provider.batches.batches.values()
    assert batch["status"] == "cancelled"
    assert (
        "Deleted job"
        in cli("delete", job_id, HERMES_BULK_BASE_URL=_closed_port_url(), **backend_env).stdout
    ), "no batch open: the provider is not asked"
    other = _create(cli, _source(tmp_path, 5, name="b.jsonl"), backend_env)
    worker = cli.spawn_worker(**backend_env)
    try:
        wait_for(
            lambda: (
                len(fake_provider.batches.created) == 2
                and cli.status(other, **backend_env)["batches"][0]["id"].startswith(
                    batch_prefix(backend_env)
                )
            ),
            timeout=60,
            message="the second batch submitted",
        )
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
    assert (
        "Deleted job"
        in cli(
            "delete",
            other,
            "--abandon-batches",
            HERMES_BULK_BASE_URL=_closed_port_url(),
            **backend_env,
        ).stdout
    )
    assert (
        fake_provider.batches.batches[fake_provider.batches.created[1]]["status"] == "in_progress"
    ), "abandoned: left running, as asked"


def test_status_follows_each_open_batch_and_the_jobs_own_poll_wins(
    cli, backend_env, fake_provider, tmp_path
):
    env = {**backend_env, "HERMES_BULK_BATCH_POLL_SECONDS": "600"}  # the worker's: ten minutes
    fake_provider.configure(batch_hold=True)
    src = _source(tmp_path, 3)
    job_id = cli.json(
        "create", "Summarise", "--over", str(src), "--batch", "--poll", "1", "--json", **env
    )["job_id"]
    cli("run", job_id, **env)
    worker = cli.spawn_worker("-w", "2", **env)
    try:
        first = wait_for(
            lambda: (b := cli.status(job_id, **env)["batches"]) and b[0]["polled_at"] and b[0],
            timeout=30,
            message="the batch submitted and polled",
        )
        # Polled again within seconds: the job's --poll 1, not the worker's 600 s.
        again = wait_for(
            lambda: (
                (b := cli.status(job_id, **env)["batches"][0])["polled_at"] > first["polled_at"]
                and b
            ),
            timeout=15,
            message="a second poll",
        )
        assert again["next_poll_at"] == pytest.approx(again["polled_at"] + 1)
        text = cli("status", job_id, **env).stdout
        assert "3 in provider batches" in text and "1 open; polled every 1 s" in text, text
        assert re.search(
            rf"  {again['id']} in progress: 0/3 answered; polled \d\d:\d\d:\d\d, next about "
            r"\d\d:\d\d:\d\d",
            text,
        ), text
        fake_provider.configure(batch_hold=False)
        done = wait_for(
            lambda: (st := cli.status(job_id, **env))["state"] == "completed" and st,
            timeout=30,
            message="the batch job to complete",
        )
        assert done["batches"][0]["next_poll_at"] is None, "an ended batch is not polled again"
    finally:
        worker.send_signal(signal.SIGINT)
        worker.wait(60)
    proc = cli("create", "x", "--over", str(src), "--poll", "5", check=False, **env)
    assert proc.returncode == 2 and "--poll is for batch jobs; add --batch." in proc.stderr
