"""A run --sample survives every reason a job pauses, on both backends: the user's pause, the
token and cost caps (each paused inside a claim), the endpoint breaker's pause; after the resume
claims take the sample's items only. tests/test_sample.py holds the user's pause, a worker's
death and the cost cap end to end; these are their neighbours in the store."""

from __future__ import annotations

import pytest

from hermes_bulk.runtime.breaker import pause_job
from hermes_bulk.store.protocol import (
    PAUSE_COST_LIMIT,
    PAUSE_TOKEN_LIMIT,
    PAUSE_USER,
    PAUSED,
    RUNNING,
    Claim,
    ClaimRefused,
    Usage,
)
from hermes_bulk.store.records import reserved_cost

from .test_reservation_rule import PRICE
from .test_store_contract import backend, backend_url, claim, make_job, store  # noqa: F401

ENDPOINT_REASON = "the endpoint http://e/v1 refused the API key this job was created with"
COST = reserved_cost(100, 40, 1.0, 4.0)  # the worst case of each item, at PRICE


def _paused(store, job_id, reason):  # noqa: F811
    """Pause the job for `reason` the way the product does; the first item is answered."""
    first = claim(store, job_id, hint=0)
    assert first.index == 2, "the sample's lowest"
    assert store.complete_item(job_id, 2, "w1", "a", Usage(50, 50, None, COST))
    if reason in (PAUSE_TOKEN_LIMIT, PAUSE_COST_LIMIT):  # the next sampled item does not fit
        want = "token_limit" if reason == PAUSE_TOKEN_LIMIT else "cost_limit"
        assert claim(store, job_id, hint=0) == ClaimRefused(want)
    elif reason == PAUSE_USER:
        assert store.set_state(job_id, PAUSED, from_states=[RUNNING], pause_reason=PAUSE_USER)
    else:
        pause_job(store, job_id, reason)
    job = store.get_job(job_id)
    assert (job.state, job.pause_reason) == (PAUSED, reason)
    return job


@pytest.mark.parametrize("reason", [PAUSE_USER, PAUSE_TOKEN_LIMIT, PAUSE_COST_LIMIT, "endpoint"])
def test_a_sample_survives_each_pause_and_the_resume_takes_its_items_only(store, reason):  # noqa: F811
    reason = ENDPOINT_REASON if reason == "endpoint" else reason
    # Items of worst case 100 tokens: the caps fit one answered item, not a second beside it.
    caps = {PAUSE_TOKEN_LIMIT: {"max_tokens": 150}, PAUSE_COST_LIMIT: {"max_cost": COST * 3 // 2}}
    job_id = make_job(
        store, 6, estimate=100, max_output_tokens=40, price=PRICE, **caps.get(reason, {})
    )
    assert store.set_sample(job_id, [2, 4, 5])
    assert _paused(store, job_id, reason).sample == (2, 4, 5), "the sample is still there"
    assert store.set_state(
        job_id, RUNNING, from_states=[PAUSED], max_tokens=10_000, max_cost=100 * COST
    )
    taken = [claim(store, job_id, hint=0), claim(store, job_id, hint=0)]
    assert all(isinstance(c, Claim) for c in taken)
    assert [c.index for c in taken] == [4, 5], "the rest of the sample, no other item"
    assert claim(store, job_id, hint=0) == ClaimRefused("no_pending")
