"""run --sample's rule in the store, on both backends: claims take only the sample's items,
lowest first, whatever the hint; while one runs nothing else is claimed; the claim that finds
them all settled pauses the job and clears the sample (the stateful model holds the same rule
under random steps)."""

from __future__ import annotations

from hermes_bulk.store.protocol import (
    PAUSE_SAMPLE,
    PAUSED,
    Claim,
    ClaimRefused,
    ItemError,
    Usage,
    sample_done,
)

from .test_store_contract import backend, backend_url, claim, make_job, store  # noqa: F401


def test_claims_take_the_sample_lowest_first_and_the_last_settled_pauses_the_job(store):  # noqa: F811
    job_id = make_job(store, 6)
    assert store.set_sample(job_id, [4, 1])
    assert store.get_job(job_id).sample == (1, 4)
    first = claim(store, job_id, hint=0)
    assert isinstance(first, Claim) and first.index == 1, "the sample's lowest, not the hint"
    done, second = store.complete_and_claim(
        job_id, 1, "w1", "one", Usage(1, 1), index_hint=2, lease_s=30, max_running=10
    )
    assert done and isinstance(second, Claim) and second.index == 4, "the chain keeps to it"
    assert claim(store, job_id, hint=0) == ClaimRefused("no_pending"), "4 still runs"
    assert store.fail_item(job_id, 4, "w1", ItemError("PermanentError", "no"))
    assert claim(store, job_id, hint=0) == ClaimRefused("sample_done")
    job = store.get_job(job_id)
    assert (job.state, job.pause_reason, job.sample) == (PAUSED, PAUSE_SAMPLE, None)
    assert (job.completed, job.failed, job.pending) == (1, 1, 4)
    assert store.list_events(job_id)[-1].message == sample_done(2)


def test_a_sample_is_spread_over_the_pending_items_and_can_be_cleared(store):  # noqa: F811
    job_id = make_job(store, 10)
    assert store.sample_pending(job_id, 3) == [0, 4, 9]  # round(4.5) is 4
    taken = claim(store, job_id, hint=0)
    assert store.complete_item(job_id, taken.index, "w1", "zero", Usage(1, 1))
    assert store.sample_pending(job_id, 3) == [1, 5, 9], "over what is still pending"
    assert store.sample_pending(job_id, 50) == list(range(1, 10))
    assert store.set_sample(job_id, [5])
    assert store.set_sample(job_id, None) and store.get_job(job_id).sample is None
    assert claim(store, job_id, hint=7).index == 7, "without a sample the hint is taken"
    assert not store.set_sample("nosuchjob", [1])
