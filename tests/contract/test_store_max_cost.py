"""--max-cost in the store, on both backends: what a claim reserves in money, when it waits and
when the job pauses, and that every way an item leaves its run gives its reservation back.

The rule (protocol.claim_item) is --max-tokens' in nano-USD: an item reserves
records.reserved_cost of its token reservation at the job's price (the output allowance's share
at the output rate, the rest at the input rate, rounded up); a claim waits (cost_in_flight)
while spent + reserved + that would exceed the limit and spent + that would not, and pauses the
job (PAUSE_COST_LIMIT, cost_limit) when spent + that alone would. What an item spent is the
cost its completion reports (Usage.cost_nusd). The numbers below are worked out by hand.
"""

from __future__ import annotations

import pytest

from hermes_bulk.store.protocol import (
    PAUSE_COST_LIMIT,
    PAUSE_TOKEN_LIMIT,
    PAUSED,
    RUNNING,
    BatchRecord,
    Claim,
    ClaimRefused,
    ItemError,
    Usage,
    cost_limit_reached,
    reserved_cost,
)

from .test_store_contract import backend, backend_url, claim, make_job, store  # noqa: F401

# $1 in, $4 out per million tokens: 1,000 and 4,000 nano-USD a token.
PRICE = {"input": 1.0, "output": 4.0, "cached_input": 0.5, "source": "test"}
# An item estimated at 100 tokens, 20 of them the output allowance: 80 * 1,000 + 20 * 4,000.
ESTIMATE, ALLOWANCE, NEED = 100, 20, 160_000


def priced_job(store, n: int, max_cost: int | None, **kw) -> str:
    kw.setdefault("price", PRICE)
    return make_job(
        store, n, estimate=ESTIMATE, output_tokens_estimate=ALLOWANCE, max_cost=max_cost, **kw
    )


def held(store, job_id: str) -> tuple[int, int]:
    job = store.get_job(job_id)
    return job.cost_nusd, job.cost_reserved


def test_the_rule_by_hand():
    assert reserved_cost(ESTIMATE, ALLOWANCE, 1.0, 4.0) == NEED
    assert reserved_cost(10, ALLOWANCE, 1.0, 4.0) == 40_000, "all of a small estimate is output"
    assert reserved_cost(1, 0, 0.15, 0.6) == 150
    assert reserved_cost(3, 1, 0.0375, 0.15) == 225, "2 * 37.5 + 150"
    assert reserved_cost(1, 0, 1e-7, 0) == 1, "a fraction of a nano-dollar is rounded up"


def test_claims_reserve_their_cost_wait_for_it_and_pause_on_what_is_spent(store):
    job_id = priced_job(store, 6, 500_000)
    first = [claim(store, job_id) for _ in range(3)]
    assert all(isinstance(c, Claim) for c in first)
    assert held(store, job_id) == (0, 3 * NEED)
    # 480,000 reserved + 160,000 would exceed 500,000; nothing is spent: the item waits.
    assert claim(store, job_id) == ClaimRefused("cost_in_flight")
    assert store.get_job(job_id).state == RUNNING
    # A completion spends what its usage cost, and gives back what its claim reserved.
    assert store.complete_item(job_id, first[0].index, "w1", "a", Usage(5, 5, None, 100_000))
    assert held(store, job_id) == (100_000, 2 * NEED)
    assert claim(store, job_id) == ClaimRefused("cost_in_flight"), "100,000 + 480,000 > 500,000"
    assert store.complete_item(job_id, first[1].index, "w1", "b", Usage(5, 5, None, 300_000))
    assert held(store, job_id) == (400_000, NEED)
    # 400,000 spent + 160,000 > 500,000 whatever settles: the job pauses, in the same step.
    assert claim(store, job_id) == ClaimRefused("cost_limit")
    job = store.get_job(job_id)
    assert (job.state, job.pause_reason, job.pending, job.running) == (
        PAUSED,
        PAUSE_COST_LIMIT,
        3,
        1,
    )
    (event,) = [e for e in store.list_events(job_id) if e.kind == "paused"]
    assert event.message == (
        "cost limit reached: $0.0004 spent + $0.00016 for item 4 would exceed --max-cost $0.0005"
    )
    assert event.item_index == 3
    # A larger limit (resume --max-cost) lets it go on, holding the new limit.
    assert store.set_state(job_id, RUNNING, from_states=[PAUSED], max_cost=10**6)
    assert store.get_job(job_id).spec.max_cost == 10**6
    assert isinstance(claim(store, job_id), Claim)
    assert held(store, job_id) == (400_000, 2 * NEED)


def test_an_item_that_fits_exactly_is_claimed(store):
    job_id = priced_job(store, 3, 2 * NEED)
    assert isinstance(claim(store, job_id), Claim)
    assert isinstance(claim(store, job_id), Claim), "spent + reserved + need == the limit"
    assert claim(store, job_id) == ClaimRefused("cost_in_flight")


def test_a_first_item_over_the_limit_pauses_at_once_with_what_it_would_cost(store):
    job_id = priced_job(store, 2, NEED - 1)
    assert claim(store, job_id) == ClaimRefused("cost_limit")
    (event,) = [e for e in store.list_events(job_id) if e.kind == "paused"]
    assert event.message == (
        "cost limit reached: $0.00 spent + $0.00016 for item 1 would exceed --max-cost $0.000159999"
    )


def test_a_token_pause_comes_before_a_cost_one(store):
    job_id = priced_job(store, 2, NEED - 1, max_tokens=ESTIMATE - 1)
    assert claim(store, job_id) == ClaimRefused("token_limit")
    assert store.get_job(job_id).pause_reason == PAUSE_TOKEN_LIMIT


@pytest.mark.parametrize("max_tokens", [ESTIMATE, ESTIMATE + 1, 10**6])
def test_a_token_cap_the_item_fits_leaves_the_cost_cap_to_pause(store, max_tokens):  # noqa: F811
    """The neighbours: the item fits --max-tokens exactly, with a token to spare, far under it;
    the cost does not fit, and the job pauses for the cost."""
    job_id = priced_job(store, 2, NEED - 1, max_tokens=max_tokens)
    assert claim(store, job_id) == ClaimRefused("cost_limit")
    assert store.get_job(job_id).pause_reason == PAUSE_COST_LIMIT


def test_without_a_limit_nothing_is_reserved_in_money(store):
    job_id = priced_job(store, 3, None)
    c = claim(store, job_id)
    assert isinstance(c, Claim) and held(store, job_id) == (0, 0)
    assert store.complete_item(job_id, c.index, "w1", "a", Usage(1, 1, None, 7))
    assert held(store, job_id) == (7, 0)


def test_every_way_out_of_a_run_gives_the_cost_reservation_back(store):
    job_id = priced_job(store, 6, 10**9)
    error = ItemError("TransientError", "it broke", 503)
    c = [claim(store, job_id, worker="w1") for _ in range(3)]
    c += [claim(store, job_id, worker="w2"), claim(store, job_id, lease_s=-1.0)]
    assert all(isinstance(x, Claim) for x in c)
    assert held(store, job_id) == (0, 5 * NEED)
    assert store.fail_item(job_id, c[0].index, "w1", error)
    assert held(store, job_id) == (0, 4 * NEED)
    assert store.release_item(job_id, c[1].index, "w1")
    assert held(store, job_id) == (0, 3 * NEED)
    assert store.settle_failed_attempt(job_id, c[2].index, "w1", error, retries=5) == 1
    assert held(store, job_id) == (0, 2 * NEED)
    assert store.release_worker_items("w2")
    assert held(store, job_id) == (0, NEED)
    assert store.release_expired_leases() == {job_id: 1}
    job = store.get_job(job_id)
    assert (job.cost_reserved, job.tokens_reserved, job.running) == (0, 0, 0)
    # Claimed again after all that, an item reserves as the first time.
    assert isinstance(claim(store, job_id), Claim) and held(store, job_id) == (0, NEED)


def test_a_batch_reserves_at_the_batch_price_and_a_live_claim_at_the_list_price(store):
    batch = {"input": 0.5, "output": 2.0, "cached_input": 0.25, "source": "test, batch"}
    job_id = priced_job(store, 8, 5 * NEED // 2, price=batch, list_price=PRICE, mode="batch")
    opened = store.open_batch(
        job_id, "w1", batch_id="b1", max_items=100, lease_s=60.0, hold_s=600.0
    )
    # At the batch price an item reserves 80,000: five fit under 400,000, not six.
    assert isinstance(opened, BatchRecord) and opened.items == 5
    assert held(store, job_id) == (0, 5 * NEED // 2)
    # The batch is held; a live claim (past --batch-deadline) reserves at the list price.
    store.release_item(job_id, 0, "batch:b1")
    store.release_item(job_id, 1, "batch:b1")
    assert held(store, job_id) == (0, 3 * NEED // 2)
    live = claim(store, job_id, hint=0)
    assert isinstance(live, Claim) and held(store, job_id) == (0, 3 * NEED // 2 + NEED)
    assert claim(store, job_id, hint=1) == ClaimRefused("cost_in_flight")


def test_a_batch_that_does_not_fit_its_first_item_waits_or_pauses(store):
    job_id = priced_job(store, 4, NEED + NEED // 2)
    assert isinstance(claim(store, job_id), Claim)
    opened = store.open_batch(job_id, "w1", batch_id="b1", max_items=10, lease_s=60.0, hold_s=60.0)
    assert opened == ClaimRefused("cost_in_flight")
    assert store.complete_item(job_id, 0, "w1", "a", Usage(1, 1, None, NEED))
    opened = store.open_batch(job_id, "w1", batch_id="b2", max_items=10, lease_s=60.0, hold_s=60.0)
    assert opened == ClaimRefused("cost_limit")
    assert store.get_job(job_id).pause_reason == PAUSE_COST_LIMIT


@pytest.mark.parametrize(
    ("rates", "estimates", "allowance"),
    [
        ((0.15, 0.6), [1, 7, 333, 4097], 13),
        ((0.0375, 0.15), [3, 1000, 999_999], 7),
        ((1e-5, 9999.999), [1, 2, 3, 10**6], 1),
        ((0.1, 0.2), [3, 30, 300], 3),  # 0.1 + 0.2 is not 0.3 in a double
    ],
)
def test_both_backends_reserve_what_the_rule_says_to_the_nano_dollar(
    store, rates, estimates, allowance
):
    price = {"input": rates[0], "output": rates[1], "cached_input": rates[0], "source": "t"}
    job_id = make_job(
        store,
        len(estimates),
        estimate=estimates,
        output_tokens_estimate=allowance,
        price=price,
        max_cost=10**15,
    )
    expected = 0
    for i, estimate in enumerate(estimates):
        assert claim(store, job_id, hint=i).index == i
        expected += reserved_cost(estimate, allowance, *rates)
        assert store.get_job(job_id).cost_reserved == expected


@pytest.mark.parametrize("spent", [0, 1, 999_999_999, 10**9, 8_999_999_999_999_999])
def test_the_pause_event_says_the_amounts_exactly(store, spent):
    """The event's dollars are the nano-dollars exactly (Lua reckons in doubles: up to 2^53)."""
    limit = 9 * 10**15
    job_id = priced_job(store, 3, limit)
    c = claim(store, job_id)
    assert store.complete_item(job_id, c.index, "w1", "a", Usage(1, 1, None, spent))
    store.set_state(job_id, RUNNING, from_states=[RUNNING], max_cost=spent + NEED - 1)
    assert claim(store, job_id) == ClaimRefused("cost_limit")
    (event,) = [e for e in store.list_events(job_id) if e.kind == "paused"]
    assert event.message == cost_limit_reached(spent, NEED, 1, spent + NEED - 1)
    whole, frac = divmod(spent, 10**9)
    assert f"${whole}.{f'{frac:09d}'.rstrip('0').ljust(2, '0')} spent" in event.message


def test_what_is_spent_and_what_is_reserved_add_up_to_the_nano_dollar(store):
    """One nano-dollar either side of the limit, with something both spent and reserved."""
    for slack, expected in ((0, Claim), (-1, ClaimRefused)):
        job_id = priced_job(store, 4, 50_000 + 2 * NEED + slack)
        a, b = claim(store, job_id), claim(store, job_id)
        assert isinstance(a, Claim) and isinstance(b, Claim)
        assert store.complete_item(job_id, a.index, "w1", "a", Usage(1, 1, None, 50_000))
        assert held(store, job_id) == (50_000, NEED)
        got = claim(store, job_id)
        assert isinstance(got, expected), (slack, got)


def test_a_limit_on_a_job_without_a_price_reserves_nothing(store):
    """The jobs API refuses --max-cost without a price; the store, given one anyway, reserves
    nothing in money (it has no rate to reserve at) and holds the limit against what is spent."""
    job_id = priced_job(store, 3, 10, price=None)
    c = claim(store, job_id)
    assert isinstance(c, Claim) and held(store, job_id) == (0, 0)
    assert store.complete_item(job_id, c.index, "w1", "a", Usage(1, 1, None, 11))
    assert claim(store, job_id) == ClaimRefused("cost_limit"), "11 spent is over 10"
