"""The item pipeline's retry and 429 policy (pipeline.ItemProcessor), in-process, on a clock
the test moves.

Real parts: a SQLite store and its shared limiter, the HTTP client, the loopback provider
answering a script. The store's clock and the processor's sleep are one test clock: a sleep
moves it, so a 429's shared wait and the retry backoff are observed exactly (the seconds asked
for) and cost no time. What each test checks is what the provider was really sent (its request
log) and what the store recorded.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import time

import pytest

from hermes_bulk.errors import ClientUnavailable, InvalidAnswer, TransientModelError
from hermes_bulk.fleet import broker
from hermes_bulk.providers.client import Completion, HttpModelClient
from hermes_bulk.providers.pacing import MAX_RATE_LIMIT_WAITS
from hermes_bulk.runtime.breaker import EndpointBreaker
from hermes_bulk.runtime.pipeline import (
    CLIENT_UNAVAILABLE_RETRY_S,
    TOKENS_IN_FLIGHT_RETRY_S,
    ItemProcessor,
)
from hermes_bulk.runtime.saving import output_path
from hermes_bulk.runtime.sending import structured
from hermes_bulk.store.protocol import (
    COMPLETED,
    FAILED,
    NOT_STARTED,
    PAUSED,
    PENDING,
    RUNNING,
    ItemError,
    JobSpec,
    NewItem,
    Usage,
)
from hermes_bulk.testing.fake_provider import FakeProvider


class Clock:
    """The store's clock and the processor's sleep: a sleep moves time on at once."""

    def __init__(self) -> None:
        self.now = time.time()
        self.sleeps: list[float] = []
        self.on_first_sleep = None  # called once, at the first sleep (a lease lost meanwhile)

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 3))
        self.now += seconds
        if self.on_first_sleep is not None:
            hook, self.on_first_sleep = self.on_first_sleep, None
            hook()


@pytest.fixture(scope="module")
def provider():
    fake = FakeProvider().start()
    yield fake
    fake.stop()


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def backend(tmp_path, clock):
    b = broker.build_backend(f"sqlite:///{tmp_path / 'bulk.db'}")
    b.store.db.clock = clock.time
    assert b.limits.db is b.store.db, "the limiter reads the same clock"
    yield b
    b.close()


@pytest.fixture
def client(provider):
    provider.reset_records()
    provider.configure(script=[], item_faults={})
    c = HttpModelClient(
        base_url=provider.base_url, api_key="k-test", model="fake-model", timeout_s=10
    )
    yield c
    c.close()


_ids = iter(range(10**6))


def make_job(
    store, n: int = 1, *, retries: int = 2, schema: str | None = None, contents=None, **spec_kw
) -> str:
    job_id = f"retry{next(_ids):06d}"
    store.begin_job(
        JobSpec(
            job_id=job_id,
            instruction="Echo",
            source="/in",
            source_kind="jsonl",
            concurrency=10,
            retries=retries,
            provider_key="p:x",
            schema=schema,
            **spec_kw,
        )
    )
    store.add_items(
        job_id,
        [
            NewItem(
                i,
                f"item-{i}",
                (contents or [f"item {i}"] * n)[i],
                f"b2:{job_id}{i}",
                "",
                -1,
                "",
                10,
            )
            for i in range(n)
        ],
    )
    store.finish_job(job_id)
    store.set_state(job_id, RUNNING, from_states=[NOT_STARTED])
    return job_id


def processor(backend, client, clock, tmp_path, **kw) -> ItemProcessor:
    return ItemProcessor(
        store=backend.store,
        limits=backend.limits,
        worker_id="w1",
        client_for=kw.pop("client_for", lambda job: client),
        jobs_dir=tmp_path / "jobs",
        lease_s=60,
        concurrency_cap=10,
        sleep=clock.sleep,
        **kw,
    )


def statuses(provider) -> list[int]:
    return [r.status for r in provider.requests]


def item(store, job_id, index=0):
    return store.get_item(job_id, index).item


# Transient errors: retried with backoff, at most the job's retries ------------------------------


def test_transient_errors_are_retried_with_growing_waits_and_then_answered(
    backend, client, clock, tmp_path, provider
):
    job = make_job(backend.store, retries=3)
    provider.configure(script=["500", "503", "ok"])
    p = processor(backend, client, clock, tmp_path)
    outcome = p.handle(job, 0)
    assert (outcome.claimed, outcome.index, outcome.reschedule_in, outcome.refused) == (
        True,
        0,
        None,
        None,
    )
    assert statuses(provider) == [500, 503, 200]
    assert clock.sleeps == [2.0, 4.0]
    done = item(backend.store, job)
    assert (done.status, done.attempts) == (COMPLETED, 2)
    assert done.result.startswith("ANSWER[")
    assert output_path(tmp_path / "jobs", job, 0).read_text() == done.result + "\n"
    counted = p.counters.snapshot()
    assert (counted["requests"], counted["items_completed"], counted["items_failed"]) == (3, 1, 0)
    assert (
        (counted["tokens_in"], counted["tokens_out"]) == (done.tokens_in, done.tokens_out) != (0, 0)
    )


def test_an_item_fails_after_its_retries_with_the_last_error_in_our_words(
    backend, client, clock, tmp_path, provider
):
    job = make_job(backend.store, retries=2)
    provider.configure(script=["500", "500", "502", "ok"])
    processor(backend, client, clock, tmp_path).handle(job, 0)
    assert statuses(provider) == [500, 500, 502], "one try and two retries, no more"
    assert clock.sleeps == [2.0, 4.0]
    failed = item(backend.store, job)
    assert (failed.status, failed.error_type, failed.http_status) == (FAILED, "TransientError", 502)
    assert failed.error_message == "the provider answered HTTP 502"
    assert failed.attempts == 3


def test_the_backoff_between_retries_stops_growing_at_30_seconds(
    backend, client, clock, tmp_path, provider
):
    job = make_job(backend.store, retries=6)
    provider.configure(script=["500"] * 6 + ["ok"])
    processor(backend, client, clock, tmp_path).handle(job, 0)
    assert clock.sleeps == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert item(backend.store, job).status == COMPLETED


def _taken_by_another_worker(store, clock, job_id):
    """The lease runs out while the worker waits, and another worker claims the item."""

    def take() -> None:
        clock.now += 61  # past the 60 s lease
        assert store.release_expired_leases() == {job_id: 1}
        assert store.claim_item(job_id, 0, "w2", lease_s=60, max_running=10).index == 0

    return take


@pytest.mark.parametrize(
    "script", [["500", "500", "ok"], ["429:1", "429:1", "ok"]], ids=["transient", "429"]
)
def test_a_worker_whose_lease_was_lost_while_waiting_stops_and_leaves_the_item_alone(
    script, backend, client, clock, tmp_path, provider
):
    job = make_job(backend.store, retries=3)
    provider.configure(script=script)
    clock.on_first_sleep = _taken_by_another_worker(backend.store, clock, job)
    p = processor(backend, client, clock, tmp_path)
    assert p.handle(job, 0).claimed
    assert len(provider.requests) == 2, (
        "the attempt after the loss is the last: nothing more is sent"
    )
    now = item(backend.store, job)
    assert now.status == RUNNING and now.result is None, "the other worker's item, untouched"
    assert p.counters.snapshot()["items_failed"] == 0 and p.held_items() == []


def test_an_answer_that_cannot_be_written_gives_back_the_item_its_completion_claimed(
    backend, client, clock, tmp_path
):
    job = make_job(backend.store, n=2)
    jobs_dir = tmp_path / "not-a-folder"
    jobs_dir.write_text("a file where the outputs folder would be")
    p = ItemProcessor(
        store=backend.store,
        limits=backend.limits,
        worker_id="w1",
        client_for=lambda j: client,
        jobs_dir=jobs_dir,
        lease_s=60,
        concurrency_cap=10,
        sleep=clock.sleep,
    )
    outcome = p.handle(job, 0, chain=lambda: True)
    assert outcome.next is None
    assert item(backend.store, job, 0).status == COMPLETED, "the answer is kept in the store"
    assert item(backend.store, job, 1).status == PENDING, "the claimed next item went back"
    assert p.held_items() == []


def test_attempts_of_an_earlier_claim_count_against_the_retries(
    backend, client, clock, tmp_path, provider
):
    job = make_job(backend.store, retries=3)
    store = backend.store
    for _ in range(2):  # two failed attempts under another worker, whose lease then ran out
        assert store.claim_item(job, 0, "w0", lease_s=60, max_running=10).index == 0
        assert (
            store.record_attempt(
                job, 0, "w0", ItemError("TransientError", "HTTP 500", 500), rate_limited=False
            )
            > 0
        )
        assert store.release_item(job, 0, "w0")
    provider.configure(script=["500", "500", "ok"])
    processor(backend, client, clock, tmp_path).handle(job, 0)
    assert statuses(provider) == [500, 500], "2 earlier + 2 here = the first try and 3 retries"
    assert item(backend.store, job).status == FAILED


def test_retries_already_spent_count_against_the_job(backend, client, clock, tmp_path, provider):
    job = make_job(backend.store, retries=0)
    provider.configure(script=["500", "ok"])
    p = processor(backend, client, clock, tmp_path)
    p.handle(job, 0)
    assert statuses(provider) == [500] and clock.sleeps == []
    assert item(backend.store, job).status == FAILED
    assert p.counters.snapshot()["items_failed"] == 1


def test_a_permanent_error_fails_at_once(backend, client, clock, tmp_path, provider):
    job = make_job(backend.store, retries=5)
    provider.configure(script=["400", "ok"])
    processor(backend, client, clock, tmp_path).handle(job, 0)
    assert statuses(provider) == [400] and clock.sleeps == []
    failed = item(backend.store, job)
    assert (failed.status, failed.error_type, failed.http_status) == (FAILED, "PermanentError", 400)
    assert backend.store.get_job(job).state == RUNNING, "one item's own error pauses nothing"


# 429: a shared wait, not a retry ----------------------------------------------------------------


def test_a_429_waits_its_retry_after_for_every_worker_and_uses_no_retry(
    backend, client, clock, tmp_path, provider
):
    job = make_job(backend.store, retries=1)
    provider.configure(script=["429:3", "429:4", "500", "ok"])
    start = clock.now
    p = processor(backend, client, clock, tmp_path)
    p.handle(job, 0)
    assert statuses(provider) == [429, 429, 500, 200]
    # The two shared waits, then the retry's backoff (and the pacing learned from the 429s).
    assert clock.sleeps[:3] == [3.0, 4.0, 2.0]
    done = item(backend.store, job)
    assert done.status == COMPLETED and done.attempts == 1, "the 429s used none of the one retry"
    events = [e for e in backend.store.list_events(job, item=0) if "429" in e.message]
    assert len(events) == 2 and {(e.error_type, e.http_status) for e in events} == {
        ("RateLimitError", 429)
    }
    until = datetime.datetime.fromtimestamp(start + 3).astimezone().strftime("%H:%M:%S %Z")
    assert f"all workers wait until {until}" in events[0].message, "the time and its zone"
    assert backend.limits.pause_state(client.provider_key) is None, "the wait is over"


def test_a_429_without_retry_after_waits_the_base_then_doubles(
    backend, client, clock, tmp_path, provider
):
    """The process's first request to the key went alone: its 429 is a plain wait of the base,
    teaching nothing; from the next 429 on the waits double."""
    job = make_job(backend.store, retries=1)
    provider.configure(script=["429", "429", "429", "ok"])
    processor(backend, client, clock, tmp_path).handle(job, 0)
    assert clock.sleeps == [5.0, 5.0, 10.0]
    assert item(backend.store, job).status == COMPLETED


def test_a_success_after_429s_starts_the_next_wait_from_the_base(
    backend, client, clock, tmp_path, provider
):
    job = make_job(backend.store, n=2, retries=1)
    provider.configure(script=["429", "ok", "429", "ok"])
    p = processor(backend, client, clock, tmp_path)
    p.handle(job, 0)
    p.handle(job, 1)
    assert clock.sleeps[0] == 5.0 and 5.0 in clock.sleeps[1:], clock.sleeps


def test_a_long_retry_after_gives_the_item_back_for_later(
    backend, client, clock, tmp_path, provider
):
    job = make_job(backend.store, retries=2)
    provider.configure(script=["429:40", "ok"])
    outcome = processor(backend, client, clock, tmp_path).handle(job, 0)
    assert statuses(provider) == [429]
    assert outcome.claimed and outcome.index == 0
    assert outcome.reschedule_in == pytest.approx(40, abs=0.01)
    back = item(backend.store, job)
    assert (back.status, back.attempts) == (PENDING, 0)
    assert clock.sleeps == []


def test_a_provider_retry_after_is_honoured_up_to_an_hour(
    backend, client, clock, tmp_path, provider
):
    job = make_job(backend.store, retries=2)
    provider.configure(script=["429:90000"])
    outcome = processor(backend, client, clock, tmp_path).handle(job, 0)
    assert outcome.reschedule_in == pytest.approx(3600, abs=0.01)


def test_a_job_without_retries_fails_its_item_at_the_first_429(
    backend, client, clock, tmp_path, provider
):
    job = make_job(backend.store, retries=0)
    provider.configure(script=["429:1", "ok"])
    processor(backend, client, clock, tmp_path).handle(job, 0)
    failed = item(backend.store, job)
    assert (failed.status, failed.error_type, failed.http_status) == (FAILED, "RateLimitError", 429)
    assert failed.error_message == (
        "rate limited (HTTP 429) 1 time in a row; run retry later or lower --concurrency"
    )


def test_an_item_fails_after_too_many_429s_in_a_row(backend, client, clock, tmp_path, provider):
    job = make_job(backend.store, retries=1)
    provider.configure(script=["429:1"] * (MAX_RATE_LIMIT_WAITS + 2))
    p = processor(backend, client, clock, tmp_path)
    p.handle(job, 0)
    assert statuses(provider) == [429] * MAX_RATE_LIMIT_WAITS
    assert p.counters.snapshot()["rate_limit_waits"] == MAX_RATE_LIMIT_WAITS
    failed = item(backend.store, job)
    assert failed.status == FAILED
    assert f"{MAX_RATE_LIMIT_WAITS} times in a row" in failed.error_message


def test_an_answer_without_reported_usage_counts_no_tokens(
    backend, client, clock, tmp_path, provider
):
    job = make_job(backend.store, n=2)
    p = processor(backend, client, clock, tmp_path)
    try:
        provider.configure(usage={"prompt_tokens": 7})
        p.handle(job, 0)
        assert (p.counters.snapshot()["tokens_in"], p.counters.snapshot()["tokens_out"]) == (7, 0)
        provider.configure(usage={"completion_tokens": 5})
        p.handle(job, 1)
        assert (p.counters.snapshot()["tokens_in"], p.counters.snapshot()["tokens_out"]) == (7, 5)
    finally:
        provider.configure(usage=None)
    assert [item(backend.store, job, i).status for i in (0, 1)] == [COMPLETED, COMPLETED]


@pytest.mark.parametrize("held_s", [30.0, 0.5])
def test_a_request_the_budget_holds_gives_the_item_back_until_it_may_be_sent(
    held_s, backend, client, clock, tmp_path, provider
):
    class Held:
        """The budget's gate (limits.RequestGate) while the window is spent."""

        def admit(self, job) -> float:
            return held_s

        def held_until(self, job) -> float | None:
            return clock.now + held_s

    job = make_job(backend.store)
    outcome = processor(backend, client, clock, tmp_path, request_gate=Held()).handle(job, 0)
    assert (outcome.claimed, outcome.reschedule_in) == (True, held_s)
    assert provider.requests == [] and item(backend.store, job).status == PENDING


# What a trigger that cannot be served does --------------------------------------------------------


def test_a_claim_refused_for_tokens_in_flight_comes_back_in_a_second(
    backend, client, clock, tmp_path
):
    store = backend.store
    job = make_job(store, n=2)
    store.set_state(job, PAUSED, from_states=[RUNNING])
    store.set_state(job, RUNNING, from_states=[PAUSED], max_tokens=15)
    assert store.claim_item(job, 0, "other", lease_s=60, max_running=10).index == 0
    p = processor(backend, client, clock, tmp_path)
    outcome = p.handle(job, 1)
    assert (outcome.claimed, outcome.refused) == (False, "tokens_in_flight")
    assert outcome.reschedule_in == TOKENS_IN_FLIGHT_RETRY_S == 1.0
    store.set_state(job, PAUSED, from_states=[RUNNING])
    outcome = p.handle(job, 1)
    assert (outcome.claimed, outcome.refused, outcome.reschedule_in) == (False, "not_running", None)


def test_a_worker_that_cannot_serve_a_job_gives_the_item_back_and_says_so_once(
    backend, clock, tmp_path, provider
):
    provider.reset_records()
    job = make_job(backend.store, n=2)

    def cannot(job_record):
        raise ClientUnavailable("this worker has no key for that endpoint")

    p = processor(backend, None, clock, tmp_path, client_for=cannot)
    for index in (0, 1):
        outcome = p.handle(job, index)
        assert (outcome.claimed, outcome.index) == (True, index)
        assert outcome.reschedule_in == CLIENT_UNAVAILABLE_RETRY_S == 5.0
    assert [item(backend.store, job, i).status for i in (0, 1)] == [PENDING, PENDING]
    told = [e for e in backend.store.list_events(job) if e.kind == "worker_cannot_serve"]
    assert len(told) == 1 and "worker w1 leaves this job to other workers" in told[0].message
    assert provider.requests == [] and p.held_items() == []


def test_an_unexpected_error_fails_the_item_in_our_words(backend, clock, tmp_path):
    job = make_job(backend.store)

    class Broken:
        provider_key = "p:broken"

        def complete(self, *a, **k):
            raise KeyError("surprise")

    p = processor(backend, Broken(), clock, tmp_path)
    assert p.handle(job, 0).claimed
    failed = item(backend.store, job)
    assert p.counters.snapshot()["items_failed"] == 0, "the worker's own failure is not an item's"
    assert (failed.status, failed.error_type) == (FAILED, "InternalError")
    assert failed.error_message == "unexpected error in the worker; see the worker log"
    assert p.held_items() == []


def test_a_refused_key_pauses_the_job_and_gives_the_item_back_uncharged(
    backend, client, clock, tmp_path, provider
):
    job = make_job(backend.store, n=2, retries=3)
    provider.configure(script=["401", "ok"])
    p = processor(backend, client, clock, tmp_path)
    assert p.handle(job, 0).claimed
    assert statuses(provider) == [401]
    record = backend.store.get_job(job)
    assert record.state == PAUSED and "HTTP 401" in record.pause_reason
    back = item(backend.store, job)
    assert (back.status, back.attempts) == (PENDING, 0)


def test_a_transient_status_resets_the_breaker_and_counts_as_an_attempt(
    backend, client, clock, tmp_path, provider
):
    job = make_job(backend.store, retries=1)
    provider.configure(script=["503", "ok"])
    breaker = EndpointBreaker(failures=1)
    p = processor(backend, client, clock, tmp_path, breaker=breaker)
    p.handle(job, 0)
    assert item(backend.store, job).status == COMPLETED
    assert breaker.attempt(client.provider_key).answers == 2, (
        "both HTTP answers were told to the breaker"
    )


def test_an_endpoint_nobody_reaches_retries_without_using_retries_until_the_breaker_pauses(
    backend, clock, tmp_path
):
    job = make_job(backend.store, retries=1)
    with socket.socket() as s:  # a port nothing listens on: every connection is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = HttpModelClient(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="k", model="m", timeout_s=2
    )
    ticks = iter(range(100))
    breaker = EndpointBreaker(failures=3, clock=lambda: float(next(ticks)))
    try:
        p = processor(backend, down, clock, tmp_path, breaker=breaker)
        assert p.handle(job, 0).claimed
    finally:
        down.close()
    assert clock.sleeps == [1.0, 1.0], "tried again every second, not on the backoff of retries"
    record = backend.store.get_job(job)
    assert record.state == PAUSED
    back = item(backend.store, job)
    assert (back.status, back.attempts) == (PENDING, 0)
    kept = [
        e
        for e in backend.store.list_events(job, item=0)
        if "not counted against retries" in e.message
    ]
    assert len(kept) == 2


# Chains and --schema ----------------------------------------------------------------------------


def test_a_chain_claims_the_next_item_in_the_completion(backend, client, clock, tmp_path):
    job = make_job(backend.store, n=3)
    p = processor(backend, client, clock, tmp_path)
    outcome = p.handle(job, 0, chain=lambda: True)
    assert outcome.next is not None and outcome.next.index == 1
    assert p.held_items() == [(job, 1)]
    outcome = p.handle(job, 1, claim=outcome.next, chain=lambda: False)
    assert outcome.next is None and p.held_items() == []
    assert [item(backend.store, job, i).status for i in range(3)] == [COMPLETED, COMPLETED, PENDING]


def test_a_chain_goes_on_from_the_item_after_the_one_it_completed(backend, client, clock, tmp_path):
    job = make_job(backend.store, n=6)
    outcome = processor(backend, client, clock, tmp_path).handle(job, 3, chain=lambda: True)
    assert outcome.index == 3 and outcome.next.index == 4


def test_an_item_whose_source_is_no_longer_a_regular_file_or_has_changed_fails_with_that_reason(
    backend, client, clock, tmp_path, provider
):
    folder = tmp_path / "in"
    folder.mkdir()
    os.mkfifo(folder / "a.txt")
    (folder / "b.txt").write_text("edited since create")
    store = backend.store
    job_id = f"src{next(_ids):06d}"
    store.begin_job(
        JobSpec(
            job_id=job_id,
            instruction="Echo",
            source=str(folder),
            source_kind="directory",
            concurrency=10,
            retries=2,
            provider_key="p:x",
        )
    )
    store.add_items(
        job_id,
        [
            NewItem(i, name, "as created", "b2:as-created", name, -1, "1:1", 10)
            for i, name in enumerate(["a.txt", "b.txt"])
        ],
    )
    store.finish_job(job_id)
    store.set_state(job_id, RUNNING, from_states=[NOT_STARTED])
    p = processor(backend, client, clock, tmp_path)
    p.handle(job_id, 0)
    p.handle(job_id, 1)
    fifo, edited = item(store, job_id, 0), item(store, job_id, 1)
    assert (fifo.status, fifo.error_type) == (FAILED, "SourceUnusable")
    assert "only regular files are read" in fifo.error_message
    assert (edited.status, edited.error_type) == (FAILED, "SourceChanged")
    assert edited.error_message == "source content changed since the job was created"
    assert provider.requests == [], "nothing is sent for either"


def test_a_schema_answer_is_kept_as_canonical_json(backend, client, clock, tmp_path):
    schema = json.dumps(
        {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}
    )
    job = make_job(backend.store, schema=schema)
    processor(backend, client, clock, tmp_path).handle(job, 0)
    done = item(backend.store, job)
    assert done.status == COMPLETED and set(json.loads(done.result)) == {"title"}
    assert done.result == json.dumps(json.loads(done.result), ensure_ascii=False)


# Answers the provider billed and that are not kept -----------------------------------------------

#: $1 in, $2 out per million tokens (JobSpec.price)
PRICE = {"input": 1.0, "output": 2.0, "cached_input": 1.0, "source": "test"}
LABEL = json.dumps(
    {"type": "object", "properties": {"label": {"enum": ["good", "bad"]}}, "required": ["label"]}
)


def test_an_invalid_answer_is_charged_and_ends_its_claim_and_the_next_claim_asks_again(
    backend, client, clock, tmp_path, provider
):
    """Off the schema: billed, so charged in the step that gives the item back to pending (not
    retried in the claim, whose reservation covered one attempt); the next claim asks again,
    and the item's figures are both attempts'."""
    store = backend.store
    job = make_job(store, retries=2, schema=LABEL, price=PRICE)
    provider.configure(script=["off_schema"])
    p = processor(backend, client, clock, tmp_path)
    p.handle(job, 0)
    first = provider.billed()
    assert len(provider.requests) == 1 and clock.sleeps == [], "not retried in the claim"
    back = item(store, job)
    assert (back.status, back.attempts, back.error_type) == (PENDING, 1, None)
    assert (back.tokens_in, back.tokens_out) == first and first[1] > 0
    job_now = store.get_job(job)
    assert job_now.tokens_unkept == sum(first) == job_now.tokens_charged
    assert job_now.cost_unkept == job_now.cost_nusd == first[0] * 1000 + first[1] * 2000
    assert (job_now.running, job_now.tokens_reserved, job_now.tokens_in) == (0, 0, 0)

    p.handle(job, 0)
    both = provider.billed()
    done = item(store, job)
    assert done.status == COMPLETED and len(provider.requests) == 2
    assert (done.tokens_in, done.tokens_out) == both, "the item's row: both attempts"
    assert done.cost_nusd == both[0] * 1000 + both[1] * 2000
    finished = store.get_job(job)
    assert finished.tokens_charged == sum(both) and finished.tokens_unkept == sum(first)
    assert finished.cost_nusd == done.cost_nusd and finished.cost_unkept == job_now.cost_unkept


def test_a_billed_invalid_answer_past_the_retries_fails_the_item_charged(
    backend, client, clock, tmp_path, provider
):
    job = make_job(backend.store, retries=0, schema=LABEL, price=PRICE)
    provider.configure(script=["off_schema"])
    processor(backend, client, clock, tmp_path).handle(job, 0)
    failed = item(backend.store, job)
    assert (failed.status, failed.error_type, failed.attempts) == (FAILED, "InvalidAnswer", 1)
    assert (failed.tokens_in, failed.tokens_out) == provider.billed()
    assert backend.store.get_job(job).tokens_unkept == sum(provider.billed()) > 0


def test_a_truncated_answer_is_charged_as_billed_and_fails_at_once(
    backend, client, clock, tmp_path, provider
):
    job = make_job(backend.store, retries=2, price=PRICE, max_output_tokens=64)
    provider.configure(script=["length"])
    processor(backend, client, clock, tmp_path).handle(job, 0)
    billed = provider.billed()
    assert billed[1] == 64, "the whole output limit, billed"
    cut = item(backend.store, job)
    assert (cut.status, cut.error_type) == (FAILED, "Truncated")
    assert (cut.tokens_in, cut.tokens_out, cut.cost_nusd) == (*billed, billed[0] * 1000 + 128_000)
    done = backend.store.get_job(job)
    assert (done.tokens_unkept, done.tokens_charged) == (sum(billed), sum(billed))
    assert done.cost_unkept == done.cost_nusd == done.list_nusd == cut.cost_nusd
    assert len(provider.requests) == 1


def test_structured_unfences_checks_and_canonicalises():
    schema = json.dumps({"type": "object", "properties": {"t": {"type": "string"}}})
    c = structured(Completion('```json\n{"t":  "é"}\n```', Usage(1, 2), "p", "m"), schema)
    assert c == Completion('{"t": "é"}', Usage(1, 2), "p", "m")
    assert structured(Completion('  {"t": "x"}  ', Usage()), schema).text == '{"t": "x"}'
    with pytest.raises(InvalidAnswer, match="not a JSON object") as caught:
        structured(Completion("[1]", Usage()), schema)
    assert caught.value.http_status == 200
    with pytest.raises(InvalidAnswer) as caught:
        structured(Completion('{"t": 3}', Usage(4, 5)), schema)
    assert caught.value.usage == Usage(4, 5) and caught.value.billed, "the answer was billed"
    assert issubclass(InvalidAnswer, TransientModelError), "an invalid answer is retried"
