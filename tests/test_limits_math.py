"""The shared limiter's arithmetic (store/limits_math.py) on a clock the test sets.

The contract suite runs the same rules through both backends on the real clock; these tests
call the pure functions with exact times, so every boundary (a wait that ends now, a window a
second old, a learned rate that relaxes to nothing) is reached exactly and in milliseconds.
"""

from __future__ import annotations

import pytest

from hermes_bulk.store import limits_math as lm
from hermes_bulk.store.limits_math import LimitState


def test_the_stored_columns_follow_the_fields_in_order():
    state = LimitState(*range(1, 11))
    assert state.values() == tuple(range(1, 11))
    assert len(LimitState.COLUMNS) == 10 and LimitState.COLUMNS[0] == "request_tat"
    assert LimitState.COLUMNS[-1] == "decreases"
    assert LimitState().values() == (0.0, 0.0, 0.0, 0, 0.0, 0.0, 0.0, 0, 0, 0)


# GCRA ------------------------------------------------------------------------------------------


def test_gcra_without_a_rate_or_a_cost_grants_and_keeps_the_arrival_time():
    assert lm.gcra(5.0, 3.0, 0.0, 1) == (5.0, 0.0)  # no interval: not paced, even when "late"
    assert lm.gcra(5.0, 3.0, -1.0, 1) == (5.0, 0.0)
    assert lm.gcra(0.0, 3.0, 1.0, 0) == (0.0, 0.0)  # nothing to pay for
    assert lm.gcra(0.0, 3.0, 1.0, -2) == (0.0, 0.0)


def test_gcra_spaces_a_cost_by_the_interval_from_now_when_the_bucket_is_empty():
    assert lm.gcra(0.0, 10.0, 2.0, 3) == (16.0, 0.0)
    assert lm.gcra(10.0, 10.0, 0.5, 1) == (10.5, 0.0)  # arrival time exactly now: go
    assert lm.gcra(9.0, 10.0, 0.25, 1) == (10.25, 0.0)


def test_gcra_waits_until_the_arrival_time_and_keeps_it():
    assert lm.gcra(12.5, 10.0, 2.0, 3) == (12.5, 2.5)
    assert lm.gcra(10.25, 10.0, 1.0, 1) == (10.25, 0.25)


# The observed rate -----------------------------------------------------------------------------


def test_the_observed_rate_inside_a_second_weighs_the_window_before():
    state = LimitState(window_start_s=100.0, window_count=4, previous_count=10)
    assert lm.observed_rate_per_s(state, 100.0) == pytest.approx(14.0)
    assert lm.observed_rate_per_s(state, 100.25) == pytest.approx(10 * 0.75 + 4)
    assert lm.observed_rate_per_s(state, 100.5) == pytest.approx(9.0)


def test_the_observed_rate_of_an_older_window_is_its_count_over_its_age():
    state = LimitState(window_start_s=100.0, window_count=4, previous_count=10)
    assert lm.observed_rate_per_s(state, 101.0) == pytest.approx(4.0)  # exactly a second: its count
    assert lm.observed_rate_per_s(state, 101.5) == pytest.approx(4 / 1.5)
    assert lm.observed_rate_per_s(state, 102.0) == pytest.approx(2.0)
    assert lm.observed_rate_per_s(state, 104.0) == pytest.approx(1.0)


def test_count_opens_a_new_window_after_a_second_and_remembers_the_last_one():
    state = LimitState(window_start_s=100.0, window_count=3, previous_count=7)
    lm.count(state, 100.5)
    assert (state.window_start_s, state.window_count, state.previous_count) == (100.0, 4, 7)
    lm.count(state, 100.75, 2)
    assert (state.window_start_s, state.window_count, state.previous_count) == (100.0, 6, 7)
    lm.count(state, 101.0)  # exactly a second: a new window; the last one becomes "previous"
    assert (state.window_start_s, state.window_count, state.previous_count) == (101.0, 1, 6)
    lm.count(state, 102.5, 3)  # 1.5 s after it began: still the window before
    assert (state.window_start_s, state.window_count, state.previous_count) == (102.5, 3, 1)


def test_count_forgets_a_window_two_seconds_old_or_more():
    state = LimitState(window_start_s=100.0, window_count=5, previous_count=9)
    lm.count(state, 102.0)
    assert (state.window_start_s, state.window_count, state.previous_count) == (102.0, 1, 0)
    state = LimitState(window_start_s=100.0, window_count=5, previous_count=9)
    lm.count(state, 103.0)
    assert (state.window_start_s, state.window_count, state.previous_count) == (103.0, 1, 0)
    state = LimitState(window_start_s=100.0, window_count=5, previous_count=9)
    lm.count(state, 101.999)
    assert (state.window_start_s, state.window_count, state.previous_count) == (101.999, 1, 5)


# The learned interval --------------------------------------------------------------------------


def test_the_learned_interval_is_off_when_nothing_was_learned():
    assert lm.auto_interval_s(LimitState(auto_since_s=50.0), 10.0) == 0.0


def test_the_learned_interval_holds_during_the_wait_and_halves_every_doubling_period_after():
    state = LimitState(auto_interval_s=0.8, auto_since_s=100.0)
    assert lm.auto_interval_s(state, 90.0) == pytest.approx(0.8)  # before the wait is over
    assert lm.auto_interval_s(state, 100.0) == pytest.approx(0.8)
    assert lm.auto_interval_s(state, 105.0) == pytest.approx(0.4)
    assert lm.auto_interval_s(state, 110.0) == pytest.approx(0.2)
    assert lm.auto_interval_s(state, 102.5) == pytest.approx(0.8 / 2**0.5)


def test_the_learned_interval_switches_off_below_a_millisecond():
    state = LimitState(auto_interval_s=0.004, auto_since_s=0.0)
    assert lm.auto_interval_s(state, 10.0) == pytest.approx(0.001)  # exactly the floor: still on
    assert lm.auto_interval_s(state, 10.01) == 0.0
    assert lm.auto_interval_s(
        LimitState(auto_interval_s=0.0011, auto_since_s=0.0), 0.0
    ) == pytest.approx(0.0011)
    assert lm.auto_interval_s(LimitState(auto_interval_s=0.0009, auto_since_s=0.0), 0.0) == 0.0


def test_the_constants_are_the_documented_ones():
    assert (lm.AIMD_DECREASE, lm.AUTO_RECOVERY_DOUBLING_S) == (0.5, 5.0)
    assert (lm.AUTO_MAX_INTERVAL_S, lm.AUTO_OFF_BELOW_S) == (60.0, 0.001)


# acquire ---------------------------------------------------------------------------------------


def test_acquire_while_paused_returns_the_rest_of_the_wait_and_changes_nothing():
    state = LimitState(pause_until_s=20.0, request_tat_s=3.0, window_start_s=1.0, window_count=2)
    before = state.values()
    assert lm.acquire(state, 12.5, rpm=60, tpm=600, tokens=5) == pytest.approx(7.5)
    assert state.values() == before


def test_acquire_when_the_wait_ends_now_grants_and_counts():
    state = LimitState(pause_until_s=20.0)
    assert lm.acquire(state, 20.0, rpm=None, tpm=None, tokens=5) == 0.0
    assert (state.window_start_s, state.window_count) == (20.0, 1)
    assert (state.request_tat_s, state.token_tat_s) == (0.0, 0.0)


def test_acquire_paces_requests_at_the_rpm():
    state = LimitState()
    assert lm.acquire(state, 100.0, rpm=120, tpm=None, tokens=7) == 0.0
    assert state.request_tat_s == pytest.approx(100.5) and state.token_tat_s == 0.0
    assert lm.acquire(state, 100.25, rpm=120, tpm=None, tokens=7) == pytest.approx(0.25)
    assert state.request_tat_s == pytest.approx(100.5) and state.window_count == 1
    assert lm.acquire(state, 100.5, rpm=120, tpm=None, tokens=7) == 0.0
    assert state.request_tat_s == pytest.approx(101.0) and state.window_count == 2


def test_acquire_paces_tokens_at_the_tpm_and_waits_for_the_slower_of_the_two():
    state = LimitState()
    assert lm.acquire(state, 100.0, rpm=None, tpm=600, tokens=30) == 0.0  # 0.1 s a token
    assert state.token_tat_s == pytest.approx(103.0) and state.request_tat_s == 0.0
    assert lm.acquire(state, 101.0, rpm=None, tpm=600, tokens=1) == pytest.approx(2.0)
    state = LimitState(request_tat_s=105.0, token_tat_s=102.0)
    assert lm.acquire(state, 100.0, rpm=60, tpm=600, tokens=1) == pytest.approx(5.0)
    state = LimitState(request_tat_s=102.0, token_tat_s=105.0)
    assert lm.acquire(state, 100.0, rpm=60, tpm=600, tokens=1) == pytest.approx(5.0)
    assert (state.request_tat_s, state.token_tat_s, state.window_count) == (102.0, 105.0, 0)


def test_acquire_paces_at_the_learned_interval_when_it_is_slower_than_the_rpm():
    state = LimitState(auto_interval_s=2.0, auto_since_s=100.0)
    assert lm.acquire(state, 100.0, rpm=600, tpm=None, tokens=1) == 0.0
    assert state.request_tat_s == pytest.approx(102.0)
    state = LimitState(auto_interval_s=0.05, auto_since_s=100.0)
    assert lm.acquire(state, 100.0, rpm=60, tpm=None, tokens=1) == 0.0
    assert state.request_tat_s == pytest.approx(101.0)  # the rpm is the slower one here
    state = LimitState(auto_interval_s=2.0, auto_since_s=100.0)
    assert lm.acquire(state, 100.0, rpm=None, tpm=None, tokens=1) == 0.0
    assert state.request_tat_s == pytest.approx(102.0)


def test_acquire_switches_adaptive_pacing_off_once_it_has_relaxed_all_the_way():
    state = LimitState(auto_interval_s=0.002, auto_since_s=0.0)
    assert lm.acquire(state, 100.0, rpm=None, tpm=None, tokens=1) == 0.0
    assert state.auto_interval_s == 0.0 and state.request_tat_s == 0.0
    state = LimitState(auto_interval_s=0.5, auto_since_s=100.0)
    assert lm.acquire(state, 100.0, rpm=None, tpm=None, tokens=1) == 0.0
    assert state.auto_interval_s == 0.5  # still learning: kept


def test_unpaced_only_without_rpm_tpm_learned_rate_or_wait():
    assert lm.unpaced(LimitState(), 10.0, rpm=None, tpm=None)
    assert lm.unpaced(LimitState(pause_until_s=10.0), 10.0, rpm=0, tpm=0)  # the wait ends now
    assert not lm.unpaced(LimitState(), 10.0, rpm=60, tpm=None)
    assert not lm.unpaced(LimitState(), 10.0, rpm=None, tpm=600)
    assert not lm.unpaced(
        LimitState(auto_interval_s=1.0, auto_since_s=10.0), 10.0, rpm=None, tpm=None
    )
    assert not lm.unpaced(LimitState(pause_until_s=10.5), 10.0, rpm=None, tpm=None)


def test_clean_is_no_backoff_step_and_a_success_clears_it():
    assert lm.clean(LimitState()) is True
    state = LimitState(backoff_step=3, pause_until_s=9.0)
    assert lm.clean(state) is False
    lm.succeeded(state)
    assert state.backoff_step == 0 and state.pause_until_s == 9.0 and lm.clean(state)


# 429s ------------------------------------------------------------------------------------------


def test_backoff_wait_doubles_from_the_base_up_to_the_cap():
    waits = [
        lm.backoff_wait_s(LimitState(backoff_step=step), base_s=5.0, cap_s=120.0, doubling=True)
        for step in range(7)
    ]
    assert waits == [5.0, 10.0, 20.0, 40.0, 80.0, 120.0, 120.0]


def test_a_stale_429_gets_the_wait_already_chosen():
    def wait(step: int) -> float:
        return lm.backoff_wait_s(
            LimitState(backoff_step=step), base_s=5.0, cap_s=120.0, doubling=False
        )

    assert [wait(0), wait(1), wait(2), wait(3)] == [5.0, 5.0, 10.0, 20.0]


def test_the_first_429_of_a_generation_halves_the_observed_rate_and_waits_the_base():
    # 10 requests in the last window, observed 0.5 s into the next: rate 10 * 0.5 + 0 = 5/s.
    state = LimitState(window_start_s=100.0, previous_count=10, decreases=2)
    lm.rate_limited(state, 100.5, retry_after_s=None, base_s=5.0, cap_s=120.0, epoch=2)
    assert state.auto_interval_s == pytest.approx(1 / 2.5)
    assert state.decreases == 3 and state.backoff_step == 1
    assert state.pause_until_s == pytest.approx(105.5)
    assert state.auto_since_s == pytest.approx(105.5)  # relaxing starts when the wait is over


def test_a_429_with_retry_after_waits_that_long_and_keeps_the_backoff_step():
    state = LimitState(window_start_s=100.0, window_count=8, backoff_step=2)
    lm.rate_limited(state, 100.0, retry_after_s=3.0, base_s=5.0, cap_s=120.0, epoch=0)
    assert state.pause_until_s == pytest.approx(103.0) and state.auto_since_s == pytest.approx(
        103.0
    )
    assert state.backoff_step == 2 and state.decreases == 1
    assert state.auto_interval_s == pytest.approx(1 / 4)


def test_a_429_halves_the_learned_rate_when_there_is_one():
    state = LimitState(
        auto_interval_s=0.5, auto_since_s=100.0, window_start_s=100.0, window_count=50
    )
    lm.rate_limited(state, 100.0, retry_after_s=1.0, base_s=5.0, cap_s=120.0, epoch=0)
    assert state.auto_interval_s == pytest.approx(1.0)  # 2/s learned, not the 50/s observed
    state = LimitState(auto_interval_s=0.4, auto_since_s=100.0, decreases=1)
    lm.rate_limited(state, 100.0, retry_after_s=1.0, base_s=5.0, cap_s=120.0, epoch=1)
    assert state.auto_interval_s == pytest.approx(0.8)  # 2.5/s learned, halved


def test_the_learned_interval_never_goes_past_a_minute():
    state = LimitState()  # nothing observed: rate 0
    lm.rate_limited(state, 100.0, retry_after_s=1.0, base_s=5.0, cap_s=120.0, epoch=0)
    assert state.auto_interval_s == pytest.approx(60.0)
    state = LimitState(window_start_s=0.0, window_count=1)  # one request in 100 s: 0.01/s
    lm.rate_limited(state, 100.0, retry_after_s=1.0, base_s=5.0, cap_s=120.0, epoch=0)
    assert state.auto_interval_s == pytest.approx(60.0)
    state = LimitState(window_start_s=0.0, window_count=4)  # 1/25 s, halved: one in 50 s
    lm.rate_limited(state, 100.0, retry_after_s=1.0, base_s=5.0, cap_s=120.0, epoch=0)
    assert state.auto_interval_s == pytest.approx(50.0)


def test_the_first_429_of_a_generation_is_told_apart_after_hundreds_of_decreases():
    # Epochs are compared by value: a key that halved its rate 300 times still halves it again.
    state = LimitState(window_start_s=100.0, window_count=10, decreases=int("300"))
    lm.rate_limited(state, 100.0, retry_after_s=1.0, base_s=5.0, cap_s=120.0, epoch=int("300"))
    assert state.decreases == 301 and state.auto_interval_s == pytest.approx(0.2)


def test_a_stale_429_extends_the_wait_but_neither_slows_nor_doubles():
    state = LimitState(
        auto_interval_s=0.4, auto_since_s=105.0, pause_until_s=105.0, backoff_step=1, decreases=3
    )
    lm.rate_limited(state, 104.0, retry_after_s=None, base_s=5.0, cap_s=120.0, epoch=2)
    assert state.pause_until_s == pytest.approx(109.0)  # now + base (step 1 - 1)
    assert (state.auto_interval_s, state.auto_since_s) == (0.4, 105.0)
    assert (state.backoff_step, state.decreases) == (1, 3)


def test_a_pause_is_never_shortened():
    state = LimitState(pause_until_s=200.0, decreases=1)
    lm.rate_limited(state, 100.0, retry_after_s=2.0, base_s=5.0, cap_s=120.0, epoch=0)
    assert state.pause_until_s == 200.0
    lm.rate_limited(state, 100.0, retry_after_s=None, base_s=5.0, cap_s=120.0, epoch=1)
    assert state.pause_until_s == 200.0 and state.auto_since_s == 200.0


def test_one_burst_of_429s_then_a_later_one_doubles_the_wait_once_each():
    state = LimitState()
    for _ in range(16):
        assert lm.acquire(state, 100.0, rpm=None, tpm=None, tokens=1) == 0.0
    for _ in range(16):
        lm.rate_limited(state, 100.0, retry_after_s=None, base_s=5.0, cap_s=120.0, epoch=0)
    assert state.pause_until_s == pytest.approx(105.0) and state.backoff_step == 1
    assert state.decreases == 1
    assert state.auto_interval_s == pytest.approx(1 / 8)  # 16/s seen, halved
    assert lm.acquire(state, 105.0, rpm=None, tpm=None, tokens=1) == 0.0
    lm.rate_limited(state, 105.0, retry_after_s=None, base_s=5.0, cap_s=120.0, epoch=1)
    assert state.pause_until_s == pytest.approx(115.0) and state.backoff_step == 2
