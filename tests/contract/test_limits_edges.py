"""The shared limiter at its edges, on both backends and a clock the test moves (clocked.py):
the instant a wait ends, the slowest and fastest paces a user can set, a wait of one
millisecond, and the window a 429 measures the rate in, a millisecond either side of where it
stops counting. Each is a rule of store/limits_math.py that the stateful test reaches too
rarely to hold the Lua copy to it (mutation testing found each one loose: docs/testing.md).
"""

from __future__ import annotations

import pytest

from hermes_bulk.store import limits_math

from .clocked import ClockedBackend, clocked_backend

STALE = -1  # a 429 to a request from before any decrease: a wait, and no new pace


@pytest.fixture(params=["sqlite", "redis"])
def clocked(request, tmp_path) -> ClockedBackend:
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    backend = clocked_backend(request.param, tmp_path, url)
    yield backend
    backend.close()


def acquire(clocked: ClockedBackend, *, rpm=None, tpm=None, tokens=1) -> float:
    return clocked.limits.acquire("k", rpm=rpm, tpm=tpm, tokens=tokens).wait


def test_at_the_instant_a_wait_ends_a_request_is_taken_and_counted_for_pacing(clocked):
    clocked.limits.pause("k", seconds=2.0, base_s=5, cap_s=120, epoch=STALE)
    assert acquire(clocked, rpm=60) == pytest.approx(2.0)
    clocked.clock.advance(2.0)
    assert acquire(clocked, rpm=60) == 0.0
    assert acquire(clocked, rpm=60) == pytest.approx(1.0)  # the first was taken, and paced the next


@pytest.mark.parametrize(
    "rpm, tpm, tokens, second_waits",
    [
        (1, None, 1, 60.0),  # --rpm 1: one request a minute
        (None, 1, 1, 60.0),  # --tpm 1: one token a minute
        (
            None,
            120_000,
            10_000,
            5.0,
        ),  # half a millisecond a token: 10,000 tokens are 5 s of the bucket
        (60_000, None, 1, 0.001),  # one request a millisecond
    ],
)
def test_the_slowest_and_the_fastest_paces_are_kept(clocked, rpm, tpm, tokens, second_waits):
    assert acquire(clocked, rpm=rpm, tpm=tpm, tokens=tokens) == 0.0
    assert acquire(clocked, rpm=rpm, tpm=tpm, tokens=tokens) == pytest.approx(
        second_waits, abs=1e-6
    )


def test_a_wait_of_one_millisecond_is_still_a_wait(clocked):
    assert acquire(clocked, rpm=60) == 0.0
    clocked.clock.advance(0.999)
    assert acquire(clocked, rpm=60) == pytest.approx(0.001, abs=1e-6)
    clocked.clock.advance(0.001)
    assert acquire(clocked, rpm=60) == 0.0


@pytest.mark.parametrize(
    "gap_s, rate_per_s",
    [
        (
            1.5,
            4 + 1,
        ),  # the window before counts whole at the start of this one, with its one request
        (
            1.999,
            4 + 1,
        ),  # the window before ended a millisecond short of a second ago: it still counts
        (2.0, 1),  # it ended a second ago: only this window's one request
    ],
)
def test_a_429_halves_the_rate_it_measured_over_about_the_last_second(clocked, gap_s, rate_per_s):
    # Paced (one request every 10 ms), so each grant is counted as it is taken on both backends
    # (SQLite counts unpaced grants in batches: limits_math.count's n).
    for _ in range(4):
        assert acquire(clocked, rpm=6000) == 0.0  # four requests in one window
        clocked.clock.advance(0.01)
    clocked.clock.advance(gap_s - 0.04)  # gap_s after the window began
    turn = clocked.limits.acquire("k", rpm=6000, tpm=None, tokens=1)
    assert turn.wait == 0.0
    clocked.limits.pause("k", seconds=1.0, base_s=5, cap_s=120, epoch=turn.epoch)
    clocked.clock.advance(1.0)  # the wait is over; the learned pace has not relaxed yet
    assert acquire(clocked, rpm=6000) == 0.0
    expected = 1 / (rate_per_s * limits_math.AIMD_DECREASE)
    assert acquire(clocked, rpm=6000) == pytest.approx(expected, abs=1e-3)


def test_a_hold_from_the_providers_headers_is_a_wait_and_nothing_else(clocked):
    """ProviderGate.hold: pause() with the epoch no grant carries, after a burst the key saw.
    A 429 to that burst would halve its rate; the hold only waits."""
    for _ in range(50):
        assert acquire(clocked) == 0.0
    clocked.limits.pause("k", seconds=0.5, base_s=5, cap_s=120, epoch=STALE)
    assert clocked.limits.pause_state("k").backoff_step == 0
    assert acquire(clocked) == pytest.approx(0.5)
    clocked.clock.advance(0.5)
    assert [acquire(clocked) for _ in range(20)] == [0.0] * 20, "no adaptive pace was set"
