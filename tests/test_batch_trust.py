"""A provider's Batch API that answers garbage, by real worker processes on both backends and both
protocols (OpenAI's Batch API, Anthropic's Message Batches) against the loopback provider's
hostile modes (fake_batches.BatchFaults): every job ends, each item completed or failed with a
reason in our words, in a bounded time, and other jobs go on."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hermes_bulk.jobs.request import JobRequest
from hermes_bulk.providers.batch_api import LINE_HEAD_BYTES, bounded_lines, read_line
from hermes_bulk.runtime.batch_requests import bound_index
from hermes_bulk.testing.fake_batches import ABSENT
from hermes_bulk.testing.fake_provider import expected_answer

from .helpers import wait_for
from .test_batch_mode import _finish, _rows, _source, backend_env, batch_prefix  # noqa: F401

#: Every hostile scenario ends well within this (its bounds: MAX_STRIKES polls, retries, a cancel
#: grace).
ENDS_WITHIN_S = 60


def _create(cli, src: Path, env: dict[str, str], *flags: str) -> str:
    job_id = cli.json(
        "create", "Summarise", "--over", str(src), "--batch", "--fresh", *flags, "--json", **env
    )["job_id"]
    cli("run", job_id, **env)
    return job_id


def _ends(cli, job_id: str, env: dict[str, str], scenario: str) -> dict:
    """Runs a worker until the job ends (bounded), and says how long that took."""
    started = time.monotonic()
    status = _finish(cli, job_id, env, timeout=ENDS_WITHIN_S)
    print(f"\nTIME-TO-END {scenario}: {time.monotonic() - started:.1f} s")
    assert status["running"] == 0 and status["pending"] == 0
    assert status["completed"] + status["failed"] == status["total"], (
        "every item completed or failed"
    )
    return status


def _failures(cli, job_id: str, env: dict[str, str]) -> dict[str, dict]:
    return {f["item"]: f for f in cli.json("status", job_id, "--failed", "--json", **env)}


def _events(cli, job_id: str, env: dict[str, str]) -> str:
    return cli("events", job_id, **env).stdout


MARKS = {
    1: "NOT-OBJECT",
    2: "NOT-JSON",
    3: "BAD-STATUS",
    4: "BAD-BODY",
    5: "MISSING",
    6: "NO-CUSTOM-ID",
}


def test_malformed_lines_are_failed_attempts_and_the_job_ends(
    cli, backend_env, fake_provider, tmp_path
):
    """Lines that are not objects, not JSON, badly typed, without a custom_id or missing: each a
    failed attempt of its item (within --retries), never an exception out of the pass."""
    fake_provider.batches.configure(
        line_faults={
            "NOT-OBJECT": "not_object",
            "NOT-JSON": "not_json",
            "BAD-STATUS": "bad_status",
            "BAD-BODY": "bad_body",
            "MISSING": "missing",
            "NO-CUSTOM-ID": "no_custom_id",
        }
    )
    job_id = _create(cli, _source(tmp_path, 9, marks=MARKS), backend_env, "--retries", "1")
    status = _ends(cli, job_id, backend_env, "malformed lines")
    assert (status["state"], status["completed"], status["failed"]) == (
        "completed_with_errors",
        3,
        6,
    )
    assert len(fake_provider.batches.created) == 2, (
        "one retry: each bad item was in two batches, no more"
    )
    failed = _failures(cli, job_id, backend_env)
    invalid = {failed[f"line:{i + 1}"]["message"] for i in (2, 3, 4)}
    assert all(
        m.startswith(f"batch {batch_prefix(backend_env)}") and "answered this item with a line" in m
        for m in invalid
    ), invalid
    bad_status = {  # the fault's shape on each protocol: a status code, a result's type
        "batch_": "without a usable status code",
        "msgbatch_": "whose result is of no known type",
    }[batch_prefix(backend_env)]
    assert "not JSON" in failed["line:3"]["message"] and bad_status in failed["line:4"]["message"]
    assert "not an object" in failed["line:5"]["message"]
    for i in (1, 5, 6):  # no custom_id to bind the line to: the item was not answered
        assert failed[f"line:{i + 1}"]["error_type"] == "BatchUnanswered"
        assert (
            "completed without a usable answer for this item" in failed[f"line:{i + 1}"]["message"]
        )
    assert "LEAKED" not in json.dumps(failed)


def test_an_unanswered_line_costs_an_attempt_each_batch_and_retries_end_it(
    cli, backend_env, fake_provider, tmp_path
):
    fake_provider.batches.configure(line_faults={"MISSING": "missing"})
    job_id = _create(cli, _source(tmp_path, 5, marks={2: "MISSING"}), backend_env, "--retries", "2")
    status = _ends(cli, job_id, backend_env, "an unanswered line")
    assert (status["completed"], status["failed"]) == (4, 1)
    assert len(fake_provider.batches.created) == 3, (
        "the first batch and two retries, not one batch a pass"
    )
    assert _failures(cli, job_id, backend_env)["line:3"]["error_type"] == "BatchUnanswered"


def test_a_provider_that_only_ever_expires_batches_cannot_keep_a_job_going(
    cli, backend_env, fake_provider, tmp_path
):
    """An expired batch's items go back free only when it answered something: one that answered
    nothing costs each item an attempt, so --retries ends the job."""
    fake_provider.configure(batch_expire_after=0)
    job_id = _create(cli, _source(tmp_path, 4), backend_env, "--retries", "1")
    status = _ends(cli, job_id, backend_env, "every batch expires unanswered")
    assert (status["state"], status["failed"]) == ("failed", 4)
    assert len(fake_provider.batches.created) == 2
    messages = {f["message"] for f in _failures(cli, job_id, backend_env).values()}
    assert all("expired without answering any item" in m for m in messages), messages


def test_lines_are_read_in_bounded_pieces_and_checked():
    chunks = [
        b'{"custom_id": "hb-j-b-1", "x": "' + b"y" * 50,
        b"y" * 5000 + b'"}\n{"a"',
        b": 1}\n\n[1]",
    ]
    lines = list(bounded_lines(chunks, 1024))
    assert [(len(raw) <= LINE_HEAD_BYTES, over) for raw, over in lines] == [
        (True, True),
        (True, False),
        (True, False),
    ]
    assert read_line(lines[0][0], overlong=True, max_bytes=1024).custom_id == "hb-j-b-1"
    assert read_line(lines[1][0]).problem == "a line without a custom_id"
    assert read_line(lines[2][0]).problem == "a line that is not a JSON object"
    good = json.dumps(
        {"custom_id": "c", "response": {"status_code": 200, "body": {}}, "error": None}
    ).encode()
    assert read_line(good).data is not None and read_line(good).problem is None
    assert bound_index("hb-abc-def-7", "abc", "def") == 7
    assert bound_index("hb-abc-other-7", "abc", "def") is None, "sent in another batch"
    assert bound_index("hb-zzz-def-7", "abc", "def") is None, "another job's"
    assert bound_index("item-7", "abc", "0123456789ab") == 7, "a batch opened before ids were bound"
    assert bound_index("item-7", "abc", "0123456789abcdef") is None
    assert bound_index(["item-7"], "abc", "def") is None


#: Batch objects described wrongly, in each protocol's shapes (by the provider's batch id prefix).
WRONG_BATCHES = {
    "counts": {
        "batch_": {"request_counts": {"total": 5, "completed": "abc", "failed": 0}},
        "msgbatch_": {"request_counts": {"succeeded": "abc", "errored": 0, "processing": 5}},
    },
    "of-another-shape": {
        "batch_": {"output_file_id": ["file-1"]},
        "msgbatch_": {"type": "batch"},
    },
    "status": {"batch_": {"status": "done-ish"}, "msgbatch_": {"processing_status": "done-ish"}},
    "id": {"batch_": {"id": "../files/elsewhere"}, "msgbatch_": {"id": "../files/elsewhere"}},
}


@pytest.mark.parametrize("wrong", sorted(WRONG_BATCHES))
def test_a_batch_the_provider_describes_wrongly_is_given_up_and_the_job_ends(
    cli, backend_env, fake_provider, tmp_path, wrong
):
    fields = WRONG_BATCHES[wrong][batch_prefix(backend_env)]
    fake_provider.batches.configure(create_fields=fields, poll_fields=fields)
    job_id = _create(cli, _source(tmp_path, 5), backend_env, "--retries", "1")
    status = _ends(cli, job_id, backend_env, f"bad batch object {sorted(fields)}")
    assert (status["state"], status["failed"]) == ("failed", 5)
    assert len(fake_provider.batches.created) == 2, "given up once per try, within --retries"
    messages = {f["message"] for f in _failures(cli, job_id, backend_env).values()}
    assert all("was given up" in m and "the provider's" in m for m in messages), messages
    assert all(b["status"] == "abandoned" for b in status["batches"])


def test_a_create_answer_without_an_id_is_found_by_its_metadata(
    cli, backend_env, fake_provider, tmp_path
):
    fake_provider.batches.configure(create_fields={"id": ABSENT})
    job_id = _create(cli, _source(tmp_path, 5), backend_env)
    status = _ends(cli, job_id, backend_env, "create answer without id")
    assert (status["state"], status["completed"]) == ("completed", 5)
    assert len(fake_provider.batches.created) == 1, "adopted, not created again"


def test_answers_of_another_job_are_ignored(cli, backend_env, fake_provider, tmp_path):
    first = _create(
        cli,
        _source(tmp_path, 5, name="first.jsonl", marks={i: "FIRST" for i in range(5)}),
        backend_env,
    )
    assert _finish(cli, first, backend_env)["completed"] == 5
    fake_provider.batches.configure(
        foreign_lines=True
    )  # the first batch's lines, before the second's own
    second = _create(cli, _source(tmp_path, 5, name="second.jsonl"), backend_env)
    status = _ends(cli, second, backend_env, "another job's answers")
    assert status["completed"] == 5
    assert [r["result"] for r in _rows(cli, second, backend_env)] == [
        expected_answer(json.dumps({"n": i, "mark": ""})) for i in range(5)
    ], "its own answers, not the first job's"
    assert "5 lines for requests not sent in it" in _events(cli, second, backend_env)


def test_an_overlong_line_is_an_invalid_answer_read_in_bounded_memory(
    cli, backend_env, fake_provider, tmp_path
):
    env = {**backend_env, "HERMES_BULK_BATCH_MAX_LINE_BYTES": "65536"}
    fake_provider.batches.configure(
        line_faults={"HUGE-A": "huge", "HUGE-B": "huge_unterminated"},
        huge_line_bytes=3 * 1024 * 1024,
    )
    job_id = _create(
        cli, _source(tmp_path, 5, marks={1: "HUGE-A", 3: "HUGE-B"}), env, "--retries", "0"
    )
    status = _ends(cli, job_id, env, "overlong lines")
    assert (status["completed"], status["failed"]) == (3, 2)
    failed = _failures(cli, job_id, env)
    for name in ("line:2", "line:4"):  # its custom_id is at the line's start: the item is known
        assert failed[name]["error_type"] == "InvalidBatchLine"
        assert "a line longer than 65536 bytes" in failed[name]["message"]


def test_an_output_file_that_is_never_there_fails_its_items_naming_the_file(
    cli, backend_env, fake_provider, tmp_path
):
    fake_provider.batches.configure(files_missing=True)
    job_id = _create(cli, _source(tmp_path, 5), backend_env, "--retries", "0")
    status = _ends(cli, job_id, backend_env, "output file 404")
    assert (status["state"], status["failed"]) == ("failed", 5)
    (message,) = {f["message"] for f in _failures(cli, job_id, backend_env).values()}
    named = {"batch_": "file file-", "msgbatch_": "the results of batch msgbatch_"}
    assert f"was given up after 5 tries: {named[batch_prefix(backend_env)]}" in message
    assert "(HTTP 404)" in message
    assert "endpoint or model" not in message
    assert len(fake_provider.batches.file_gets) == 5, "five tries, a poll apart, then no more"


def test_a_cancel_the_provider_ignores_at_the_deadline_is_given_up_and_the_rest_run_live(
    cli, backend_env, fake_provider, tmp_path
):
    fake_provider.configure(batch_hold=True)
    fake_provider.batches.configure(ignore_cancel=True)
    job_id = _create(cli, _source(tmp_path, 6), backend_env, "--batch-deadline", "1s")
    status = _ends(cli, job_id, backend_env, "cancel ignored past the deadline")
    assert (status["state"], status["completed"]) == ("completed", 6)
    assert len(fake_provider.requests) == 6, "the rest ran live"
    (batch,) = status["batches"]
    assert batch["status"] == "abandoned"
    assert fake_provider.batches.batches[batch["id"]]["status"] == "in_progress", (
        "the provider never ended it"
    )
    assert "did not end within 2 s of its cancel" in _events(cli, job_id, backend_env)


def test_a_poisoned_batch_job_does_not_stop_another_job(cli, backend_env, fake_provider, tmp_path):
    """Two jobs; the one polled first (its id sorts first) gets lines that once raised out of the
    pass; the other is still polled and completes, and the poisoned one ends too."""
    one = _create(
        cli,
        _source(tmp_path, 4, name="one.jsonl", marks={i: "JOB-ONE" for i in range(4)}),
        backend_env,
        "--retries",
        "0",
    )
    two = _create(
        cli,
        _source(tmp_path, 4, name="two.jsonl", marks={i: "JOB-TWO" for i in range(4)}),
        backend_env,
        "--retries",
        "0",
    )
    poisoned, healthy = sorted([(one, "JOB-ONE"), (two, "JOB-TWO")])
    fake_provider.batches.configure(line_faults={poisoned[1]: "not_object"})
    worker = cli.spawn_worker("-w", "2", **backend_env)
    try:
        done = wait_for(
            lambda: (st := cli.status(healthy[0], **backend_env))["state"] == "completed" and st,
            timeout=ENDS_WITHIN_S,
            interval=0.3,
            message="the healthy job to complete",
        )
        bad = wait_for(
            lambda: (st := cli.status(poisoned[0], **backend_env))["state"] == "failed" and st,
            timeout=ENDS_WITHIN_S,
            interval=0.3,
            message="the poisoned job to end",
        )
    finally:
        worker.send_signal(signal.SIGINT)
        worker.wait(60)
    assert done["completed"] == 4 and bad["failed"] == 4


def test_pausing_a_batch_job_that_run_wait_runs_cancels_its_batch(
    cli, backend_env, fake_provider, tmp_path
):
    """At the default poll a batch pass comes once a second, and `run --wait` used to see the pause
    and stop before the pass that would have cancelled."""
    backend_env = {**backend_env, "HERMES_BULK_BATCH_POLL_SECONDS": "30"}
    fake_provider.configure(batch_hold=True)
    src = _source(tmp_path, 5)
    job_id = cli.json(
        "create", "Summarise", "--over", str(src), "--batch", "--fresh", "--json", **backend_env
    )["job_id"]
    runner = subprocess.Popen(
        [sys.executable, "-m", "hermes_bulk", "run", job_id, "--wait"],
        env=cli.full_env(**backend_env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    cli.spawned.append(runner)
    try:
        wait_for(
            lambda: any(
                b["id"].startswith(batch_prefix(backend_env))
                for b in cli.status(job_id, **backend_env)["batches"]
            ),
            timeout=60,
            message="the batch submitted and recorded",
        )
        cli("pause", job_id, **backend_env)
        assert runner.wait(60) == 4, "run --wait ends with the job paused"
    finally:
        if runner.poll() is None:
            runner.kill()
    (batch_id,) = fake_provider.batches.created
    assert fake_provider.batches.cancels == [batch_id], "the batch was cancelled at the provider"
    assert fake_provider.batches.batches[batch_id]["status"] in ("cancelling", "cancelled")


def test_a_fault_of_ours_in_one_job_is_recorded_and_the_pass_goes_on(
    env, fake_provider, tmp_path, monkeypatch
):
    """An unexpected exception in one job's batch step (here: its Batch API cannot even be built)
    is logged, recorded once as an event without its text, ends that job within its retries, and
    the job polled after it in the same pass completes."""
    from hermes_bulk.config.settings import load_settings
    from hermes_bulk.fleet import broker
    from hermes_bulk.jobs.service import Jobs
    from hermes_bulk.runtime.worker import WorkerRuntime

    monkeypatch.setenv("HERMES_BULK_BATCH_POLL_SECONDS", "0.05")
    settings = load_settings()
    jobs = Jobs(settings)
    ids = []
    for name in ("a", "b"):
        src = tmp_path / f"{name}.jsonl"
        src.write_text("".join(json.dumps({"n": i, "job": name}) + "\n" for i in range(3)))
        ids.append(
            jobs.create(
                JobRequest(instruction="Do", over=str(src), batch=True, fresh=True, retries=0)
            ).job.job_id
        )
        jobs.run(ids[-1])
    broken, healthy = sorted(ids)
    runtime = WorkerRuntime(jobs.backend, settings, threads=1)
    driver = runtime.batch_driver
    assert driver is not None
    real_api_for = driver.api_for

    def api_for(job):
        if job.job_id == broken:
            raise RuntimeError("secret detail sk-LEAKED-1234")
        return real_api_for(job)

    driver.api_for = api_for
    try:

        def ended():
            driver.tick()
            return all(jobs.status(j).job.finished for j in ids)

        wait_for(ended, timeout=60, interval=0.05, message="both jobs to end")
        good, bad = jobs.status(healthy, events=50), jobs.status(broken, events=50)
    finally:
        for held in [*runtime._batch_apis.values(), *runtime._clients.values()]:
            held.close()
        broker.close_all()
    assert (good.job.completed, bad.job.failed) == (3, 3)
    errors = [e for e in bad.events if e.kind == "batch_error"]
    assert (
        len(errors) == 1
        and "RuntimeError" in errors[0].message
        and "LEAKED" not in errors[0].message
    )
