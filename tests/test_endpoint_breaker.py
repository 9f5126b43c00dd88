"""An endpoint that is down, a key it refuses or a model it does not know pauses the job (the
breaker per endpoint, runtime/breaker.py) instead of failing its items one by one; `resume`
continues it once the endpoint is fixed, with nothing lost and no attempt charged.

Through the real CLI (`run --wait`, `resume --wait`) and a real `hermes-bulk worker`, on SQLite
and Redis, against the loopback provider (and a port where nothing listens).
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from hermes_bulk.config.settings import load_settings
from hermes_bulk.fleet import broker
from hermes_bulk.runtime.breaker import EndpointBreaker
from hermes_bulk.testing.fake_provider import FakeProvider, expected_answer

from .helpers import wait_for

#: Fast enough for a test: a job pauses after 2 failures to connect (about a second apart).
FAST = {"HERMES_BULK_BREAKER_FAILURES": "2"}
ITEMS = 30


@pytest.fixture(params=["sqlite", "redis"])
def backend(request, cli, monkeypatch) -> str:
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        cli.env["HERMES_BULK_BACKEND"] = url
        monkeypatch.setenv("HERMES_BULK_BACKEND", url)  # the store read here, in the test
    yield request.param
    broker.close_all()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def items(tmp_path: Path, n: int = ITEMS) -> Path:
    src = tmp_path / "items.jsonl"
    src.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(n)))
    return src


def attempts(job_id: str) -> list[int]:
    """Each item's counted attempts, read from the store itself."""
    store = broker.open_backend(load_settings()).store
    return [item.attempts for item in store.iter_items(job_id)]


def assert_paused_with_nothing_lost(cli, job_id: str, **env: str) -> dict:
    status = cli.status(job_id, **env)
    assert (status["state"], status["failed"], status["completed"], status["pending"]) == (
        "paused",
        0,
        0,
        ITEMS,
    ), status
    assert attempts(job_id) == [0] * ITEMS, "no attempt is charged for the endpoint's failure"
    return status


def assert_every_item_answered(cli, job_id: str, src: Path, **env: str) -> None:
    status = cli.status(job_id, **env)
    assert (status["state"], status["completed"]) == ("completed", ITEMS), status
    path = cli("export", job_id, "--format", "jsonl", **env).stdout.strip()
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    contents = [line for line in src.read_text().splitlines()]
    assert [r["result"] for r in rows] == [expected_answer(c) for c in contents]


def test_nothing_listening_pauses_the_job_naming_the_url_and_resume_finishes_it(
    backend, cli, tmp_path
):
    port = closed_port()
    url = f"http://127.0.0.1:{port}/v1"
    env = {"HERMES_BULK_BASE_URL": url, **FAST}
    src = items(tmp_path)
    job_id = json.loads(cli("create", "Do", "--over", str(src), "--json", **env).stdout)["job_id"]
    started = time.monotonic()
    run = cli("run", job_id, "--wait", "--no-check", check=False, **env)
    took = time.monotonic() - started
    assert run.returncode == 4, run.stdout + run.stderr
    status = assert_paused_with_nothing_lost(cli, job_id, **env)
    assert url in status["pause_reason"] and "resume" in status["pause_reason"], status[
        "pause_reason"
    ]
    assert url in run.stdout and "Continue with: hermes-bulk resume" in run.stdout, run.stdout
    assert took < 30, f"paused after {took:.1f} s"

    provider = FakeProvider(port=port).start()  # the user starts the endpoint
    try:
        resumed = cli("resume", job_id, "--wait", **env)
        assert "completed" in resumed.stdout
        assert_every_item_answered(cli, job_id, src, **env)
        assert len(provider.requests) == ITEMS, "each item asked once, once the endpoint is up"
    finally:
        provider.stop()


def test_a_refused_key_pauses_the_job_at_once_in_a_worker_process(
    backend, cli, tmp_path, fake_provider
):
    fake_provider.configure(require_key="sk-the-right-one")
    src = items(tmp_path)
    job_id = cli.create("Do", src)
    worker = cli.spawn_worker("-w", "4", **FAST)
    cli("run", job_id, "--no-check")
    # Paused at the first 401; the other threads' requests, already sent, come back refused too
    # and give their items back.
    wait_for(
        lambda: (st := cli.status(job_id))["state"] == "paused" and st["running"] == 0,
        timeout=60,
        message="the job paused with nothing in flight",
    )
    status = assert_paused_with_nothing_lost(cli, job_id)
    reason = status["pause_reason"]
    assert (
        "refused the API key this job was created with (HTTP 401)" in reason
        and fake_provider.base_url in reason
    ), reason
    assert "HERMES_BULK_API_KEY" in reason
    shown = cli("status", job_id).stdout + json.dumps(status)
    assert "sk-test-not-a-secret" not in shown and "sk-LEAKED" not in shown
    assert len(fake_provider.requests) <= 4, (
        "one request per thread at most, not one per item and retry"
    )

    fake_provider.configure(require_key=None)  # the user corrects the key
    cli("resume", job_id)
    wait_for(
        lambda: cli.status(job_id)["state"] == "completed", timeout=60, message="the job completed"
    )
    worker.terminate()
    worker.wait(30)
    assert_every_item_answered(cli, job_id, src)


def test_an_unknown_model_pauses_the_job_naming_the_model(backend, cli, tmp_path, fake_provider):
    fake_provider.configure(models=["another-model"])
    src = items(tmp_path)
    job_id = cli.create("Do", src)
    run = cli("run", job_id, "--wait", "--no-check", check=False)
    assert run.returncode == 4, run.stdout + run.stderr
    status = assert_paused_with_nothing_lost(cli, job_id)
    reason = status["pause_reason"]
    assert (
        "does not know the model 'fake-model' (HTTP 404)" in reason
        and fake_provider.base_url in reason
    ), reason
    assert "sk-LEAKED" not in reason
    fake_provider.configure(models=["another-model", "fake-model"])  # the endpoint loads the model
    cli("resume", job_id, "--wait")
    assert_every_item_answered(cli, job_id, src)


def test_run_checks_the_endpoint_before_it_enqueues_anything(cli, tmp_path, fake_provider):
    url = f"http://127.0.0.1:{closed_port()}/v1"
    job_id = json.loads(
        cli(
            "create", "Do", "--over", str(items(tmp_path)), "--json", HERMES_BULK_BASE_URL=url
        ).stdout
    )["job_id"]
    refused = cli("run", job_id, check=False, HERMES_BULK_BASE_URL=url)
    assert refused.returncode == 1
    assert f"FAIL endpoint {url} cannot be reached (ConnectError)" in refused.stderr, refused.stderr
    assert "--no-check" in refused.stderr and "Traceback" not in refused.stderr
    assert cli.status(job_id, HERMES_BULK_BASE_URL=url)["state"] == "not_started"

    fake_provider.configure(require_key="sk-the-right-one")
    refused = cli("run", job_id, check=False)
    assert refused.returncode == 1 and "FAIL key" in refused.stderr, refused.stderr
    assert cli.status(job_id)["state"] == "not_started"
    assert fake_provider.requests == [] or all(r.status == 401 for r in fake_provider.requests)

    skipped = cli("run", job_id, "--no-check", check=False, HERMES_BULK_BASE_URL=url)
    # set running, unchecked; no worker is live, and run says so (issue 46, 11)
    assert skipped.returncode == 0 and "waits for a worker" in skipped.stdout, skipped.stderr
    fake_provider.configure(require_key=None)
    # The job keeps the endpoint it was created with: that endpoint comes up, and the check passes
    # on one GET /models.
    up = FakeProvider(port=int(url.rsplit(":", 1)[1].split("/")[0])).start()
    try:
        fine = cli("run", job_id, "--wait", HERMES_BULK_BASE_URL=url)
    finally:
        up.stop()
    assert "completed" in fine.stdout


def test_parallel_failures_in_one_moment_count_once():
    now = [0.0]
    breaker = EndpointBreaker(3, clock=lambda: now[0])
    verdicts = [
        breaker.unreachable(breaker.attempt("k")) for _ in range(16)
    ]  # 16 threads, one blip
    assert [v.streak for v in verdicts] == [1] * 16 and not any(v.tripped for v in verdicts)
    now[0] = 1.0
    assert breaker.unreachable(breaker.attempt("k")).streak == 2
    attempt = breaker.attempt("k")
    breaker.answered("k")  # another request got an answer: the endpoint is up
    verdict = breaker.unreachable(attempt)
    assert (verdict.streak, verdict.tripped, verdict.answered_since) == (1, False, True)
    for second in (2.0, 3.0):
        now[0] = second
        verdict = breaker.unreachable(breaker.attempt("k"))
    assert verdict.tripped and verdict.streak == 3
    assert not breaker.unreachable(breaker.attempt("other")).tripped, "per endpoint"


def test_doctor_says_what_it_found_one_line_per_check(cli, fake_provider):
    good = cli("doctor")
    assert good.returncode == 0
    assert good.stdout.splitlines() == [
        f"ok   endpoint {fake_provider.base_url} answers (GET /models: HTTP 200)",
        "ok   key      accepted",
        "ok   model    'fake-model' is listed by the endpoint",
        "Usable.",
    ]
    assert [r.status for r in fake_provider.requests] == [], (
        "GET /models only: no chat request was paid for"
    )

    url = f"http://127.0.0.1:{closed_port()}/v1"
    down = cli("doctor", check=False, HERMES_BULK_BASE_URL=url)
    assert down.returncode == 1
    assert down.stdout.splitlines()[:3] == [
        f"FAIL endpoint {url} cannot be reached (ConnectError): start it, or correct "
        "HERMES_BULK_BASE_URL (or OPENAI_BASE_URL)",
        "--   key      not checked (no answer)",
        "--   model    not checked (no answer)",
    ]

    fake_provider.configure(require_key="sk-the-right-one")
    refused = cli("doctor", check=False)
    assert refused.returncode == 1
    assert (
        "FAIL key      refused (HTTP 401): correct HERMES_BULK_API_KEY (or OPENAI_API_KEY)"
        in refused.stdout
    )
    fake_provider.configure(require_key=None, models=["another-model"])
    unknown = cli("doctor", check=False)
    assert unknown.returncode == 1
    assert "FAIL model    'fake-model' is unknown to the endpoint" in unknown.stdout, unknown.stdout
    assert cli("doctor", "--model", "another-model").returncode == 0
    everything = "".join(p.stdout + p.stderr for p in (good, down, refused, unknown))
    assert "sk-test-not-a-secret" not in everything and "sk-LEAKED" not in everything
    assert "Traceback" not in everything
