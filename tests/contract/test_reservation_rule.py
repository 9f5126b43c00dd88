"""The reservation rule, on both backends, with numbers worked out by hand.

What a claim reserves for an item is written in three places that must agree: the SQL of
SQLite's claim (store/sqlite/jobs.py), JobRecord.output_allowance and reservation in Python
(store/records.py: SQLite's refusals, status), and reservation() in Lua (store/redis/lua/
_job.lua). Each copy names the others; the stateful model (test_store_stateful.py) holds them
equal over random steps, and these cases hold each to the rule at its edges, where random steps
rarely go: the third completion that starts learning, a mean that is not a whole number, an
estimate below the learned allowance, the output cap, and a refusal that must wait rather than
pause.

The rule: until LEARN_AFTER items are answered with output reported, an item reserves its
estimate. Then the learned allowance (twice their mean output, rounded up, at most
max_output_tokens) takes the place of the configured one in the estimate, and an item reserves
max(estimate + learned - configured, min(learned, estimate)).
"""

from __future__ import annotations

import pytest

from hermes_bulk.store.protocol import LEARN_AFTER, PAUSE_TOKEN_LIMIT, PAUSED, RUNNING, Usage

from .test_store_contract import backend, backend_url, claim, make_job, store  # noqa: F401

# Three answers of 7, 8 and 8 output tokens (1 input token each): a mean of 7.67, so the learned
# allowance is 2 * 23 / 3 = 15.33, rounded up to 16 (15 when rounded down).
OUTPUTS = (7, 8, 8)
CHARGED = sum(OUTPUTS) + len(OUTPUTS)


def reserved_by_next_claim(store, job_id: str, hint: int) -> int:
    before = store.get_job(job_id).tokens_reserved
    c = claim(store, job_id, hint=hint)
    assert c.index == hint, c
    return store.get_job(job_id).tokens_reserved - before


def answer_first(store, job_id: str, n: int) -> None:
    for i in range(n):
        c = claim(store, job_id, hint=i)
        assert c.index == i
        assert store.complete_item(job_id, i, "w1", f"answer {i}", Usage(1, OUTPUTS[i]))


def test_learning_starts_at_the_third_answer():
    assert len(OUTPUTS) == LEARN_AFTER  # the cases below are worked out for three


@pytest.mark.parametrize(
    ("cap", "estimates", "expected"),
    [
        # configured allowance 512: an estimate of 600 is 88 of input; 16 takes the 512's place
        (None, [600, 5, 0, 100, 513], [104, 5, 0, 16, 17]),
        # capped at 10 output tokens: the learned 16 becomes 10
        (10, [600, 5, 0, 100, 513], [98, 5, 0, 10, 11]),
    ],
    ids=["uncapped", "capped"],
)
def test_a_claim_after_learning_reserves_what_the_rule_says(store, cap, estimates, expected):
    job_id = make_job(
        store,
        len(OUTPUTS) + len(estimates),
        estimate=[1] * len(OUTPUTS) + estimates,
        output_tokens_estimate=512,
        max_output_tokens=cap,
    )
    answer_first(store, job_id, len(OUTPUTS))
    start = len(OUTPUTS)
    got = [reserved_by_next_claim(store, job_id, start + i) for i in range(len(estimates))]
    assert got == expected


def test_before_the_third_answer_an_item_reserves_its_estimate(store):
    job_id = make_job(store, 4, estimate=[1, 1, 600, 5], output_tokens_estimate=512)
    answer_first(store, job_id, 2)
    assert [reserved_by_next_claim(store, job_id, i) for i in (2, 3)] == [600, 5]


def refused_after_learning(store, max_tokens: int) -> tuple[str, object]:
    """Items of estimates 1, 1, 1, 8, 5: the first four claimed before learning (11 reserved),
    the first three answered (26 charged, 8 left in flight); then the claim of the fifth."""
    job_id = make_job(
        store, 5, estimate=[1, 1, 1, 8, 5], output_tokens_estimate=512, max_tokens=max_tokens
    )
    for i in range(4):
        assert claim(store, job_id, hint=i).index == i
    for i in range(3):
        assert store.complete_item(job_id, i, "w1", f"answer {i}", Usage(1, OUTPUTS[i]))
    return job_id, claim(store, job_id, hint=4)


def test_a_refused_claim_waits_when_the_item_fits_beside_what_is_charged(store):
    """Charged 26, item 3 in flight (8 reserved before learning), --max-tokens 36: the next item
    (estimate 5) reserves min(16, 5) = 5 and does not fit beside the 8 in flight (39), but fits
    beside what is charged alone (31), so the claim waits and the job keeps running. Reserving
    the learned 16 instead would pause it (42 > 36)."""
    job_id, refused = refused_after_learning(store, CHARGED + 10)
    assert getattr(refused, "reason", None) == "tokens_in_flight", refused
    assert store.get_job(job_id).state == RUNNING


def test_a_refused_claim_pauses_when_the_item_would_not_fit_beside_what_is_charged(store):
    """As above with --max-tokens 30: 26 charged + 5 > 30, so the job pauses at its limit."""
    job_id, refused = refused_after_learning(store, CHARGED + 4)
    assert getattr(refused, "reason", None) == "token_limit", refused
    job = store.get_job(job_id)
    assert (job.state, job.pause_reason) == (PAUSED, PAUSE_TOKEN_LIMIT)
