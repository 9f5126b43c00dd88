"""The budget rule at its edges: totals past the cap, a reserve larger than the limit, Terms kept.

Chat is never held, so the window's total can pass the background cap; cron must stay held
there, not only exactly at it. Each case kills a mutant that survived tests/budget/test_policy.py
(scripts/mutate budget_policy; docs/testing.md).
"""

from __future__ import annotations

import dataclasses

import pytest

from hermes_bulk.budget.policy import ALLOWED, HELD, WOULD_BLOCK, decide, terms_for


def terms(
    call_class="cron",
    job_id="job1",
    *,
    mode="enforce",
    daily_limit=10,
    chat_reserve=3,
    job_limit=None,
):
    return terms_for(
        call_class,
        "m",
        job_id,
        mode=mode,
        daily_limit=daily_limit,
        chat_reserve=chat_reserve,
        job_limit=job_limit,
        models=("*",),
    )


@pytest.mark.parametrize("call_class", ["cron", "bulk"])
@pytest.mark.parametrize("total", [7, 8, 50, 10**9])
def test_a_window_chat_pushed_past_the_cap_still_holds_background_calls(call_class, total):
    assert decide(call_class, terms(call_class), window_total=total, job_requests=0) == HELD
    assert (
        decide(call_class, terms(call_class, mode="observe"), window_total=total, job_requests=0)
        == WOULD_BLOCK
    )


@pytest.mark.parametrize("done", [2, 3, 40])
def test_a_cron_job_past_its_limit_stays_held(done):
    assert decide("cron", terms(job_limit=2), window_total=0, job_requests=done) == HELD


def test_a_reserve_larger_than_the_limit_holds_every_background_call_from_the_first():
    t = terms(daily_limit=3, chat_reserve=5)
    assert t.background_cap == 0
    assert decide("cron", t, window_total=0, job_requests=0) == HELD
    assert decide("chat", t, window_total=0, job_requests=0) == ALLOWED


@pytest.mark.parametrize("mode, enforce", [("enforce", True), ("observe", False)])
def test_only_enforce_mode_enforces(mode, enforce):
    assert terms(mode=mode).enforce is enforce


def test_terms_cannot_be_changed_after_they_are_resolved():
    with pytest.raises(dataclasses.FrozenInstanceError):
        terms().background_cap = 99  # type: ignore[misc]
