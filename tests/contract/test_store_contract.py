"""The store and limiter contract, run unchanged against every backend (store/protocol.py).

Concurrency is part of the contract: claims are checked across threads behind a barrier and
across processes, with counts, never timings.

Time: tests of leases, heartbeats and 429 waits run on a clock the test moves (`clocked`,
clocked.py), so they neither wait nor depend on the machine's speed. A few keep real time end
to end, on each backend, to show the real clock drives the same rules: a lease that runs out
(test_expired_leases_return_to_pending_and_renewed_ones_stay), a 429 wait that ends
(test_acquire_waits_while_paused_and_takes_nothing) and pacing across threads
(test_pacing_spaces_requests_for_all_threads).
"""

from __future__ import annotations

import math
import multiprocessing
import threading
import time
from collections import Counter

import pytest

from hermes_bulk.errors import HermesBulkError
from hermes_bulk.fleet import broker
from hermes_bulk.providers.pacing import IN_PLACE_WAIT_S
from hermes_bulk.store.protocol import (
    AWAITING_RECOVERY,
    FAILED,
    INTERRUPTED_ORPHANED,
    INTERRUPTED_WORKER_STOP,
    NOT_STARTED,
    PAUSE_TOKEN_LIMIT,
    PAUSED,
    RUNNING,
    Claim,
    ClaimRefused,
    Event,
    ItemError,
    JobSpec,
    NewItem,
    Usage,
    WorkerInfo,
)

from .clocked import ClockedBackend, clocked_backend

BACKENDS = ["sqlite", "redis"]


@pytest.fixture(params=BACKENDS)
def backend_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'bulk.db'}"
    return request.getfixturevalue("redis_url")


@pytest.fixture
def backend(backend_url):
    b = broker.build_backend(backend_url)
    yield b
    b.close()


@pytest.fixture
def store(backend):
    return backend.store


@pytest.fixture
def limits(backend):
    return backend.limits


@pytest.fixture(params=BACKENDS)
def clocked(request, tmp_path) -> ClockedBackend:
    """A store and limiter on a clock the test moves (clocked.py)."""
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    b = clocked_backend(request.param, tmp_path, url)
    yield b
    b.close()


_counter = iter(range(10**9))


def make_job(
    store,
    n: int = 10,
    *,
    state: str | None = RUNNING,
    contents=None,
    estimate: int | list[int] = 10,
    answer_keys: list[str] | None = None,
    worst: list[int] | None = None,
    **spec_kw,
) -> str:
    """A job of n items; estimate: what each claim reserves (the stored worst case), unless
    worst gives that apart (NewItem.worst_tokens) and estimate is then the expected tokens."""
    job_id = f"job{next(_counter):06d}{int(time.time() * 1000) % 100000:05d}"
    spec = JobSpec(
        job_id=job_id,
        instruction="do it",
        source="/nowhere",
        source_kind="directory",
        concurrency=spec_kw.pop("concurrency", 1000),
        retries=2,
        provider_key="p:test",
        **spec_kw,
    )
    store.begin_job(spec)
    items = []
    for i in range(n):
        content = contents[i] if contents else f"content {i}"
        items.append(
            NewItem(
                index=i,
                name=f"item-{i}",
                content=content,
                content_hash=f"b2:{hash(content)}",
                origin=f"f{i}.txt",
                offset=-1,
                stat_sig="1:1",
                estimated_tokens=estimate[i] if isinstance(estimate, list) else estimate,
                answer_key=answer_keys[i] if answer_keys else "",
                worst_tokens=worst[i] if worst else None,
            )
        )
    store.add_items(job_id, items)
    store.finish_job(job_id)
    if state and state != NOT_STARTED:
        store.set_state(job_id, state, from_states=[NOT_STARTED])
    return job_id


def claim(store, job_id, worker="w1", hint=0, lease_s=30.0, max_running=1000):
    return store.claim_item(job_id, hint, worker, lease_s=lease_s, max_running=max_running)


# Creating and reading -------------------------------------------------------------------------


def test_a_job_is_invisible_until_creation_finishes(store):
    spec = JobSpec(
        job_id="creating0001",
        instruction="x",
        source="/s",
        source_kind="file",
        concurrency=2,
        retries=1,
    )
    store.begin_job(spec)
    assert store.get_job("creating0001") is None
    assert "creating0001" not in [j.job_id for j in store.list_jobs()]
    store.add_items("creating0001", [NewItem(0, "a", "abc", "b2:1", "", -1, "1:1", 7)])
    job = store.finish_job("creating0001")
    assert (job.state, job.total, job.pending, job.estimated_tokens) == (NOT_STARTED, 1, 1, 7)
    assert store.get_job("creating0001").spec == spec


def test_identical_contents_are_returned_to_each_item(store):
    job_id = make_job(store, 3, contents=["same", "same", "other"])
    got = sorted((c.index, c.content) for c in (claim(store, job_id, hint=i) for i in range(3)))
    assert got == [(0, "same"), (1, "same"), (2, "other")]


def test_find_and_list_jobs(store):
    a = make_job(store, 1)
    b = make_job(store, 1)
    assert [j.job_id for j in store.list_jobs(2)] == [b, a]
    assert store.find_job_ids(a[:-2]) == [a] or a in store.find_job_ids(a[:-2])
    assert store.find_job_ids("zzz") == []


def test_delete_removes_the_job_and_everything_it_owns(store):
    job_id = make_job(store, 3)
    store.add_events(job_id, [Event("note", "hello")])
    assert store.delete_job(job_id) is True
    assert store.get_job(job_id) is None
    assert list(store.iter_items(job_id)) == []
    assert store.list_events(job_id) == []
    assert store.delete_job(job_id) is False


def test_items_stream_in_index_order_across_batches(store):
    job_id = make_job(store, 25)
    c = claim(store, job_id, hint=7)
    store.complete_item(job_id, c.index, "w1", "result seven", Usage(3, 4))
    items = list(store.iter_items(job_id, batch=4))
    assert [i.index for i in items] == list(range(25))
    assert items[7].result == "result seven" and items[7].status == "completed"
    assert items[0].result is None and items[0].status == "pending"


def test_items_stream_with_their_content_when_asked(store):
    job_id = make_job(store, 5, contents=["same", "same", "b", "c", "d"])
    assert [i.content for i in store.iter_items(job_id, batch=2)] == [None] * 5
    assert [i.content for i in store.iter_items(job_id, batch=2, with_content=True)] == [
        "same",
        "same",
        "b",
        "c",
        "d",
    ]


def test_update_job_changes_concurrency_and_pacing_for_the_next_claim(store):
    job_id = make_job(store, 4, concurrency=1, rpm=60)
    assert isinstance(claim(store, job_id), Claim)
    assert claim(store, job_id).reason == "at_capacity"
    job = store.update_job(job_id, concurrency=3, tpm=5000)
    assert (job.spec.concurrency, job.spec.rpm, job.spec.tpm) == (3, 60, 5000), (
        "None leaves rpm as it was"
    )
    assert store.get_job(job_id).spec == job.spec
    c = claim(store, job_id)
    assert isinstance(c, Claim) and c.job.spec.concurrency == 3 and c.job.spec.tpm == 5000
    assert isinstance(claim(store, job_id), Claim)
    assert claim(store, job_id).reason == "at_capacity"
    assert store.update_job(job_id).spec == job.spec, "nothing given: nothing changes"
    assert store.update_job("nope", concurrency=2) is None


def test_events_keep_order_and_limit(store):
    job_id = make_job(store, 1)
    store.add_events(job_id, [Event("e", f"m{i}") for i in range(5)])
    assert [e.message for e in store.list_events(job_id, 3)] == ["m2", "m3", "m4"]


def test_one_item_is_read_by_index_and_found_by_name(store):
    job_id = make_job(store, 5, contents=["a", "b", "same", "same", "e"])
    c = claim(store, job_id, hint=2)
    store.record_attempt(
        job_id,
        c.index,
        "w1",
        ItemError("TransientError", "the provider answered HTTP 503", 503),
        rate_limited=False,
    )
    store.add_events(job_id, [Event("note", "about item 4", 3)])
    store.complete_item(job_id, c.index, "w1", "answer two", Usage(3, 4))
    got = store.get_item(job_id, 2)
    assert (
        got.item.name,
        got.item.status,
        got.item.result,
        got.item.tokens_in,
        got.item.tokens_out,
    ) == ("item-2", "completed", "answer two", 3, 4)
    assert (got.content, got.content_hash) == ("same", f"b2:{hash('same')}")
    assert (
        store.get_item(job_id, 0).item.status == "pending"
        and store.get_item(job_id, 0).content == "a"
    )
    assert store.get_item(job_id, 5) is None and store.get_item(job_id, -1) is None
    assert store.get_item("nojob", 0) is None
    assert (store.find_item(job_id, "item-4"), store.find_item(job_id, "item-9")) == (4, None)
    assert store.item_names(job_id, [4, 0, 4, 99]) == {0: "item-0", 4: "item-4"}
    assert store.item_names(job_id, []) == {}
    events = store.list_events(job_id, item=2)
    assert [(e.kind, e.http_status, e.message) for e in events] == [
        ("attempt_failed", 503, "the provider answered HTTP 503")
    ]
    assert [e.message for e in store.list_events(job_id, item=3)] == ["about item 4"]
    assert store.list_events(job_id, item=1) == []


# Claims --------------------------------------------------------------------------------------


def test_claim_prefers_the_hint_then_the_lowest_pending_index(store):
    job_id = make_job(store, 5)
    assert claim(store, job_id, hint=3).index == 3
    assert claim(store, job_id, hint=3).index == 0
    assert claim(store, job_id, hint=99).index == 1


def test_claim_refuses_with_a_reason(store):
    assert claim(store, "nope").reason == "no_job"
    not_run = make_job(store, 2, state=None)
    assert claim(store, not_run).reason == "not_running"
    job_id = make_job(store, 3, concurrency=2)
    assert isinstance(claim(store, job_id, max_running=2), Claim)
    assert isinstance(claim(store, job_id, max_running=2), Claim)
    assert claim(store, job_id, max_running=2).reason == "at_capacity"
    assert claim(store, job_id, max_running=5).reason == "at_capacity", (
        "the job's own concurrency caps it too"
    )
    small = make_job(store, 1)
    claim(store, small)
    assert claim(store, small).reason == "no_pending"


def test_the_smaller_of_the_jobs_concurrency_and_the_workers_cap_caps_claims(store):
    job_id = make_job(store, 5, concurrency=3)
    assert isinstance(claim(store, job_id, max_running=1), Claim)
    assert claim(store, job_id, max_running=1).reason == "at_capacity", (
        "the worker's cap, below the job's concurrency, at equality"
    )
    assert isinstance(claim(store, job_id, max_running=2), Claim)
    assert isinstance(claim(store, job_id, max_running=4), Claim), "one under the job's own"
    assert claim(store, job_id, max_running=4).reason == "at_capacity"


def test_a_claim_records_counts_and_the_reservation(store):
    job_id = make_job(store, 4, estimate=25)
    claim(store, job_id)
    job = store.get_job(job_id)
    assert (job.pending, job.running, job.tokens_reserved) == (3, 1, 25)
    assert job.last_claim_at is not None


def test_concurrent_claims_give_each_item_to_exactly_one_thread(store):
    job_id = make_job(store, 40)
    barrier = threading.Barrier(16)
    got: list[int] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        barrier.wait()
        while True:
            c = claim(store, job_id, worker=f"w{n}")
            if isinstance(c, ClaimRefused):
                return
            with lock:
                got.append(c.index)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(40))


def _claim_all_in_process(url: str, job_id: str, worker: str, queue) -> None:
    backend = broker.build_backend(url)
    got = []
    while True:
        c = backend.store.claim_item(job_id, 0, worker, lease_s=30, max_running=1000)
        if isinstance(c, ClaimRefused):
            break
        got.append(c.index)
    queue.put(got)
    backend.close()


def test_concurrent_claims_across_processes_never_share_an_item(store, backend_url):
    job_id = make_job(store, 120)
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_claim_all_in_process, args=(backend_url, job_id, f"p{i}", queue))
        for i in range(4)
    ]
    for p in procs:
        p.start()
    results = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    flat = [i for r in results for i in r]
    assert sorted(flat) == list(range(120)), Counter(flat).most_common(3)
    assert store.get_job(job_id).running == 120


# Finishing items -------------------------------------------------------------------------------


def test_only_the_owner_completes_and_only_once(store):
    job_id = make_job(store, 2)
    c = claim(store, job_id, worker="owner")
    assert store.complete_item(job_id, c.index, "intruder", "bad", Usage()) is False
    assert (
        store.complete_item(
            job_id, c.index, "owner", "good", Usage(5, 6), provider="prov", model="m"
        )
        is True
    )
    assert store.complete_item(job_id, c.index, "owner", "again", Usage()) is False
    item = next(i for i in store.iter_items(job_id) if i.index == c.index)
    assert (item.result, item.tokens_in, item.tokens_out, item.provider, item.model) == (
        "good",
        5,
        6,
        "prov",
        "m",
    )
    job = store.get_job(job_id)
    assert (job.completed, job.running, job.tokens_in, job.tokens_out, job.tokens_charged) == (
        1,
        0,
        5,
        6,
        11,
    )


def test_completion_without_reported_usage_charges_the_estimate(store):
    job_id = make_job(store, 1, estimate=40)
    c = claim(store, job_id)
    store.complete_item(job_id, c.index, "w1", "r", Usage())
    job = store.get_job(job_id)
    assert (job.tokens_charged, job.tokens_reserved, job.tokens_in) == (40, 0, 0)


def test_completion_with_half_the_usage_reported_charges_what_was_reported(store):
    job_id = make_job(store, 2, estimate=40)
    for usage in (Usage(tokens_in=7), Usage(tokens_out=5)):
        c = claim(store, job_id)
        store.complete_item(job_id, c.index, "w1", "r", usage)
    job = store.get_job(job_id)
    assert (job.tokens_charged, job.tokens_in, job.tokens_out, job.tokens_reserved) == (12, 7, 5, 0)


def test_a_completed_item_is_never_claimed_again(clocked):
    store = clocked.store
    job_id = make_job(store, 1)
    c = claim(store, job_id, lease_s=0.05)
    store.complete_item(job_id, c.index, "w1", "r", Usage())
    clocked.clock.advance(0.1)  # past the lease it had
    assert store.release_expired_leases() == {}
    assert claim(store, job_id).reason == "no_pending"


def test_fail_records_the_error_and_an_event(store):
    job_id = make_job(store, 1)
    c = claim(store, job_id)
    err = ItemError("PermanentError", "the provider rejected the request (HTTP 400)", 400)
    assert store.fail_item(job_id, c.index, "other", err) is False
    assert store.fail_item(job_id, c.index, "w1", err) is True
    item = next(store.iter_items(job_id))
    assert (item.status, item.error_type, item.http_status) == ("failed", "PermanentError", 400)
    assert store.get_job(job_id).failed == 1
    assert store.list_events(job_id)[-1].kind == "item_failed"


def test_failed_items_are_the_first_failed_in_index_order_and_leave_once_retried(store):
    job_id = make_job(store, 8)
    claims = [claim(store, job_id) for _ in range(8)]
    for c in claims:  # items 1, 4, 6 fail; the rest complete
        if c.index in (1, 4, 6):
            assert store.fail_item(
                job_id, c.index, "w1", ItemError("PermanentError", f"no {c.index}", 400)
            )
        else:
            assert store.complete_item(job_id, c.index, "w1", "r", Usage())
    failed = store.failed_items(job_id, 2)
    assert [
        (i.index, i.name, i.status, i.error_type, i.http_status, i.error_message) for i in failed
    ] == [
        (1, "item-1", "failed", "PermanentError", 400, "no 1"),
        (4, "item-4", "failed", "PermanentError", 400, "no 4"),
    ]
    assert [i.index for i in store.failed_items(job_id, 10)] == [1, 4, 6]
    assert store.failed_items(job_id, 0) == [] and store.failed_items("nosuchjob", 5) == []
    assert store.retry_failed(job_id) == 3
    assert store.failed_items(job_id, 10) == []


def test_an_item_that_reserved_nothing_completes_fails_and_is_released(store):
    """A zero estimate gives back a zero reservation (Lua's -0 once made Redis refuse it)."""
    job_id = make_job(store, 4, estimate=0)
    a, b, c, d = (
        claim(store, job_id, worker=w, lease_s=ls)
        for w, ls in (("w1", 30), ("w1", 30), ("w1", 30), ("dead", -60))
    )
    assert store.complete_item(job_id, a.index, "w1", "r", Usage(None, 5)) is True
    assert store.fail_item(job_id, b.index, "w1", ItemError("PermanentError", "no", 400)) is True
    assert store.release_item(job_id, c.index, "w1") is True
    assert store.release_expired_leases() == {job_id: 1}
    job = store.get_job(job_id)
    assert (job.pending, job.running, job.completed, job.failed) == (2, 0, 1, 1)
    assert (job.tokens_reserved, job.tokens_charged) == (0, 5)
    assert d.index == 3


def test_an_empty_provider_or_model_is_recorded_as_none(store):
    job_id = make_job(store, 1)
    c = claim(store, job_id)
    assert store.complete_item(job_id, c.index, "w1", "r", Usage(), provider="", model="") is True
    item = next(store.iter_items(job_id))
    assert (item.provider, item.model) == (None, None)


def test_release_returns_the_item_without_charging(store):
    job_id = make_job(store, 1, estimate=9)
    c = claim(store, job_id)
    assert store.release_item(job_id, c.index, "w1") is True
    job = store.get_job(job_id)
    assert (job.pending, job.running, job.tokens_reserved, job.tokens_charged) == (1, 0, 0, 0)
    assert store.release_item(job_id, c.index, "w1") is False


def test_attempts_and_rate_limit_waits_are_counted_per_item(store):
    job_id = make_job(store, 1)
    c = claim(store, job_id)
    e = ItemError("TransientError", "attempt failed", 503)
    assert store.record_attempt(job_id, c.index, "w1", e, rate_limited=False) == 1
    rl = ItemError("RateLimitError", "rate limited", 429)
    assert store.record_attempt(job_id, c.index, "w1", rl, rate_limited=True) == 1
    assert store.record_attempt(job_id, c.index, "w1", rl, rate_limited=True) == 2
    assert store.record_attempt(job_id, c.index, "w1", e, rate_limited=False) == 2
    assert store.record_attempt(job_id, c.index, "w1", rl, rate_limited=True) == 1, (
        "a transient error breaks the run of 429s"
    )
    assert store.record_attempt(job_id, c.index, "stranger", e, rate_limited=False) == -1
    store.release_item(job_id, c.index, "w1")
    again = claim(store, job_id)
    assert (again.attempts, again.rate_limit_waits) == (2, 1)
    assert [e.kind for e in store.list_events(job_id)][-5:] == [
        "attempt_failed",
        "rate_limited",
        "rate_limited",
        "attempt_failed",
        "rate_limited",
    ]
    # Each event keeps its item, error type and HTTP status, as `events` shows them.
    assert [
        (e.item_index, e.error_type, e.http_status)
        for e in store.list_events(job_id, item=again.index)
    ][-2:] == [(again.index, "TransientError", 503), (again.index, "RateLimitError", 429)]


def test_a_failed_attempt_is_counted_and_settled_in_one_step(store):
    """settle_failed_attempt: the attempt is counted and the item goes back to pending within
    retries, or fails past them; once settled the owner holds nothing, so the same failure
    settled again (a batch line ingested twice) counts nothing more."""
    job_id = make_job(store, 2, estimate=9)  # retries=2
    e = ItemError("TransientError", "the line failed", 503)
    c = claim(store, job_id)
    assert store.settle_failed_attempt(job_id, c.index, "w1", e, retries=2) == 1
    assert store.settle_failed_attempt(job_id, c.index, "w1", e, retries=2) == -1, (
        "settled: no longer w1's"
    )
    job = store.get_job(job_id)
    assert (job.pending, job.running, job.failed, job.tokens_reserved) == (2, 0, 0, 0)
    assert store.get_item(job_id, c.index).item.attempts == 1
    for attempt in (2, 3):
        c = claim(store, job_id, hint=0)
        assert store.settle_failed_attempt(job_id, c.index, "w1", e, retries=2) == attempt
    item = store.get_item(job_id, 0).item
    assert (item.status, item.attempts, item.error_type, item.http_status) == (
        FAILED,
        3,
        "TransientError",
        503,
    )
    job = store.get_job(job_id)
    assert (job.pending, job.running, job.failed, job.tokens_reserved, job.tokens_charged) == (
        1,
        0,
        1,
        0,
        0,
    )
    assert store.settle_failed_attempt(job_id, 1, "stranger", e, retries=2) == -1
    assert [ev.kind for ev in store.list_events(job_id, item=0)] == ["attempt_failed"] * 3 + [
        "item_failed"
    ]


# Leases ----------------------------------------------------------------------------------------


def test_expired_leases_return_to_pending_and_renewed_ones_stay(clocked):
    store = clocked.store
    job_id = make_job(store, 2)
    # Times in eighths of a second: exact in SQLite's float seconds, so "at the end" is exact.
    a = claim(store, job_id, worker="alive", lease_s=0.25)
    b = claim(store, job_id, worker="dead", lease_s=0.25)
    clocked.clock.advance(0.125)
    assert store.renew_leases("alive", [(job_id, a.index), (job_id, b.index)], lease_s=5) == 1, (
        "only the worker's own items are renewed"
    )
    clocked.clock.advance(0.125)
    assert store.release_expired_leases() == {}, "a lease runs to its end, inclusive"
    clocked.clock.advance(0.001)
    assert store.release_expired_leases() == {job_id: 1}
    assert store.complete_item(job_id, a.index, "alive", "ok", Usage()) is True
    assert store.complete_item(job_id, b.index, "dead", "late", Usage()) is False
    again = claim(store, job_id, worker="new")
    assert again.index == b.index


def test_an_item_the_worker_lost_track_of_is_not_renewed(clocked):
    store = clocked.store
    job_id = make_job(store, 2)
    # Times in eighths of a second: exact in SQLite's float seconds, so "at the end" is exact.
    kept = claim(store, job_id, worker="w", lease_s=0.25)
    claim(
        store, job_id, worker="w", lease_s=0.25
    )  # say its claim reply was lost: the worker never knew
    assert store.renew_leases("w", [(job_id, kept.index)], lease_s=5) == 1
    clocked.clock.advance(0.25)
    assert store.release_expired_leases() == {}, "a lease runs to its end, inclusive"
    clocked.clock.advance(0.001)
    assert store.release_expired_leases() == {job_id: 1}
    assert store.item_owners() == {"w": 1}


def test_a_renewed_lease_lasts_exactly_lease_s_from_the_renewal(clocked):
    store = clocked.store
    job_id = make_job(store, 1)
    held = claim(store, job_id, worker="w", lease_s=30)
    assert store.renew_leases("w", [], lease_s=30) == 0, "nothing to renew"
    clocked.clock.advance(20)
    assert store.renew_leases("w", [(job_id, held.index)], lease_s=30) == 1
    clocked.clock.advance(30)  # 50 s after the claim, 30 s after the renewal
    assert store.release_expired_leases() == {}, "the renewal runs to its end, inclusive"
    clocked.clock.advance(0.001)
    assert store.release_expired_leases() == {job_id: 1}
    assert [e.message for e in store.list_events(job_id) if e.kind == "recovered"] == [
        "1 interrupted item returned to the queue"
    ]


def test_release_worker_items_and_item_owners(store):
    job_id = make_job(store, 5)
    for w in ("a", "a", "b"):
        claim(store, job_id, worker=w)
    assert store.item_owners() == {"a": 2, "b": 1}
    assert store.release_worker_items("a") == {job_id: 2}
    assert store.item_owners() == {"b": 1}
    job = store.get_job(job_id)
    assert (job.pending, job.running, job.tokens_reserved) == (4, 1, 10), (
        "their reservations are given back"
    )
    assert store.release_worker_items("b") == {job_id: 1}
    # What a user reads in `events`, worded the same on both backends, in number too.
    assert [e.message for e in store.list_events(job_id) if e.kind == "recovered"] == [
        "2 interrupted items returned to the queue from worker a",
        "1 interrupted item returned to the queue from worker b",
    ]


def test_expired_leases_give_back_their_reservations(clocked):
    store = clocked.store
    job_id = make_job(store, 3, estimate=7)
    claim(store, job_id, worker="dead", lease_s=0.1)
    claim(store, job_id, worker="dead", lease_s=0.1)
    clocked.clock.advance(0.2)
    assert store.release_expired_leases() == {job_id: 2}
    assert store.get_job(job_id).tokens_reserved == 0


# Job state -------------------------------------------------------------------------------------


def test_state_moves_only_from_allowed_states(store):
    job_id = make_job(store, 1, state=None)
    assert store.get_job(job_id).run_at is None
    assert store.set_state(job_id, PAUSED, from_states=[RUNNING]) is None
    job = store.set_state(job_id, RUNNING, from_states=[NOT_STARTED], event=Event("run", "go"))
    assert job.state == RUNNING and job.run_at is not None
    job = store.set_state(
        job_id, PAUSED, from_states=[RUNNING], pause_reason="user", max_tokens=500
    )
    assert (job.state, job.pause_reason, job.spec.max_tokens) == (PAUSED, "user", 500)
    assert store.active_job_ids().count(job_id) == 0
    assert store.list_events(job_id)[-1].message == "go"


def _within_limit(store, job_id, limit):
    job = store.get_job(job_id)  # one read of the job: charged and reserved from one instant
    assert job.tokens_charged + job.tokens_reserved <= limit, (
        job.tokens_charged,
        job.tokens_reserved,
    )
    return job


def test_why_a_job_was_interrupted_is_kept_until_it_is_run_again(store):
    job_id = make_job(store, 2)
    assert store.get_job(job_id).interrupted is None
    before = store.now()
    assert store.mark_interrupted(
        job_id, INTERRUPTED_WORKER_STOP, event=Event("worker_stopped", "returned")
    )
    job = store.get_job(job_id)
    assert (
        job.interrupted == INTERRUPTED_WORKER_STOP
        and before - 1 <= job.interrupted_at <= store.now() + 1
    )
    assert store.list_events(job_id)[-1].kind == "worker_stopped"
    assert store.mark_interrupted(job_id, INTERRUPTED_ORPHANED)
    assert store.get_job(job_id).interrupted == INTERRUPTED_ORPHANED, "the latest reason wins"
    store.set_state(job_id, AWAITING_RECOVERY, from_states=[RUNNING])
    assert store.get_job(job_id).interrupted == INTERRUPTED_ORPHANED, (
        "awaiting recovery keeps the reason"
    )
    assert not store.mark_interrupted(job_id, INTERRUPTED_WORKER_STOP), (
        "only a running job is marked"
    )
    store.set_state(job_id, RUNNING, from_states=[AWAITING_RECOVERY])
    job = store.get_job(job_id)
    assert (job.interrupted, job.interrupted_at) == (None, None), "running it clears the reason"
    store.mark_interrupted(job_id, INTERRUPTED_WORKER_STOP)
    assert store.mark_interrupted(job_id, None) and store.get_job(job_id).interrupted is None
    assert not store.mark_interrupted("nosuchjob", INTERRUPTED_WORKER_STOP)


def test_a_claim_waits_for_reservations_in_flight_instead_of_pausing(store):
    job_id = make_job(store, 5, estimate=30, max_tokens=100)
    first = [claim(store, job_id) for _ in range(3)]
    assert all(isinstance(c, Claim) for c in first)
    # 90 reserved + 30 would exceed 100, but nothing is charged yet: the item waits.
    assert claim(store, job_id) == ClaimRefused("tokens_in_flight")
    job = _within_limit(store, job_id, 100)
    assert (job.state, job.pause_reason, job.tokens_reserved, job.pending) == (RUNNING, None, 90, 2)
    assert not [e for e in store.list_events(job_id) if e.kind == "paused"]
    # Reported usage replaces the estimate: a cheap answer leaves room for the next item.
    store.complete_item(job_id, first[0].index, "w1", "r", Usage(2, 3))
    assert isinstance(claim(store, job_id), Claim)
    _within_limit(store, job_id, 100)
    assert claim(store, job_id) == ClaimRefused("tokens_in_flight")


def test_token_limit_pauses_only_when_what_is_charged_leaves_no_room(store):
    job_id = make_job(store, 3, estimate=30, max_tokens=80)
    a, b = claim(store, job_id), claim(store, job_id)
    assert claim(store, job_id).reason == "tokens_in_flight"
    store.complete_item(
        job_id, a.index, "w1", "r", Usage()
    )  # no usage reported: the estimate is charged
    assert claim(store, job_id).reason == "tokens_in_flight"  # 30 charged + 30 fits under 80
    store.complete_item(job_id, b.index, "w1", "r", Usage(20, 10))
    assert claim(store, job_id) == ClaimRefused("token_limit")  # 60 charged + 30 does not
    job = _within_limit(store, job_id, 80)
    assert (job.state, job.pause_reason, job.tokens_charged, job.tokens_reserved) == (
        PAUSED,
        PAUSE_TOKEN_LIMIT,
        60,
        0,
    )
    (event,) = [e for e in store.list_events(job_id) if e.kind == "paused"]
    assert (
        event.message
        == "token limit reached: 60 charged + 30 for item 3 would exceed --max-tokens 80"
    )
    assert store.next_item_estimate(job_id) == 30
    # A larger limit lets it go on.
    store.set_state(job_id, RUNNING, from_states=[PAUSED], max_tokens=90)
    assert isinstance(claim(store, job_id), Claim)
    assert store.next_item_estimate(job_id) is None


def test_an_item_that_fits_exactly_beside_what_is_charged_waits_and_one_token_less_room_pauses(
    store,
):
    for limit, refusal in ((20, "tokens_in_flight"), (19, "token_limit")):
        job_id = make_job(store, 3, estimate=10, max_tokens=limit)
        first = claim(store, job_id)
        store.complete_item(job_id, first.index, "w1", "r", Usage(5, 5))  # 10 charged
        if limit == 20:
            assert isinstance(claim(store, job_id), Claim), (
                "10 charged + 10 reserves exactly the limit"
            )
        assert claim(store, job_id) == ClaimRefused(refusal), f"10 charged + 10 against {limit}"
        assert store.get_job(job_id).state == (RUNNING if limit == 20 else PAUSED)


def test_token_limit_pauses_while_reservations_are_in_flight_when_they_cannot_help(store):
    # Charged only grows: an item that does not fit beside it never will.
    job_id = make_job(store, 3, estimate=[10, 50, 95], max_tokens=100)
    small, mid = claim(store, job_id), claim(store, job_id)
    store.complete_item(job_id, small.index, "w1", "r", Usage(5, 5))
    assert claim(store, job_id) == ClaimRefused(
        "token_limit"
    )  # 10 charged + 95 > 100, 50 still reserved
    job = _within_limit(store, job_id, 100)
    assert (job.state, job.tokens_reserved) == (PAUSED, 50)
    assert store.complete_item(job_id, mid.index, "w1", "r", Usage(1, 1))


def test_concurrent_claims_never_go_over_the_token_limit_and_run_until_it_is_reached(store):
    limit, estimate = 600, 30
    job_id = make_job(store, 60, estimate=estimate, max_tokens=limit)
    barrier = threading.Barrier(8)
    outcomes: Counter = Counter()
    lock = threading.Lock()

    def worker(name: str) -> None:
        barrier.wait()
        while True:
            c = claim(store, job_id, worker=name)
            if isinstance(c, ClaimRefused):
                with lock:
                    outcomes[c.reason] += 1
                if c.reason != "tokens_in_flight":
                    return
                time.sleep(0.002)
                continue
            _within_limit(store, job_id, limit)
            time.sleep(0.001)
            assert store.complete_item(
                job_id, c.index, name, "r", Usage(5, 5 + c.index % 10)
            )  # below the estimate
            _within_limit(store, job_id, limit)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    job = _within_limit(store, job_id, limit)
    assert outcomes["tokens_in_flight"] > 0, "reservations were in flight when the limit was near"
    assert (job.state, job.tokens_reserved, job.running) == (PAUSED, 0, 0)
    assert job.tokens_charged + estimate > limit >= job.tokens_charged, (
        "paused only when the next would not fit"
    )
    assert job.completed == 60 - job.pending and job.completed > limit // estimate


def test_retry_returns_failed_items_with_fresh_counts(store):
    job_id = make_job(store, 2)
    for _ in range(2):
        c = claim(store, job_id)
        store.record_attempt(
            job_id, c.index, "w1", ItemError("TransientError", "x"), rate_limited=False
        )
        store.fail_item(job_id, c.index, "w1", ItemError("TransientError", "x"))
    assert store.retry_failed(job_id) == 2
    job = store.get_job(job_id)
    assert (job.failed, job.pending) == (0, 2)
    c = claim(store, job_id)
    assert c.attempts == 0
    assert next(i for i in store.iter_items(job_id) if i.index == c.index).error_type is None


# Workers ---------------------------------------------------------------------------------------


def test_workers_are_live_until_their_ttl_passes(clocked):
    store = clocked.store
    job_id = make_job(store, 1)
    now = store.now()
    store.heartbeat_worker(WorkerInfo("w-live", "h", 1, now, 0.0, 4), ttl_s=10)
    store.heartbeat_worker(
        WorkerInfo("w-gone", "h", 2, now, 0.0, 4), ttl_s=0.125
    )  # exact in float seconds
    claim(store, job_id, worker="w-live")
    clocked.clock.advance(0.125)
    assert {w.worker_id for w in store.live_workers()} == {"w-live", "w-gone"}, (
        "live through its ttl"
    )
    clocked.clock.advance(0.001)
    live = {w.worker_id: w for w in store.live_workers()}
    assert set(live) == {"w-live"}
    assert live["w-live"].holding == [(job_id, 0)] and live["w-live"].threads == 4
    store.remove_worker("w-live")
    assert store.live_workers() == []


# Shared limits ---------------------------------------------------------------------------------


def test_a_pause_is_extended_but_never_shortened(limits):
    until = limits.pause("k1", seconds=2.0, base_s=5, cap_s=120, epoch=0)
    assert limits.pause("k1", seconds=0.5, base_s=5, cap_s=120, epoch=0) == pytest.approx(
        until, abs=0.01
    )
    longer = limits.pause("k1", seconds=4.0, base_s=5, cap_s=120, epoch=0)
    assert longer > until + 1.5
    assert limits.pause_state("k1").until == pytest.approx(longer, abs=0.01)
    assert limits.pause_state("other") is None


def test_a_pause_without_retry_after_doubles_up_to_the_cap(limits, store):
    waits = []
    for generation in range(7):  # each 429 to a request sent after the one before it
        now = store.now()
        waits.append(
            round(limits.pause("k2", seconds=None, base_s=5, cap_s=120, epoch=generation) - now)
        )
    assert waits == [5, 10, 20, 40, 80, 120, 120]
    limits.clear_backoff("k2")
    assert limits.pause_state("k2").backoff_step == 0


def test_acquire_waits_while_paused_and_takes_nothing(limits):
    limits.pause("k3", seconds=0.4, base_s=5, cap_s=120, epoch=0)
    wait = limits.acquire("k3", rpm=None, tpm=None, tokens=10).wait
    assert 0.2 < wait <= 0.4
    time.sleep(wait + 0.02)
    assert limits.acquire("k3", rpm=None, tpm=None, tokens=10).wait == 0.0


def test_pacing_spaces_requests_for_all_threads(limits):
    granted = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)
    deadline = time.time() + 1.0

    def taker():
        barrier.wait()
        while time.time() < deadline:
            wait = limits.acquire("k4", rpm=1200, tpm=None, tokens=1).wait  # 20 per second
            if wait == 0:
                with lock:
                    granted.append(time.time())
            else:
                time.sleep(min(wait, max(0.0, deadline - time.time())))

    threads = [threading.Thread(target=taker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 15 <= len(granted) <= 21, len(granted)


def test_token_pacing_lets_a_large_item_through_an_empty_bucket(limits):
    assert (
        limits.acquire("k5", rpm=None, tpm=60, tokens=500).wait == 0.0
    )  # cost above one second's worth
    wait = limits.acquire("k5", rpm=None, tpm=60, tokens=1).wait
    assert wait > 400, "the next token waits until the large item's tokens have drained"


def _granted_within(c: ClockedBackend, key: str, seconds: float) -> int:
    """Unpaced requests granted in the next `seconds` of the test's clock, asking again when
    told."""
    granted, end = 0, c.clock.ms + round(seconds * 1000)
    while c.clock.ms < end:
        wait = c.limits.acquire(key, rpm=None, tpm=None, tokens=1).wait
        if wait == 0:
            granted += 1
            assert granted < 10_000, "the key is paced"
        else:
            c.clock.set_ms(min(end, c.clock.ms + max(1, math.ceil(wait * 1000 - 1e-6))))
    return granted


def _wait_out(c: ClockedBackend, seconds: float) -> None:
    c.clock.set_ms(c.clock.ms + math.ceil(seconds * 1000 - 1e-6))


def test_429s_to_one_burst_halve_the_rate_once_and_it_recovers_with_time(clocked):
    limits = clocked.limits
    # Twenty requests in a burst, then three 429s from that burst: one wait, one halving.
    turns = [limits.acquire("k6", rpm=None, tpm=None, tokens=1) for _ in range(20)]
    assert [t.wait for t in turns] == [0.0] * 20
    for turn in turns[:3]:
        limits.pause("k6", seconds=0.2, base_s=5, cap_s=120, epoch=turn.epoch)
    clocked.clock.advance(0.25)
    halved = _granted_within(clocked, "k6", 1.0)
    assert 6 <= halved <= 13, f"about half of the 20/s seen before the 429, got {halved}"
    # Successes do not matter; time does: the learned rate doubles every 5 s after the wait.
    clocked.clock.advance(5.0)
    recovered = _granted_within(clocked, "k6", 0.5)
    assert recovered >= 9, f"back to about 20/s or more, got {recovered * 2}/s"


def test_a_429_to_a_request_slower_than_a_second_paces_by_its_own_rate_not_one_a_minute(clocked):
    limits = clocked.limits
    # One request, answered 429 after 2.5 s (a slow provider, Hermes retrying it, a loaded
    # machine): the key saw one request in 2.5 s, so it is paced to one in about 5 s. It used to
    # see a rate of 0 (nothing granted in the last second), pace to one request a minute, and a
    # job's next item waited out that minute (the 429 test in tests/plugin stalled under load).
    turn = limits.acquire("k6s", rpm=None, tpm=None, tokens=1)
    assert turn.wait == 0.0
    clocked.clock.advance(2.5)
    limits.pause("k6s", seconds=0.2, base_s=5, cap_s=120, epoch=turn.epoch)
    clocked.clock.advance(0.25)
    assert (
        limits.acquire("k6s", rpm=None, tpm=None, tokens=1).wait == 0.0
    )  # the retry, after the wait
    wait = limits.acquire("k6s", rpm=None, tpm=None, tokens=1).wait
    assert 2.0 < wait < IN_PLACE_WAIT_S, (
        f"about 2 x 2.5 s, a wait a worker sleeps in place, not {wait:.1f} s"
    )


def test_only_a_429_to_a_request_sent_after_the_last_decrease_slows_down_again(clocked):
    limits = clocked.limits
    # A burst granted at one epoch; a 429 to one of them halves the rate (a short wait).
    epochs = []
    for _ in range(20):
        turn = limits.acquire("k7", rpm=None, tpm=None, tokens=1)
        assert turn.wait == 0.0
        epochs.append(turn.epoch)
    assert len(set(epochs)) == 1
    limits.pause("k7", seconds=0.05, base_s=5, cap_s=120, epoch=epochs[0])
    clocked.clock.advance(0.1)
    # The wait is over; more 429s arrive for requests of the same burst (sent before the
    # decrease): each starts a new short wait, but none halves the rate again.
    for _ in range(3):
        limits.pause("k7", seconds=0.05, base_s=5, cap_s=120, epoch=epochs[0])
        clocked.clock.advance(0.1)
    after_stale = _granted_within(clocked, "k7", 1.0)
    assert 6 <= after_stale <= 13, f"about half of the 20/s, not less, got {after_stale}"
    # A 429 to a request sent after the decrease halves it once more.
    turn = limits.acquire("k7", rpm=None, tpm=None, tokens=1)
    while turn.wait:
        _wait_out(clocked, turn.wait)
        turn = limits.acquire("k7", rpm=None, tpm=None, tokens=1)
    assert turn.epoch == epochs[0] + 1
    limits.pause("k7", seconds=0.05, base_s=5, cap_s=120, epoch=turn.epoch)
    clocked.clock.advance(0.1)
    quartered = _granted_within(clocked, "k7", 1.0)
    assert quartered <= after_stale * 0.75, (quartered, after_stale)


def _concurrent_429s(limits, key: str, turns, *, base_s: float) -> None:
    """One 429 without Retry-After per turn, all at once from threads behind a barrier."""
    barrier = threading.Barrier(len(turns))

    def answered_429(turn) -> None:
        barrier.wait()
        limits.pause(key, seconds=None, base_s=base_s, cap_s=120, epoch=turn.epoch)

    threads = [threading.Thread(target=answered_429, args=(t,)) for t in turns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_429s_to_one_generation_of_requests_double_the_wait_once(limits, store):
    # Sixteen requests sent together, all answered 429 without Retry-After: one wait of the
    # base, not 5 s * 2**15 capped at 2 min.
    turns = [limits.acquire("k8", rpm=None, tpm=None, tokens=1) for _ in range(16)]
    assert [t.wait for t in turns] == [0.0] * 16
    _concurrent_429s(limits, "k8", turns, base_s=5)
    state = limits.pause_state("k8")
    assert state.until - store.now() == pytest.approx(5, abs=1.0)
    assert state.backoff_step == 1
    # One more late 429 from the same burst changes nothing.
    limits.pause("k8", seconds=None, base_s=5, cap_s=120, epoch=turns[0].epoch)
    assert limits.pause_state("k8").until - store.now() == pytest.approx(5, abs=1.0)


def test_a_429_to_a_request_sent_after_the_wait_doubles_it_and_retry_after_still_wins(clocked):
    limits, store = clocked.limits, clocked.store
    base = 5.0
    turns = [limits.acquire("k9", rpm=None, tpm=None, tokens=1) for _ in range(16)]
    _concurrent_429s(limits, "k9", turns, base_s=base)
    first = limits.pause_state("k9")
    assert first.until - store.now() < 2 * base and first.backoff_step == 1
    _wait_out(clocked, first.until - store.now() + 0.05)
    later = limits.acquire("k9", rpm=None, tpm=None, tokens=1)  # sent after the wait ended
    assert later.wait == 0.0 and later.epoch == turns[0].epoch + 1
    now = store.now()
    assert limits.pause(
        "k9", seconds=None, base_s=base, cap_s=120, epoch=later.epoch
    ) - now == pytest.approx(2 * base, abs=0.1)
    # A straggler of the first burst, answered now, does not double it again.
    now = store.now()
    assert (
        limits.pause("k9", seconds=None, base_s=base, cap_s=120, epoch=turns[5].epoch) - now
        <= 2 * base + 0.1
    )
    assert limits.pause_state("k9").backoff_step == 2
    # A provider's Retry-After is honoured whatever the request's generation.
    now = store.now()
    assert limits.pause(
        "k9", seconds=30, base_s=base, cap_s=120, epoch=turns[5].epoch
    ) - now == pytest.approx(30, abs=0.5)


def test_answered_names_the_keys_the_answer_index_holds_and_changes_nothing(store):
    keys = [f"{next(_counter):032x}" for _ in range(3)]  # keys as prompt.answer_key makes them
    job_id = make_job(store, 3, answer_keys=keys)
    c = claim(store, job_id, hint=1)
    assert store.complete_item(job_id, c.index, "w1", "answer", Usage(3, 4))
    unknown = f"{next(_counter):032x}"
    assert store.answered([]) == set()
    assert store.answered([keys[0], keys[1], keys[2], unknown, "not hex"]) == {keys[1]}
    assert store.answered([keys[1]] * 1500) == {keys[1]}, "pages of the look-up"
    assert store.get_job(job_id).completed == 1, "read only"
    store.delete_job(job_id)
    assert store.answered([keys[1]]) == set(), "a deleted job's answers go with it"


def begun_job(store, job_id: str) -> str:
    """A job begun and not finished: what `create` has made before it adds the items."""
    store.begin_job(
        JobSpec(
            job_id=job_id,
            instruction="do it",
            source="/nowhere",
            source_kind="directory",
            concurrency=4,
            retries=2,
            provider_key="p:test",
        )
    )
    return job_id


ONE_ITEM = NewItem(
    index=0,
    name="a",
    content="x",
    content_hash="b2:x",
    origin="a.txt",
    offset=-1,
    stat_sig="1:1",
    estimated_tokens=10,
    answer_key="",
)


def test_items_for_a_job_deleted_while_it_is_created_are_one_line_to_create_again(store):
    """Another process deleted the job `create` was filling (or, on Redis, a failover lost it:
    test_redis_backend): adding its items is the store's one-line error, never an internal one."""
    job_id = begun_job(store, "jobgone0002")
    store.delete_job(job_id)
    with pytest.raises(HermesBulkError) as caught:
        store.add_items(job_id, [ONE_ITEM])
    message = str(caught.value)
    assert "run create again" in message and "\n" not in message
    assert store.list_jobs() == []
