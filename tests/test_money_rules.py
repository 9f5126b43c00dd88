"""A job's money as pure functions (jobs/prices.py), each figure beside its neighbour: cache
writes capped by what is left of the input after cached reads, a price whose write rate is above,
below or equal to its input rate, what status shows of the prompt cache, the worst case beside
what is spent and reserved, a job whose projection is below what it was charged, a settled job
beside one with items still running. tests/test_money.py holds the same through the CLI and
workers; this file is in what `scripts/mutate prices` runs per mutant."""

from __future__ import annotations

import dataclasses

import pytest

from hermes_bulk.jobs import prices, prompt
from hermes_bulk.store.records import (
    JobRecord,
    JobSpec,
    Usage,
    claim_cost,
    reserved_cost,
    worst_case_nusd,
)

#: USD per million tokens: Claude's shape (a cache write at 1.25x input) and OpenAI's (none)
CLAUDE = prices.Price(0.8, 4.0, 0.08, "s", cache_write_input=1.0)
MINI = prices.Price(0.15, 0.6, 0.075, "s")


def _job(price: prices.Price, **counts) -> JobRecord:
    spec = JobSpec("j", "Do", "/s", "jsonl", 1, 0, price=price.as_dict(), max_output_tokens=100)
    base = dict(
        created_at=0, state="running", pause_reason=None, total=12, pending=0, running=0,
        completed=12, failed=0, tokens_in=0, tokens_out=0, tokens_charged=0, tokens_reserved=0,
        estimated_tokens=0, skipped=0, last_claim_at=None, run_at=None,
    )  # fmt: skip
    return JobRecord(spec, **{**base, **counts})


def test_cache_writes_are_what_is_left_of_the_input_after_cached_reads():
    # 100 in: 60 read from the cache, 50 said written: only 40 can have been.
    assert CLAUDE.cost_nusd(100, 0, 60, 50) == round((60 * 0.08 + 40 * 1.0) * 1000)
    assert CLAUDE.cost_nusd(100, 0, 60, 40) == CLAUDE.cost_nusd(100, 0, 60, 50)
    assert CLAUDE.cost_nusd(100, 0, 60, 39) == round((1 * 0.8 + 60 * 0.08 + 39 * 1.0) * 1000)
    # nothing said written: none at the write rate (the default, and priced's reading of None)
    assert CLAUDE.cost_nusd(1000, 10) == round((1000 * 0.8 + 10 * 4.0) * 1000)
    job = _job(CLAUDE)
    for usage in (Usage(1000, 10, 0, tokens_written=None), Usage(1000, 10, None)):
        assert prices.priced(job, "", usage, by_batch=False).cost_nusd == CLAUDE.cost_nusd(1000, 10)
    written = prices.priced(job, "", Usage(1000, 10, 0, tokens_written=300), by_batch=False)
    assert written.cost_nusd == round((700 * 0.8 + 300 * 1.0 + 10 * 4.0) * 1000)
    # unreported: the estimate, as the store charges it, none of it at the write rate
    guessed = prices.priced(job, "x" * 300, Usage(), by_batch=False)
    estimate_in = prompt.estimate_tokens("x" * 300, "Do", 0)
    assert guessed.cost_nusd == CLAUDE.cost_nusd(estimate_in, job.output_allowance)
    assert guessed.cost_nusd == round((estimate_in * 0.8 + job.output_allowance * 4.0) * 1000)


def test_the_write_rate_is_the_input_rate_unless_a_price_names_its_own():
    assert MINI.write_rate == 0.15 and CLAUDE.write_rate == 1.0
    cheaper = prices.Price(1.0, 2.0, 1.0, "s", cache_write_input=0.5)
    assert cheaper.write_rate == 0.5


@pytest.mark.parametrize(
    ("price", "shown"),
    [
        (CLAUDE, "$0.80 in, $4.00 out per million tokens ($0.08 cached; $1.00 cache write; s)"),
        (  # a write below the input rate is said too
            prices.Price(1.0, 2.0, 1.0, "s", cache_write_input=0.5),
            "$1.00 in, $2.00 out per million tokens ($0.50 cache write; s)",
        ),
        (  # equal rates, as separate floats (read from a file), say nothing more
            prices.Price(float("2.5"), 8, float("2.5"), "s", cache_write_input=float("2.5")),
            "$2.50 in, $8.00 out per million tokens (s)",
        ),
    ],
)
def test_a_price_says_its_cached_and_write_rates_only_where_they_differ(price, shown):
    assert prices.describe(price) == shown


def test_what_status_shows_of_the_prompt_cache():
    sonnet = prices.Price(3.0, 15.0, 0.3, "s", cache_write_input=3.75)
    cost = prices.job_cost(_job(sonnet, tokens_cached=2_000_000, tokens_written=1_500_000))
    assert cost.cache_read == 2_000_000 * 0.3 / 1e6  # 2M at $0.30: $0.60
    assert cost.cache_saved == 2_000_000 * 2.7 / 1e6  # 2M at $3.00 - $0.30: $5.40
    assert cost.cache_written == 1_500_000 * 3.75 / 1e6  # 1.5M at $3.75: $5.625
    assert (cost.cache_read, cost.cache_saved, cost.cache_written) == pytest.approx(
        (0.6, 5.4, 5.625), rel=1e-12
    )
    none = prices.job_cost(_job(CLAUDE))
    assert (none.cache_read, none.cache_saved, none.cache_written) == (0.0, 0.0, 0.0)
    # a cached rate above the input rate (a provider's odd price): nothing saved, not a loss
    odd = prices.Price(1.0, 2.0, 3.0, "s")
    assert prices.job_cost(_job(odd, tokens_cached=1_000_000)).cache_saved == 0.0


def test_the_worst_case_is_of_the_items_asked_and_never_below_what_is_spent_and_reserved():
    # 12 items, 3 reused: the other 9 may bill their 100 output tokens each.
    job = _job(MINI, worst_tokens=5_000, reused=3, cost_nusd=3_000, cost_reserved=2_000)
    worst = worst_case_nusd(job.spec, 5_000, 9)
    assert worst == round((4_100 * 0.15 + 900 * 0.6) * 1000)
    assert prices.job_cost(job).worst_case == worst / 1e9
    # spent and reserved past it (retries): that sum, not the worst case
    over = dataclasses.replace(job, cost_nusd=worst, cost_reserved=2_000)
    assert prices.job_cost(over).worst_case == (worst + 2_000) / 1e9
    # a job made before worst cases were recorded has none
    assert prices.job_cost(dataclasses.replace(job, worst_tokens=0)).worst_case is None


def test_the_estimate_adds_nothing_for_a_job_charged_past_its_projection():
    job = _job(MINI, pending=3, completed=9, estimated_tokens=100, tokens_charged=500, cost_nusd=7)
    assert job.projected_tokens < job.tokens_charged
    assert prices.job_cost(job).estimated == 7 / 1e9


def test_a_job_with_items_running_is_not_settled_though_nothing_is_pending():
    running = _job(MINI, running=2, completed=10, estimated_tokens=1_000, cost_nusd=7)
    assert prices.job_cost(running).estimated > 7 / 1e9
    settled = dataclasses.replace(running, running=0, completed=12)
    assert prices.job_cost(settled).estimated == 7 / 1e9


def test_what_is_unkept_is_shown_apart_and_prices_and_costs_cannot_be_changed():
    """A price is recorded on a job and shared: none of these records can be changed."""
    cost = prices.job_cost(_job(MINI, cost_nusd=5_000, cost_unkept=1_500))
    assert (cost.spent, cost.unkept) == (5e-6, 1.5e-6)
    for record, field in ((cost, "spent"), (MINI, "input"), (prices.JobPrice(MINI), "price")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(record, field, None)


def test_the_price_database_records_the_cache_write_rate():
    claude = prices.resolve("claude-3-5-haiku-latest", None, batch=False, setting="").price
    assert (claude.input, claude.cache_write_input) == (0.8, 1.0)
    mini = prices.resolve("gpt-4o-mini", None, batch=False, setting="").price
    assert (mini.input, mini.cached_input, mini.cache_write_input) == (0.15, 0.075, 0.15)


def _batch_spec(**kw) -> JobSpec:
    """A batch job: it pays the batch price, its items answered live the list price."""
    return JobSpec(
        "j", "Do", "/s", "jsonl", 1, 0, mode="batch", price=MINI_BATCH.as_dict(),
        list_price=MINI.as_dict(), max_output_tokens=100, **kw,
    )  # fmt: skip


MINI_BATCH = prices.Price(0.075, 0.3, 0.075, "s")


def test_a_claim_reserves_at_the_price_it_pays_and_nothing_without_one():
    live = JobSpec("j", "Do", "/s", "jsonl", 1, 0, price=MINI.as_dict(), max_output_tokens=100)
    assert claim_cost(live, 1_000) == reserved_cost(1_000, 100, 0.15, 0.6)
    assert claim_cost(live, 1_000) == round((900 * 0.15 + 100 * 0.6) * 1000)
    batch = _batch_spec()
    assert claim_cost(batch, 1_000) == reserved_cost(1_000, 100, 0.075, 0.3), "a batch's"
    assert claim_cost(batch, 1_000, batch=True) == claim_cost(batch, 1_000)
    assert claim_cost(batch, 1_000, batch=False) == reserved_cost(1_000, 100, 0.15, 0.6)
    assert claim_cost(JobSpec("j", "Do", "/s", "jsonl", 1, 0), 1_000) == 0, "no price"
    # input at the dearer of the input and the cache-write rate: an item may write it all
    assert claim_cost(_job(CLAUDE).spec, 1_000) == reserved_cost(1_000, 100, 1.0, 4.0)


def test_a_batch_jobs_worst_case_is_at_the_batch_price_and_no_items_cost_nothing():
    batch = _batch_spec()
    assert worst_case_nusd(batch, 5_000, 9) == reserved_cost(5_000, 900, 0.075, 0.3)
    assert worst_case_nusd(batch, 500, 1) == reserved_cost(500, 100, 0.075, 0.3), "one item"
    assert worst_case_nusd(batch, 5_000, 0) == 0
    assert worst_case_nusd(JobSpec("j", "Do", "/s", "jsonl", 1, 0), 5_000, 9) == 0
