"""What items cost, summed by the store in nano-USD on both backends: exactly, past the 14
significant digits a Lua number reaches Redis with; cached input tokens; and what a job that
reuses an answer saved (the answer index keeps each answer's cost)."""

from __future__ import annotations

from hermes_bulk.store.protocol import FAILED, PENDING, ItemError, Usage

from .test_store_contract import backend, backend_url, claim, make_job, store  # noqa: F401

BIG = 10**17 + 7  #: a hundred million dollars and 7 nano-dollars: past a double


def test_costs_add_up_exactly_and_a_reused_answer_counts_as_saved(store):  # noqa: F811
    keys = ["ab" * 16, "cd" * 16]
    job_id = make_job(store, 2, answer_keys=keys)
    for i, (cost, listed) in enumerate(((BIG, 2 * BIG + 1), (3, 5))):
        taken = claim(store, job_id, hint=i)
        usage = Usage(100, 10, 40, cost_nusd=cost, list_nusd=listed, tokens_written=20 + i * 10)
        assert store.complete_item(job_id, taken.index, "w1", f"answer {i}", usage)
    job = store.get_job(job_id)
    assert (job.cost_nusd, job.list_nusd, job.tokens_cached) == (BIG + 3, 2 * BIG + 6, 80)
    assert job.tokens_written == 50, "prompt-cache writes are summed apart from reads"

    again = make_job(store, 2, answer_keys=keys)
    reused = store.get_job(again)
    assert (reused.reused, reused.saved_nusd, reused.cost_nusd) == (2, BIG + 3, 0)


def _item(store, job_id, index):  # noqa: F811
    """One item's record as the exports read it."""
    return next(i for i in store.iter_items(job_id) if i.index == index)


def test_an_answer_not_kept_is_charged_to_the_job_and_apart_and_to_its_item(store):  # noqa: F811
    """What the provider billed for a truncated or invalid answer: the job's charge and cost,
    shown apart (unkept), and the item's figures, whether the item goes back to pending, fails
    at its last retry or fails at once; the item's kept answer adds to what it was billed."""
    job_id = make_job(store, 3)  # retries=2
    cut = Usage(7, 64, cost_nusd=BIG, list_nusd=2 * BIG)  # past a double: summed exactly
    off = Usage(5, 9, cost_nusd=11, list_nusd=13)
    error = ItemError("InvalidAnswer", "the answer does not match --schema", 200)

    taken = claim(store, job_id, hint=0)
    assert store.settle_failed_attempt(job_id, 0, "w1", error, retries=2, usage=off) == 1
    assert _item(store, job_id, 0).status == PENDING, "within its retries: back to pending"
    taken = claim(store, job_id, hint=0)
    assert taken.index == 0 and taken.attempts == 1
    assert store.complete_item(job_id, 0, "w1", "kept", Usage(3, 4, cost_nusd=5, list_nusd=6))
    kept = _item(store, job_id, 0)
    assert (kept.tokens_in, kept.tokens_out, kept.cost_nusd) == (8, 13, 16), "both attempts"

    claim(store, job_id, hint=1)
    assert store.fail_item(job_id, 1, "w1", ItemError("Truncated", "cut", 200), usage=cut)
    failed = _item(store, job_id, 1)
    assert (failed.status, failed.tokens_in, failed.tokens_out, failed.cost_nusd) == (
        FAILED,
        7,
        64,
        BIG,
    )
    claim(store, job_id, hint=2)
    assert store.settle_failed_attempt(job_id, 2, "w1", error, retries=0, usage=off) == 1
    assert _item(store, job_id, 2).status == FAILED, "past its retries: failed, and charged"
    # Not the owner: nothing is charged; a usage that reports nothing charges nothing.
    assert not store.fail_item(job_id, 2, "w1", error, usage=off)
    assert store.settle_failed_attempt(job_id, 2, "w1", error, retries=2, usage=off) == -1

    job = store.get_job(job_id)
    unkept_tokens = 7 + 64 + 2 * (5 + 9)
    assert (job.tokens_unkept, job.cost_unkept) == (unkept_tokens, BIG + 22)
    assert job.tokens_charged == unkept_tokens + 3 + 4
    assert (job.cost_nusd, job.list_nusd) == (BIG + 22 + 5, 2 * BIG + 26 + 6)
    assert (job.tokens_in, job.tokens_out) == (3, 4), "the kept answers' (the learned allowance)"
    assert (job.completed, job.failed, job.running, job.tokens_reserved) == (1, 2, 0, 0)

    other = make_job(store, 1)
    claim(store, other)
    assert store.fail_item(other, 0, "w1", error, usage=Usage(cost_nusd=0))
    nothing = store.get_job(other)
    assert (nothing.tokens_unkept, nothing.cost_unkept, nothing.tokens_charged) == (0, 0, 0)
