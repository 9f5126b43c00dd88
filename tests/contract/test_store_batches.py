"""The store's batch operations (protocol.open_batch … release_batch_items), on both backends."""

from __future__ import annotations

import tracemalloc

import pytest

from hermes_bulk.fleet import broker
from hermes_bulk.fleet.liveness import Liveness
from hermes_bulk.store.protocol import (
    BATCH_DONE,
    BATCH_PREPARING,
    PAUSE_TOKEN_LIMIT,
    PAUSED,
    BatchRecord,
    ClaimRefused,
    ItemError,
    Usage,
    WorkerInfo,
)

from ..helpers import wait_for
from .test_store_contract import BACKENDS, claim, make_job


@pytest.fixture(params=BACKENDS)
def store(request, tmp_path):
    url = (
        f"sqlite:///{tmp_path / 'bulk.db'}"
        if request.param == "sqlite"
        else request.getfixturevalue("redis_url")
    )
    b = broker.build_backend(url)
    yield b.store
    b.close()


def _open(store, job_id, worker="w1", bid="b1", n=1000, lease_s=30.0):
    return store.open_batch(job_id, worker, batch_id=bid, max_items=n, lease_s=lease_s, hold_s=3600)


def test_a_batch_takes_pending_items_and_its_owner_completes_them_through_the_item_steps(store):
    job_id = make_job(store, 10)
    batch = _open(store, job_id, n=4)
    assert isinstance(batch, BatchRecord) and batch.items == 4 and batch.status == BATCH_PREPARING
    job = store.get_job(job_id)
    assert (job.pending, job.running, job.tokens_reserved) == (6, 4, 40)
    assert [it.index for it in store.iter_batch_items(job_id, "b1", page=3)] == [0, 1, 2, 3]
    assert store.iter_batch_items(job_id, "b1").__next__().content == "content 0"
    assert store.complete_item(job_id, 0, batch.owner, "r0", Usage(3, 4))
    assert not store.complete_item(job_id, 0, batch.owner, "again", Usage(3, 4)), (
        "a result is written once"
    )
    assert (
        store.record_attempt(
            job_id, 1, batch.owner, ItemError("TransientModelError", "x"), rate_limited=False
        )
        == 1
    )
    assert store.release_item(job_id, 1, batch.owner)
    assert store.fail_item(job_id, 2, batch.owner, ItemError("PermanentModelError", "no"))
    assert store.release_batch_items(job_id, "b1") == 1
    job = store.get_job(job_id)
    assert (job.pending, job.running, job.completed, job.failed, job.tokens_reserved) == (
        8,
        0,
        1,
        1,
        0,
    )
    assert job.tokens_charged == 7
    # A live claim takes the items a batch gave back: batch items are never a dead worker's.
    assert claim(store, job_id).index == 1


def test_one_batch_is_prepared_at_a_time_and_an_expired_lease_is_taken_over(store):
    job_id = make_job(store, 10)
    first = _open(store, job_id, "w1", "b1", n=3, lease_s=0.3)
    assert _open(store, job_id, "w2", "b2") == ClaimRefused("batch_preparing")
    wait_for(
        lambda: store.now() > first.lease_until,
        timeout=10,
        interval=0.01,
        message="the batch's lease to end by the store's clock",
    )
    taken = _open(store, job_id, "w2", "b2")
    assert taken.batch_id == first.batch_id and taken.lease_owner == "w2" and taken.items == 3
    assert store.update_batch(job_id, "b1", "w1", provider_id="x") is None, (
        "only the lease holder writes"
    )
    done = store.update_batch(
        job_id, "b1", "w2", provider_id="batch_1", status="in_progress", submitted_at=5.0
    )
    assert done.provider_id == "batch_1" and done.status == "in_progress"
    second = _open(store, job_id, "w1", "b3", n=100)
    assert second.batch_id == "b3" and second.items == 7
    assert store.batch_job_ids() == [job_id]
    assert store.lease_batch(job_id, "b3", "w2", lease_s=30) is None, "w1 holds it"
    assert store.lease_batch(job_id, "b3", "w1", lease_s=30).lease_owner == "w1"
    assert [b.batch_id for b in store.list_batches(job_id)] == ["b1", "b3"]
    assert (
        store.update_batch(
            job_id, "b1", "w2", status=BATCH_DONE, final_status="expired"
        ).lease_owner
        is None
    )
    assert store.update_batch(job_id, "b3", "w1", status=BATCH_DONE).lease_owner is None
    # The provider's status at its end is kept beside "done"; a batch recorded without it has none.
    assert [(b.status, b.final_status) for b in store.list_batches(job_id)] == [
        (BATCH_DONE, "expired"),
        (BATCH_DONE, None),
    ]
    assert store.batch_job_ids() == []
    assert store.lease_batch(job_id, "b1", "w1", lease_s=30) is None, (
        "a done batch is not leased again"
    )
    assert _open(store, job_id, bid="b4") == ClaimRefused("no_pending")


def test_a_batch_reserves_tokens_and_the_job_pauses_before_one_would_go_over(store):
    job_id = make_job(store, 10, max_tokens=35)
    batch = _open(store, job_id)
    assert batch.items == 3 and store.get_job(job_id).tokens_reserved == 30
    assert _open(store, job_id, "w2", "b2") == ClaimRefused("batch_preparing")
    store.update_batch(job_id, "b1", "w1", status="in_progress")
    assert _open(store, job_id, "w1", "b2") == ClaimRefused("tokens_in_flight")
    for i in range(3):
        store.complete_item(job_id, i, batch.owner, "r", Usage(5, 5))
    assert _open(store, job_id, "w1", "b2") == ClaimRefused("token_limit")
    job = store.get_job(job_id)
    assert (job.state, job.pause_reason) == (PAUSED, PAUSE_TOKEN_LIMIT)


def test_a_batch_reads_its_items_contents_as_text_however_they_are_stored(store):
    """Contents of 64 characters and more are stored compressed; a batch's file is
    written from iter_batch_items, so it must give the text back, as a claim does."""
    long = "a long item, compressed in the store: " + "lorem ipsum " * 20
    job_id = make_job(store, 2, contents=["short", long])
    _open(store, job_id)
    assert [it.content for it in store.iter_batch_items(job_id, "b1")] == ["short", long]


def test_refusals_and_delete_takes_the_batches(store):
    job_id = make_job(store, 2, state=None)
    assert _open(store, job_id) == ClaimRefused("not_running")
    assert _open(store, "nope") == ClaimRefused("no_job")
    job_id = make_job(store, 2)
    _open(store, job_id)
    assert store.delete_job(job_id)
    assert store.list_batches(job_id) == [] and store.batch_job_ids() == []


def test_a_lease_held_by_a_worker_found_dead_is_taken_at_once_and_only_from_it(store):
    """take_from: a batch leased to a worker the caller found dead is taken without
    waiting for the lease to run out; naming any other worker takes nothing."""
    job_id = make_job(store, 10)
    first = _open(store, job_id, "w1", "b1", n=3, lease_s=3600)
    assert store.open_batch(
        job_id, "w2", batch_id="b2", max_items=5, lease_s=60, hold_s=3600, take_from="w3"
    ) == ClaimRefused("batch_preparing"), "w1 is not the one found dead"
    taken = store.open_batch(
        job_id, "w2", batch_id="b2", max_items=5, lease_s=60, hold_s=3600, take_from="w1"
    )
    assert (taken.batch_id, taken.lease_owner, taken.items) == (first.batch_id, "w2", 3)
    assert store.get_job(job_id).running == 3, "taken over as it is: no item taken twice"
    store.update_batch(job_id, "b1", "w2", provider_id="batch_1", status="in_progress")
    assert store.lease_batch(job_id, "b1", "w1", lease_s=30) is None, "w2's lease, unexpired"
    assert store.lease_batch(job_id, "b1", "w3", lease_s=30, take_from="w1") is None, (
        "w1 no longer holds it"
    )
    got = store.lease_batch(job_id, "b1", "w3", lease_s=30, take_from="w2")
    assert got.lease_owner == "w3" and got.provider_id == "batch_1"
    assert store.update_batch(job_id, "b1", "w2", completed=1) is None, (
        "the dead worker writes nothing after"
    )


def _peak_bytes(read) -> int:
    tracemalloc.start()
    try:
        read()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_who_is_live_is_read_without_the_items_batches_hold(store, tmp_path, request):
    """Liveness asks every maintenance pass (and status at every call): reading there every
    running item, a batch's 50,000 too, made a --batch worker's RSS grow with its batches
    (benchmarks, row 12). The items a worker holds are read only when asked for, and a batch's
    never (it is no worker)."""
    job_id = make_job(store, 5001)
    store.heartbeat_worker(WorkerInfo("w1", "h", 1, store.now(), 0.0, 4), ttl_s=30)
    held = claim(store, job_id, worker="w1")
    assert _open(store, job_id, n=5000).items == 5000
    assert [w.holding for w in store.live_workers()] == [[(job_id, held.index)]]
    assert [(w.worker_id, w.holding) for w in store.live_workers(holding=False)] == [("w1", [])]
    liveness = Liveness(store, tmp_path / "workers")
    assert liveness.live_worker_ids() == {"w1"}
    assert store.item_owners() == {"w1": 1, "batch:b1": 5000}
    # Reading the 5,000 batch items took about 1.5 MB (a row and its tuple each); the registry
    # alone, and the owners counted by the store, a few KB.
    assert _peak_bytes(liveness.live_worker_ids) < 256 * 1024
    assert _peak_bytes(store.item_owners) < 256 * 1024
    if (
        request.node.callspec.params["store"] == "sqlite"
    ):  # Redis reads the holdings job by job, from each job's owners hash
        assert _peak_bytes(store.live_workers) < 256 * 1024
