"""The budget's rule, pure: which calls count and what one admission decides."""

from __future__ import annotations

import pytest

from hermes_bulk.budget import policy
from hermes_bulk.budget.policy import ALLOWED, HELD, WOULD_BLOCK, decide, model_counts, terms_for


def terms(
    call_class="cron",
    model="m",
    job_id="job1",
    *,
    mode="enforce",
    daily_limit=10,
    chat_reserve=3,
    job_limit=None,
    models=("*",),
):
    return terms_for(
        call_class,
        model,
        job_id,
        mode=mode,
        daily_limit=daily_limit,
        chat_reserve=chat_reserve,
        job_limit=job_limit,
        models=models,
    )


@pytest.mark.parametrize("call_class", ["cron", "bulk"])
def test_background_calls_are_allowed_below_the_cap_and_held_at_it(call_class):
    t = terms(call_class)
    assert t.background_cap == 7
    assert decide(call_class, t, window_total=6, job_requests=0) == ALLOWED
    assert decide(call_class, t, window_total=7, job_requests=0) == HELD


@pytest.mark.parametrize("call_class", ["chat", "auxiliary"])
def test_chat_and_auxiliary_calls_are_never_held_even_past_the_daily_limit(call_class):
    assert decide(call_class, terms(call_class), window_total=10_000, job_requests=0) == ALLOWED


def test_observe_mode_records_would_block_instead_of_holding():
    assert decide("cron", terms(mode="observe"), window_total=7, job_requests=0) == WOULD_BLOCK


def test_chat_use_leaves_cron_less_of_the_window_never_more():
    """The counted total, chat included, is what meets the background cap."""
    assert decide("cron", terms(), window_total=7, job_requests=0) == HELD  # e.g. 7 chat, 0 cron


def test_a_cron_job_at_its_job_limit_is_held_while_other_jobs_still_run():
    t = terms(job_limit=2)
    assert decide("cron", t, window_total=2, job_requests=2) == HELD
    assert decide("cron", t, window_total=2, job_requests=1) == ALLOWED


def test_job_limit_caps_cron_jobs_only_not_bulk_jobs():
    assert terms("bulk", job_limit=2).job_cap is None
    assert decide("bulk", terms("bulk", job_limit=2), window_total=2, job_requests=5) == ALLOWED


def test_a_reserve_equal_to_the_limit_leaves_background_work_nothing():
    t = terms(daily_limit=5, chat_reserve=5)
    assert t.background_cap == 0
    assert decide("cron", t, window_total=0, job_requests=0) == HELD


def test_a_model_outside_the_globs_is_never_held_and_does_not_count():
    t = terms(model="gpt-4o", models=("*:free",))
    assert not t.counted
    assert decide("cron", t, window_total=100, job_requests=0) == ALLOWED
    assert not policy.counts_toward_total(ALLOWED, t)


def test_held_calls_do_not_count_and_would_block_calls_do():
    t = terms()
    assert not policy.counts_toward_total(HELD, t)
    assert policy.counts_toward_total(WOULD_BLOCK, t)


@pytest.mark.parametrize(
    "model, globs, counts",
    [
        ("meta-llama/llama-3.3-70b-instruct:free", ("*:free",), True),
        ("meta-llama/llama-3.3-70b-instruct", ("*:free",), False),
        ("GPT-4o-mini", ("gpt-*",), True),
        ("claude-sonnet", ("gpt-*", "claude-*"), True),
        (None, ("gpt-*",), True),  # an unknown model counts: the safe side
        ("", ("gpt-*",), True),
    ],
)
def test_models_are_matched_as_case_insensitive_globs(model, globs, counts):
    assert model_counts(model, globs) is counts
