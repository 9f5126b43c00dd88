"""A claim's lease on SQLite, on a clock the test sets: it lasts exactly lease_s from the claim.

The contract suite checks lease expiry on the real clock with short leases; here a lease of
half a minute is seen to hold until its end and to end then, without waiting for it.
"""

from __future__ import annotations

import pytest

from hermes_bulk import broker
from hermes_bulk.store.protocol import NOT_STARTED, PENDING, RUNNING, JobSpec, NewItem


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
    b = broker._build(f"sqlite:///{tmp_path / 'bulk.db'}")
    b.store.db.clock = clock
    yield b.store
    b.close()


def _job(store) -> str:
    store.begin_job(JobSpec(job_id="lease0001", instruction="x", source="/in", source_kind="jsonl",
                            concurrency=10, retries=1, provider_key="p:x"))
    store.add_items("lease0001", [NewItem(i, f"i{i}", f"c{i}", f"b2:{i}", "", -1, "", 10) for i in range(2)])
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
