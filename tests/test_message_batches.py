"""create --batch on Claude: Anthropic's Message Batches under the same batch driver, by real CLI
and worker processes on both backends against the loopback provider's Message Batches API; the
results read as an attacker would write them; the official anthropic SDK against the fake.

What every batch job must do (expiry, pause and resume, the deadline, delete, hostile lines) is
tested on both protocols in test_batch_mode.py and test_batch_trust.py; here is what is Claude's
own: its key header, its error types, a kill between create and record (no metadata to find it
by), each call of the API."""

from __future__ import annotations

import json
import os
import signal

import pytest

from hermes_bulk.providers.message_batches import message_batch, read_result
from hermes_bulk.testing.fake_provider import digest, expected_answer

from .helpers import wait_for
from .test_batch_mode import BACKENDS, FAST, _finish, _rows, _source, backend_settings

CLAUDE = {"HERMES_BULK_PROVIDER": "anthropic"}


@pytest.fixture(params=BACKENDS)
def backend_env(request) -> dict[str, str]:
    """Each backend (these tests are Claude's own; test_batch_mode runs its tests on both)."""
    return {**backend_settings(request, request.param), **FAST}


def _create(cli, src, env, *flags: str) -> str:
    job_id = cli.json(
        "create", "Summarise", "--over", str(src), "--batch", "--fresh", *flags, "--json", **env
    )["job_id"]  # fmt: skip
    cli("run", job_id, **env)
    return job_id


def test_a_claude_batch_job_is_answered_through_message_batches(
    cli,
    backend_env,
    fake_provider,
    tmp_path,
):
    env = {**backend_env, **CLAUDE, "HERMES_BULK_BATCH_MAX_ITEMS": "40"}
    fake_provider.configure(require_key=cli.env["HERMES_BULK_API_KEY"])  # as x-api-key
    n = 100
    job_id = _create(cli, _source(tmp_path, n), env)
    status = _finish(cli, job_id, env)
    assert (status["state"], status["completed"], status["protocol"]) == (
        "completed",
        n,
        "anthropic",
    )
    created = fake_provider.batches.created
    assert len(created) == 3 and all(b.startswith("msgbatch_") for b in created), created
    assert all(b["status"] == "completed" for b in status["batches"])
    assert fake_provider.requests == [], "no live call was made"
    rows = _rows(cli, job_id, env)
    assert [r["result"] for r in rows] == [
        expected_answer(json.dumps({"n": i, "mark": ""})) for i in range(n)
    ]
    lines = fake_provider.batches.lines
    assert {r.protocol for r in lines} == {"anthropic"}
    assert sorted(r.item for r in lines) == sorted(
        digest(json.dumps({"n": i, "mark": ""})) for i in range(n)
    ), "each item asked once"


def test_a_failed_request_is_retried_in_a_later_batch_and_a_refused_one_fails(
    cli,
    backend_env,
    fake_provider,
    tmp_path,
):
    env = {**backend_env, **CLAUDE}
    fake_provider.configure(
        fail_once={'"n": 3,': "529"},  # overloaded: transient, asked again in the next batch
        item_faults={'"n": 5,': "400"},  # invalid request: permanent
    )
    job_id = _create(cli, _source(tmp_path, 10), env)
    status = _finish(cli, job_id, env)
    assert (status["completed"], status["failed"]) == (9, 1)
    rows = _rows(cli, job_id, env)
    assert rows[3]["status"] == "completed" and rows[5]["status"] == "failed"
    assert "HTTP 400" in rows[5]["error"] and "LEAKED" not in rows[5]["error"]
    assert len(fake_provider.batches.created) == 2


def test_a_worker_killed_during_a_message_batch_leaves_it_to_the_next(
    cli,
    backend_env,
    fake_provider,
    tmp_path,
):
    """kill -9 while the provider works on the batch: the next worker takes the batch over
    from its lease, polls it and ingests it; nothing is sent twice."""
    env = {**backend_env, **CLAUDE, "HERMES_BULK_LEASE_SECONDS": "1"}
    fake_provider.configure(batch_hold=True)
    job_id = _create(cli, _source(tmp_path, 30), env)
    first = cli.spawn_worker(**env)
    wait_for(lambda: fake_provider.batches.created, timeout=60, message="the batch to be created")
    wait_for(
        lambda: (
            (st := cli.status(job_id, **env))["batches"]
            and st["batches"][0].get("id", "").startswith("msgbatch_")
        ),
        timeout=60,
        message="the batch to be recorded",
    )
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    cli("run", job_id, **env)  # after a crash a job waits for someone to run it
    fake_provider.configure(batch_hold=False)
    status = _finish(cli, job_id, env)
    assert (status["completed"], len(fake_provider.batches.created)) == (30, 1)
    answered = [r.item for r in fake_provider.batches.lines if r.status == 200]
    assert len(answered) == len(set(answered)) == 30


GOOD_MESSAGE = {
    "type": "message",
    "content": [{"type": "text", "text": "fine"}],
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 3, "output_tokens": 1},
}


@pytest.mark.parametrize(
    ("raw", "custom_id", "problem"),
    [
        (b"not json {", None, "a line that is not JSON"),
        (b"[1, 2]", None, "a line that is not a JSON object"),
        (b'{"result": {"type": "succeeded"}}', None, "a line without a custom_id"),
        (b'{"custom_id": 7, "result": {}}', None, "a line without a custom_id"),
        (b'{"custom_id": "a", "result": "ok"}', "a", "a line whose result is of no known type"),
        (b'{"custom_id": "a", "result": {"type": "won"}}', "a", "of no known type"),
        (b'{"custom_id": "a", "result": {"type": "succeeded", "message": [1]}}', "a",
         "a line whose answer is not an object"),
        (b'{"custom_id": "hb-x-y-1", "result": {"type": "succeeded", "message": {"t": "',
         "hb-x-y-1", "a line that is not JSON"),
    ],
)  # fmt: skip
def test_a_results_line_of_another_shape_is_a_problem_bound_where_it_can_be(
    raw, custom_id, problem
):
    line = read_result(raw)
    assert line.data is None and line.custom_id == custom_id and problem in line.problem


def test_each_result_kind_reads_as_the_openai_line_the_driver_knows():
    ok = read_result(
        json.dumps(
            {"custom_id": "a", "result": {"type": "succeeded", "message": GOOD_MESSAGE}}
        ).encode()
    )
    assert ok.data["response"] == {"status_code": 200, "body": GOOD_MESSAGE}
    for error_type, status in [("overloaded_error", 529), ("invalid_request_error", 400),
                               ("made_up_error", 500), (7, 500)]:  # fmt: skip
        line = {"custom_id": "a", "result": {"type": "errored", "error": {
            "type": "error", "error": {"type": error_type, "message": "sk-LEAKED"}}}}  # fmt: skip
        read = read_result(json.dumps(line).encode())
        assert read.data["response"]["status_code"] == status
        assert "LEAKED" not in json.dumps(read.data), "the provider's words stay out"
    for kind, code in [("canceled", "batch_cancelled"), ("expired", "batch_expired")]:
        read = read_result(json.dumps({"custom_id": "a", "result": {"type": kind}}).encode())
        assert read.data["error"] == {"code": code}
    long = read_result(b'{"custom_id": "hb-a-b-3", "result"', overlong=True, max_bytes=10)
    assert long.custom_id == "hb-a-b-3" and "longer than 10 bytes" in long.problem


def _batch(**change):
    base = {
        "id": "msgbatch_1",
        "type": "message_batch",
        "processing_status": "ended",
        "request_counts": {
            "processing": 0,
            "succeeded": 2,
            "errored": 1,
            "canceled": 0,
            "expired": 0,
        },  # fmt: skip
        "cancel_initiated_at": None,
    }
    return {**base, **change}


def test_a_message_batch_object_is_read_field_by_field():
    done = message_batch(_batch())
    assert (done.status, done.completed, done.failed, done.output_file) == (
        "completed", 2, 1, "msgbatch_1"
    )  # fmt: skip
    counts = {"processing": 0, "succeeded": 1, "errored": 0, "canceled": 2, "expired": 0}
    cancelled = message_batch(
        _batch(request_counts=counts, cancel_initiated_at="2026-12-05T12:00:00Z")
    )
    assert cancelled.status == "cancelled"
    expired = message_batch(_batch(request_counts={**counts, "canceled": 0, "expired": 2}))
    assert expired.status == "expired"
    running = message_batch(_batch(processing_status="in_progress"))
    assert (running.status, running.output_file) == ("in_progress", None)
    canceling = message_batch(_batch(processing_status="canceling"))
    assert (canceling.status, canceling.output_file) == ("cancelling", None), "no results yet"
    every = {"processing": 0, "succeeded": 1, "errored": 2, "canceled": 4, "expired": 8}
    mixed = message_batch(_batch(request_counts=every))
    assert (mixed.completed, mixed.failed) == (1, 14), "errored, canceled and expired all failed"
    assert mixed.status == "expired", "canceled without a cancel asked is not our cancel"
    from hermes_bulk.providers.batch_api import BatchAnswerInvalid

    for bad in [
        _batch(processing_status="done"),
        _batch(id="../files"),
        _batch(type="batch"),
        _batch(type="zebra"),
        _batch(request_counts={"succeeded": -1}),
        _batch(request_counts=None),
        [1],
    ]:
        with pytest.raises(BatchAnswerInvalid):
            message_batch(bad)
    with pytest.raises(BatchAnswerInvalid):
        message_batch(_batch(), expect_id="msgbatch_2")


def test_the_official_sdk_runs_a_message_batch_against_the_fake(fake_provider):
    import anthropic

    sdk = anthropic.Anthropic(
        base_url=fake_provider.base_url.removesuffix("/v1"), api_key="sk-ant-x", max_retries=0
    )
    try:
        message = {"role": "user", "content": "Item a\\n----- BEGIN ITEM x\\nrow"}
        params = {"model": "claude-x", "max_tokens": 64, "messages": [message]}
        created = sdk.messages.batches.create(
            requests=[
                {"custom_id": "one", "params": params},
                {"custom_id": "two", "params": params},
            ]
        )
        assert created.processing_status in ("in_progress", "ended")
        ended = wait_for(
            lambda: (
                (b := sdk.messages.batches.retrieve(created.id)).processing_status == "ended" and b
            ),
            timeout=30,
            message="the batch to end",
        )
        assert ended.request_counts.succeeded == 2 and ended.results_url
        results = {r.custom_id: r.result for r in sdk.messages.batches.results(created.id)}
        assert set(results) == {"one", "two"}
        assert all(r.type == "succeeded" and r.message.content[0].text for r in results.values())
        listed = sdk.messages.batches.list(limit=10)
        assert [b.id for b in listed.data] == [created.id]
    finally:
        sdk.close()


def test_a_worker_killed_between_creating_a_message_batch_and_recording_it(
    cli,
    backend_env,
    fake_provider,
    tmp_path,
):
    """kill -9 after the provider created the batch and before the worker recorded its id.
    Message Batches carry no metadata: the next worker finds it among the batches created
    since ours was opened, by its request count, and adopts it instead of sending it again."""
    env = {**backend_env, **CLAUDE, "HERMES_BULK_LEASE_SECONDS": "1"}
    fake_provider.configure(batch_create_delay_s=30)  # the answer to the create never comes
    job_id = _create(cli, _source(tmp_path, 25), env)
    first = cli.spawn_worker(**env)
    wait_for(lambda: fake_provider.batches.created, timeout=60, message="the batch to be created")
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    cli("run", job_id, **env)  # after a crash a job waits for someone to run it
    fake_provider.configure(batch_create_delay_s=0)
    status = _finish(cli, job_id, env)
    assert status["completed"] == 25
    assert len(fake_provider.batches.created) == 1, "adopted, not sent again"
    assert status["batches"][0]["id"] == fake_provider.batches.created[0]
    answered = [r.item for r in fake_provider.batches.lines if r.status == 200]
    assert len(answered) == len(set(answered)) == 25


# The API object against the loopback provider, without workers: what each call sends and reads.


@pytest.fixture
def api(settings, fake_provider):
    from hermes_bulk.fleet.broker import open_backend
    from hermes_bulk.providers.message_batches import MessageBatchApi

    client = MessageBatchApi(
        base_url=fake_provider.base_url,
        api_key="sk-ant-api",
        provider_key="p:test",
        limits=open_backend(settings).limits,
        timeout_s=10,
    )
    yield client
    client.close()


def _requests_file(api, tmp_path, n: int, name: str = "b1.jsonl"):
    from hermes_bulk.jobs.prompt import build_messages
    from hermes_bulk.providers.anthropic import messages_body

    path = tmp_path / "batches" / name  # as the driver writes them: in a job's batches folder
    path.parent.mkdir(exist_ok=True)
    with path.open("w") as out:
        for i in range(n):
            messages = build_messages("Summarise", f"line:{i}", f"row {i}", "b2:" + "0" * 32)
            body = messages_body("claude-x", messages, max_tokens=32)
            out.write(json.dumps(api.request_line(f"hb-j-b1-{i}", body)) + "\n")
    return path


def _record(items: int, created_at: float):
    from hermes_bulk.store.protocol import BatchRecord

    return BatchRecord(batch_id="b1", job_id="j", status="preparing", items=items,
                       created_at=created_at)  # fmt: skip


def test_the_requests_are_kept_until_the_create_sends_them_inline(api, fake_provider, tmp_path):
    from hermes_bulk.providers.batch_api import BatchAnswerInvalid

    # x-api-key on the Batches API too; held, so the create's answer sees it in progress
    fake_provider.configure(require_key="sk-ant-api", batch_hold=True)
    path = _requests_file(api, tmp_path, 3)
    token = api.upload(path)
    kept = tmp_path / "batches" / "b1.requests.jsonl"
    assert token == "local:" + str(kept) and kept.is_file() and not path.exists()
    created = api.create(token, window="24h", metadata={})
    assert created.status == "in_progress" and created.output_file is None
    assert not kept.exists(), "sent: the file goes"
    (batch_id,) = fake_provider.batches.created
    assert created.id == batch_id and fake_provider.batches.uploaded
    assert list(fake_provider.batches.uploaded.values()) == [3]
    for lost in (token, "file-abc123"):  # another machine's batch, another provider's file
        with pytest.raises(BatchAnswerInvalid, match="not on this machine"):
            api.create(lost, window="24h", metadata={})
    assert len(fake_provider.batches.created) == 1
    fake_provider.configure(batch_hold=False)
    ended = wait_for(
        lambda: (b := api.get(batch_id)).status == "completed" and b, message="the batch to end"
    )
    assert (ended.completed, ended.failed, ended.output_file) == (3, 0, batch_id)
    lines = list(api.lines(ended.output_file))
    assert [line.custom_id for line in lines] == [f"hb-j-b1-{i}" for i in range(3)]
    texts = [api.parse(line.data["response"]["body"], "claude-x").text for line in lines]
    assert texts == [expected_answer(f"row {i}") for i in range(3)]


def test_the_create_reads_and_removes_only_a_requests_file_it_kept(api, fake_provider, tmp_path):
    """The file's name comes from the store: whatever else a name there points at (a link to
    another file, a FIFO, a file of another name or folder) is neither read, sent nor removed."""
    from hermes_bulk.providers.batch_api import BatchAnswerInvalid

    folder = tmp_path / "batches"
    folder.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("sk-LEAKED-1234\n")
    wrong = _requests_file(api, tmp_path, 2, "x.jsonl")  # a requests file of another name
    elsewhere = tmp_path / "b9.requests.jsonl"
    elsewhere.write_bytes(wrong.read_bytes())  # the right name outside a batches folder
    link = folder / "b7.requests.jsonl"
    link.symlink_to(secret)
    fifo = folder / "b8.requests.jsonl"
    os.mkfifo(fifo)
    for path in (wrong, elsewhere, link, fifo, folder / "b6.requests.jsonl", folder):
        with pytest.raises(BatchAnswerInvalid, match="not on this machine"):
            api.create(f"local:{path}", window="24h", metadata={})
    assert fake_provider.batches.created == [], "nothing sent"
    assert wrong.exists() and elsewhere.exists() and link.is_symlink() and fifo.exists()
    assert secret.read_text() == "sk-LEAKED-1234\n"
    kept = api.upload(_requests_file(api, tmp_path, 2))
    assert api.create(kept, window="24h", metadata={}).id == fake_provider.batches.created[0]


def test_a_cancelled_message_batch_reads_as_cancelled(api, fake_provider, tmp_path):
    fake_provider.configure(batch_hold=True)
    created = api.create(api.upload(_requests_file(api, tmp_path, 2)), window="24h", metadata={})
    api.cancel(created.id)
    ended = wait_for(
        lambda: (b := api.get(created.id)).status == "cancelled" and b, message="the cancel"
    )
    assert (ended.completed, ended.failed) == (0, 2)
    kinds = [line.data["error"] for line in api.lines(created.id)]
    assert kinds == [{"code": "batch_cancelled"}] * 2


def test_an_unrecorded_batch_is_found_only_when_one_alone_fits(api, fake_provider, tmp_path):
    import time

    opened = time.time()
    created = api.create(api.upload(_requests_file(api, tmp_path, 3)), window="24h", metadata={})
    assert api.find(_record(3, opened)).id == created.id
    assert api.find(_record(4, opened)) is None, "another count is another batch"
    assert api.find(_record(2, opened)) is None, "nor is a batch of more requests"
    assert api.find(_record(3, opened + 3600)) is None, "created before ours was opened"
    assert api.find(_record(3, opened + 200)).id == created.id, "within the clocks' skew"
    api.create(api.upload(_requests_file(api, tmp_path, 3, "b2.jsonl")), window="24h", metadata={})
    assert api.find(_record(3, opened)) is None, "two fit: neither is adopted"


@pytest.mark.parametrize(
    ("error_type", "status"),
    [("invalid_request_error", 400), ("authentication_error", 401), ("billing_error", 402),
     ("permission_error", 403), ("not_found_error", 404), ("request_too_large", 413),
     ("rate_limit_error", 429), ("api_error", 500), ("timeout_error", 504),
     ("overloaded_error", 529)],
)  # fmt: skip
def test_each_error_type_is_the_status_the_live_api_answers_with(error_type, status):
    line = {"custom_id": "a", "result": {"type": "errored",
            "error": {"type": "error", "error": {"type": error_type}}}}  # fmt: skip
    assert read_result(json.dumps(line).encode()).data["response"]["status_code"] == status


def test_the_search_pages_past_newer_batches_and_stops_at_older_ones(
    api, fake_provider, tmp_path, monkeypatch
):
    import time

    from hermes_bulk.providers import message_batches

    monkeypatch.setattr(message_batches, "FIND_PAGE_SIZE", 1)  # one batch a page
    opened = time.time()
    ours = api.create(api.upload(_requests_file(api, tmp_path, 3)), window="24h", metadata={})
    for n, name in ((4, "b2.jsonl"), (5, "b3.jsonl")):  # newer, listed first
        api.create(api.upload(_requests_file(api, tmp_path, n, name)), window="24h", metadata={})
    assert api.find(_record(3, opened)).id == ours.id, "found on the third page"
    fake_provider.batches.configure(poll_fields={"created_at": "2020-01-01T00:00:00Z"})
    assert api.find(_record(5, opened)) is None, "a batch created before ours is never it"


def test_a_batch_already_recorded_is_never_adopted_as_another(api, tmp_path):
    import time

    opened = time.time()
    first = api.create(api.upload(_requests_file(api, tmp_path, 3)), window="24h", metadata={})
    second = api.create(
        api.upload(_requests_file(api, tmp_path, 3, "b2.jsonl")), window="24h", metadata={}
    )
    assert api.find(_record(3, opened), recorded=frozenset({first.id})).id == second.id
