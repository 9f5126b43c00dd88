"""A claim's lease on SQLite, on a clock the test sets: it lasts exactly lease_s from the claim.

The contract suite checks lease expiry on the real clock with short leases; here a lease of
half a minute is seen to hold until its end and to end then, without waiting for it.
"""

from __future__ import annotations

import pytest

from hermes_bulk.fleet import broker
from hermes_bulk.store.protocol import NOT_STARTED, PENDING, RUNNING, JobSpec, NewItem, Usage


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def store(tmp_path, clock):
    b = broker.build_backend(f"sqlite:///{tmp_path / 'bulk.db'}")
    b.store.db.clock = clock
    yield b.store
    b.close()


def _job(store) -> str:
    store.begin_job(
        JobSpec(
            job_id="lease0001",
            instruction="x",
            source="/in",
            source_kind="jsonl",
            concurrency=10,
            retries=1,
            provider_key="p:x",
        )
    )
    store.add_items(
        "lease0001", [NewItem(i, f"i{i}", f"c{i}", f"b2:{i}", "", -1, "", 10) for i in range(2)]
    )
    store.finish_job("lease0001")
    store.set_state("lease0001", RUNNING, from_states=[NOT_STARTED])
    return "lease0001"


@pytest.mark.parametrize("lease_s", [0.5, 30.0])
def test_a_lease_holds_until_lease_s_after_the_claim_and_ends_then(store, clock, lease_s):
    job = _job(store)
    assert store.claim_item(job, 0, "w1", lease_s=lease_s, max_running=10).index == 0
    clock.now += lease_s * 0.99
    assert store.release_expired_leases() == {}
    assert store.get_item(job, 0).item.status == RUNNING
    clock.now += lease_s * 0.02
    assert store.release_expired_leases() == {job: 1}
    assert store.get_item(job, 0).item.status == PENDING


def _items_job(store, job_id: str, n: int, **spec_kw) -> str:
    store.begin_job(
        JobSpec(
            job_id=job_id,
            instruction="x",
            source="/in",
            source_kind="jsonl",
            retries=1,
            provider_key="p:x",
            **{"concurrency": 10, **spec_kw},
        )
    )
    store.add_items(
        job_id, [NewItem(i, f"i{i}", f"c{i}", f"b2:{job_id}{i}", "", -1, "", 10) for i in range(n)]
    )
    store.finish_job(job_id)
    store.set_state(job_id, RUNNING, from_states=[NOT_STARTED])
    return job_id


def test_a_job_over_its_lowered_concurrency_claims_nothing_until_it_is_under(store):
    job = _items_job(store, "conc0001", 5, concurrency=3)
    for i in range(3):
        assert store.claim_item(job, i, "w1", lease_s=60, max_running=10).index == i
    store.update_job(job, concurrency=1)
    refused = store.claim_item(job, 3, "w1", lease_s=60, max_running=10)
    assert getattr(refused, "reason", None) == "at_capacity", "3 running, 1 allowed"
    refused = _items_job(store, "conc0002", 3)
    for i in range(2):
        store.claim_item(refused, i, "w1", lease_s=60, max_running=10)
    assert store.claim_item(refused, 2, "w1", lease_s=60, max_running=1).reason == "at_capacity"


def test_an_item_that_fits_exactly_beside_what_is_charged_waits_for_reservations(store):
    job = _items_job(store, "fit00001", 3, max_tokens=20)
    assert store.claim_item(job, 0, "w1", lease_s=60, max_running=10).index == 0
    assert store.complete_item(job, 0, "w1", "answer", Usage(5, 5))  # 10 charged
    assert store.claim_item(job, 1, "w1", lease_s=60, max_running=10).index == 1  # 10 + 10 = 20
    refused = store.claim_item(job, 2, "w1", lease_s=60, max_running=10)
    assert refused.reason == "tokens_in_flight", (
        "10 charged + 10 for this item is exactly the limit"
    )
    assert store.get_job(job).state == RUNNING


def test_an_item_that_does_not_fit_beside_what_is_charged_pauses_the_job_and_names_it(store):
    job = _items_job(store, "fit00002", 3, max_tokens=15)
    assert store.claim_item(job, 0, "w1", lease_s=60, max_running=10).index == 0
    assert store.complete_item(job, 0, "w1", "answer", Usage(4, 4))  # 8 charged
    assert store.claim_item(job, 1, "w1", lease_s=60, max_running=10).reason == "token_limit"
    record = store.get_job(job)
    assert (record.state, record.pause_reason) == ("paused", "token limit reached")
    paused = [e for e in store.list_events(job) if e.kind == "paused"]
    assert [e.message for e in paused] == [
        "token limit reached: 8 charged + 10 for item 2 would exceed --max-tokens 15"
    ]
