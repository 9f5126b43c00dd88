"""The reservation rule, on both backends, with numbers worked out by hand.

An item reserves its worst case, recorded at create (NewItem.claim_tokens: its input bound
and the request's max_tokens, jobs/bounds.py), and under --max-cost what that costs
(records.reserved_cost with the job's output bound, JobSpec.output_bound). What the job's
answers teach it (JobRecord.output_allowance) changes estimates only, never a claim: a job whose
first answers are short must not reserve short answers for the rest. The rule is written in SQL
(store/sqlite/reservations.py) and Lua (store/redis/lua/claim_item.lua, open_batch.lua); the
stateful model (test_store_stateful.py) holds both to it over random steps, and these cases hold
each at its edges: after learning, at equality, one over, and a refusal that must wait rather
than pause.
"""

from __future__ import annotations

import pytest

from hermes_bulk.fleet import broker
from hermes_bulk.store.protocol import (
    LEARN_AFTER,
    PAUSE_COST_LIMIT,
    PAUSE_TOKEN_LIMIT,
    PAUSED,
    RUNNING,
    Claim,
    ClaimRefused,
    Usage,
    reserved_cost,
)

from .test_store_contract import backend, backend_url, claim, make_job, store  # noqa: F401

#: $1 in, $4 out per million tokens: 1,000 and 4,000 nano-USD a token.
PRICE = {"input": 1.0, "output": 4.0, "cached_input": 0.5, "source": "test"}


def reserved_by_next_claim(store, job_id: str, hint: int) -> int:
    before = store.get_job(job_id).tokens_reserved
    c = claim(store, job_id, hint=hint)
    assert c.index == hint, c
    return store.get_job(job_id).tokens_reserved - before


def answer_first(store, job_id: str, outputs) -> None:
    for i, out in enumerate(outputs):
        c = claim(store, job_id, hint=i)
        assert c.index == i
        assert store.complete_item(job_id, i, "w1", f"answer {i}", Usage(1, out))


def test_learning_changes_the_estimate_but_never_what_a_claim_reserves(store):
    """Three one-token answers teach an output allowance of 1; the next items still reserve
    their recorded worst cases (the bug that let a provider bill $54.66 under --max-cost 10)."""
    worst = [600, 5, 0, 2_100]
    job_id = make_job(
        store,
        LEARN_AFTER + len(worst),
        estimate=[700] * LEARN_AFTER + worst,
        output_tokens_estimate=512,
        max_output_tokens=2_000,
    )
    answer_first(store, job_id, [1] * LEARN_AFTER)
    job = store.get_job(job_id)
    assert job.output_allowance == 2, "learned: twice the mean of 1"
    got = [reserved_by_next_claim(store, job_id, LEARN_AFTER + i) for i in range(len(worst))]
    assert got == worst


def test_complete_and_claim_reserves_the_worst_case_too(store):
    job_id = make_job(store, LEARN_AFTER + 2, estimate=2_600, max_output_tokens=2_000)
    answer_first(store, job_id, [1] * LEARN_AFTER)
    c = claim(store, job_id)
    done, nxt = store.complete_and_claim(
        job_id, c.index, "w1", "r", Usage(50, 1), index_hint=0, lease_s=30.0, max_running=1000
    )
    assert done and isinstance(nxt, Claim)
    assert store.get_job(job_id).tokens_reserved == 2_600


@pytest.mark.parametrize(
    ("max_tokens", "verdict"),
    [
        (350, "claimed"),  # 100 charged + 100 in flight + 150 == the cap: fits
        (349, "tokens_in_flight"),  # one over beside what is in flight: waits
        (250, "tokens_in_flight"),  # fits exactly beside what is charged alone: still waits
        (249, "token_limit"),  # one over beside what is charged alone: pauses
    ],
)
def test_the_token_cap_at_equality_and_one_over(store, max_tokens, verdict):
    """Items of worst case 100, 100, 150: the first answered with 50 + 50 (100 charged), the
    second in flight (100 reserved); the third needs 150. 350 fits; 349 waits (it would fit
    beside what is charged alone: 250 <= 349); 249 pauses (250 > 249)."""
    job_id = make_job(
        store, 3, estimate=[100, 100, 150], max_output_tokens=40, max_tokens=max_tokens
    )
    first = claim(store, job_id, hint=0)
    assert store.complete_item(job_id, first.index, "w1", "a", Usage(50, 50))
    assert claim(store, job_id, hint=1).index == 1
    got = claim(store, job_id, hint=2)
    if verdict == "claimed":
        assert isinstance(got, Claim) and got.index == 2
        assert store.get_job(job_id).tokens_reserved == 250
        return
    assert got == ClaimRefused(verdict)
    job = store.get_job(job_id)
    expected = (PAUSED, PAUSE_TOKEN_LIMIT) if verdict == "token_limit" else (RUNNING, None)
    assert (job.state, job.pause_reason) == expected


# Worst cases of 100 and 150 with max_tokens 40: the output's 40 at 4,000 nano-USD a token, the
# rest at 1,000.
COST, COST3 = reserved_cost(100, 40, 1.0, 4.0), reserved_cost(150, 40, 1.0, 4.0)


def test_the_cost_of_a_worst_case_by_hand():
    assert COST == 60 * 1_000 + 40 * 4_000 == 220_000
    assert COST3 == 110 * 1_000 + 40 * 4_000 == 270_000


@pytest.mark.parametrize(
    ("max_cost", "verdict"),
    [
        (100_000 + COST + COST3, "claimed"),  # spent + in flight + need == the cap: fits
        (100_000 + COST + COST3 - 1, "cost_in_flight"),  # one nano-dollar over: waits
        (100_000 + COST3, "cost_in_flight"),  # fits exactly beside what is spent: still waits
        (100_000 + COST3 - 1, "cost_limit"),  # over beside what is spent alone: pauses
    ],
)
def test_the_cost_cap_at_equality_and_one_over(store, max_cost, verdict):
    """The same in money: the first item spent 100,000 nano-USD, the second holds COST, the
    third needs COST3. SQLite and Redis once disagreed at spent + need == max_cost."""
    job_id = make_job(
        store, 3, estimate=[100, 100, 150], max_output_tokens=40, max_cost=max_cost, price=PRICE
    )
    first = claim(store, job_id, hint=0)
    assert store.complete_item(job_id, first.index, "w1", "a", Usage(5, 5, None, 100_000))
    assert claim(store, job_id, hint=1).index == 1
    got = claim(store, job_id, hint=2)
    if verdict == "claimed":
        assert isinstance(got, Claim) and got.index == 2
        assert store.get_job(job_id).cost_reserved == COST + COST3
        return
    assert got == ClaimRefused(verdict)
    job = store.get_job(job_id)
    expected = (PAUSED, PAUSE_COST_LIMIT) if verdict == "cost_limit" else (RUNNING, None)
    assert (job.state, job.pause_reason) == expected


def test_the_output_bound_is_max_output_tokens_else_the_estimate(store):
    """A job made before every request carried max_tokens reserves its estimate's split."""
    bounded = make_job(store, 1, estimate=100, max_output_tokens=40, max_cost=10**9, price=PRICE)
    older = make_job(store, 1, estimate=100, output_tokens_estimate=10, max_cost=10**9, price=PRICE)
    claim(store, bounded)
    claim(store, older)
    assert store.get_job(bounded).cost_reserved == COST
    assert store.get_job(older).cost_reserved == reserved_cost(100, 10, 1.0, 4.0) == 130_000


def test_a_job_keeps_the_sum_of_the_worst_cases_it_will_ask(store):
    """worst_tokens sums what the items to ask reserve (NewItem.claim_tokens), as
    estimated_tokens sums their expected tokens; a repeat of an item is not asked."""
    job_id = make_job(
        store,
        3,
        contents=["a", "b", "a"],
        answer_keys=["k1", "k2", "k1"],
        estimate=10,
        worst=[300, 500, 300],
    )
    job = store.get_job(job_id)
    assert (job.estimated_tokens, job.worst_tokens) == (20, 800)
    assert reserved_by_next_claim(store, job_id, 1) == 500


def test_an_answer_without_usage_is_charged_what_its_claim_held(store):
    """No bill said: the item is charged its worst case, in tokens and, under --max-cost, in
    money (the estimate it was priced at is less), so the cap still holds. With usage reported,
    what is reported."""
    job_id = make_job(store, 2, estimate=100, max_output_tokens=40, max_cost=10**9, price=PRICE)
    for index, usage in ((0, Usage(None, None, None, 5_000)), (1, Usage(3, 4, None, 5_000))):
        assert claim(store, job_id, hint=index).index == index
        assert store.complete_item(job_id, index, "w1", "a", usage)
    job = store.get_job(job_id)
    assert (job.tokens_charged, job.cost_nusd, job.cost_reserved) == (100 + 7, COST + 5_000, 0)


def test_a_redis_job_begun_before_its_meta_held_the_output_bound_reads_it_from_its_spec(
    redis_url, raw
):
    """A job begun by an older version keeps max_output_tokens and output_tokens_estimate in its
    spec only (_job.lua's output_bound): its claims reserve as the fields would have had them."""
    backend = broker.build_backend(redis_url)
    try:
        store = backend.store
        bounded = make_job(
            store, 1, estimate=100, max_output_tokens=40, max_cost=10**9, price=PRICE
        )
        older = make_job(
            store, 1, estimate=100, output_tokens_estimate=10, max_cost=10**9, price=PRICE
        )
        for job_id in (bounded, older):
            meta = store.keys.job(job_id)[0]
            assert raw.hdel(meta, "max_output_tokens", "output_tokens_estimate") >= 1
            claim(store, job_id)
        assert store.get_job(bounded).cost_reserved == COST
        assert store.get_job(older).cost_reserved == reserved_cost(100, 10, 1.0, 4.0)
    finally:
        backend.close()


@pytest.mark.parametrize("nusd", [1, 2])
def test_a_reservation_of_a_nano_dollar_or_two_is_held_and_given_back_whole(store, nusd):  # noqa: F811
    """The smallest reservations: one item of one token at $0.001 or $0.002 a million."""
    price = {"input": 0.001 * nusd, "output": 0.001 * nusd, "cached_input": 0.0, "source": "t"}
    job_id = make_job(store, 2, estimate=1, max_output_tokens=1, max_cost=10**9, price=price)
    assert reserved_cost(1, 1, 0.001 * nusd, 0.001 * nusd) == nusd
    taken = claim(store, job_id)
    assert store.get_job(job_id).cost_reserved == nusd
    assert store.release_item(job_id, taken.index, "w1")
    assert store.get_job(job_id).cost_reserved == 0, "given back whole"
