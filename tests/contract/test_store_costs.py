"""What items cost, summed by the store in nano-USD on both backends: exactly, past the 14
significant digits a Lua number reaches Redis with; cached input tokens; and what a job that
reuses an answer saved (the answer index keeps each answer's cost)."""

from __future__ import annotations

from hermes_bulk.store.protocol import Usage

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
