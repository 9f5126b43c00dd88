"""SqliteLimits (store/sqlite/limits.py) on a real SQLite file and a clock the test sets.

The contract suite holds both backends to the shared limiter's rules on the real clock; these
tests pin what only the SQLite side does: an unpaced key's grants are counted in batches (at most
every COUNT_EVERY_S), a 429 adds what is still uncounted before it halves the rate, and a
success clears the backoff step only when there is one.
"""

from __future__ import annotations

import pytest

from hermes_bulk.fleet import broker
from hermes_bulk.store.limits_math import LimitState
from hermes_bulk.store.sqlite.limits import SqliteLimits


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def backend(tmp_path, clock):
    b = broker.build_backend(f"sqlite:///{tmp_path / 'bulk.db'}")
    b.limits.db.clock = clock
    yield b
    b.close()


@pytest.fixture
def limits(backend) -> SqliteLimits:
    return backend.limits


def state(limits: SqliteLimits, key: str) -> LimitState | None:
    rows = limits.db.read(
        f"SELECT {', '.join(LimitState.COLUMNS)} FROM limits WHERE key = ?", (key,)
    )
    return LimitState(*rows[0]) if rows else None


def test_unpaced_grants_are_counted_in_batches(limits, clock):
    assert SqliteLimits.COUNT_EVERY_S == 0.1
    turn = limits.acquire("k", rpm=None, tpm=None, tokens=1)
    assert (turn.wait, turn.epoch) == (0.0, 0)
    assert state(limits, "k").window_count == 1, "the first grant is counted at once"
    for _ in range(3):
        clock.now += 0.03
        assert limits.acquire("k", rpm=None, tpm=None, tokens=1).wait == 0.0
    assert state(limits, "k").window_count == 1, "within COUNT_EVERY_S: held back"
    clock.now += 0.01  # 0.1 s after the last count
    limits.acquire("k", rpm=None, tpm=None, tokens=1)
    assert state(limits, "k").window_count == 5
    assert state(limits, "k").window_start_s == 1_000_000.0


def test_grants_are_counted_again_once_the_period_has_passed_exactly(limits, clock):
    clock.now = 0.125  # where now - last count is exactly COUNT_EVERY_S in floating point
    limits.acquire("k", rpm=None, tpm=None, tokens=1)
    clock.now = 0.125 + 0.1
    assert clock.now - 0.125 == SqliteLimits.COUNT_EVERY_S
    limits.acquire("k", rpm=None, tpm=None, tokens=1)
    assert state(limits, "k").window_count == 2


def test_a_429_counts_the_grants_not_yet_counted_before_halving_the_rate(limits, clock):
    for _ in range(10):
        clock.now += 0.005
        limits.acquire("k", rpm=None, tpm=None, tokens=1)
    assert state(limits, "k").window_count == 1
    until = limits.pause("k", seconds=2.0, base_s=5, cap_s=120, epoch=0)
    assert until == clock.now + 2.0
    s = state(limits, "k")
    assert s.window_count == 10 and s.decreases == 1
    assert s.auto_interval_s == pytest.approx(1 / 5), (
        "10 requests seen in the second: halved to 5/s"
    )
    # A pause without uncounted grants counts nothing more.
    limits.pause("k", seconds=1.0, base_s=5, cap_s=120, epoch=0)
    assert state(limits, "k").window_count == 10


def test_a_waiting_or_learning_key_takes_the_write_path_and_says_how_long(limits, clock):
    limits.pause("k", seconds=3.0, base_s=5, cap_s=120, epoch=0)
    turn = limits.acquire("k", rpm=None, tpm=None, tokens=1)
    assert turn.wait == pytest.approx(3.0) and turn.epoch == 1
    clock.now += 3.0
    turn = limits.acquire("k", rpm=None, tpm=None, tokens=1)
    assert (turn.wait, turn.epoch) == (0.0, 1)
    assert state(limits, "k").request_tat_s == pytest.approx(clock.now + 60.0), (
        "paced: one a minute"
    )
    turn = limits.acquire("k", rpm=None, tpm=None, tokens=1)
    assert turn.wait == pytest.approx(60.0) and turn.epoch == 1


def test_the_read_path_of_an_unpaced_key_sees_its_epoch_and_a_wait_without_a_decrease(
    limits, clock
):
    limits.pause("k", seconds=1.0, base_s=5, cap_s=120, epoch=0)  # Retry-After: no backoff step
    clock.now += 300  # the wait is over and the learned rate has relaxed all the way
    turn = limits.acquire("k", rpm=None, tpm=None, tokens=1)
    assert (turn.wait, turn.epoch) == (0.0, 1), "an unpaced grant carries the key's epoch"
    assert limits._clean["k"] is True
    # A late 429 to a request sent before the decrease: a new wait, no decrease.
    limits.pause("k", seconds=10.0, base_s=5, cap_s=120, epoch=0)
    s = state(limits, "k")
    assert (s.decreases, s.backoff_step, s.pause_until_s) == (1, 0, clock.now + 10.0)
    turn = limits.acquire("k", rpm=None, tpm=None, tokens=1)
    assert turn.wait == pytest.approx(10.0), "a waiting key is not unpaced"
    limits.pause("k", seconds=None, base_s=5, cap_s=120, epoch=1)
    clock.now += 300
    limits.acquire("k", rpm=None, tpm=None, tokens=1)
    assert limits._clean["k"] is False, "the read saw the backoff step"


def test_a_paced_key_is_written_on_every_grant(limits, clock):
    assert limits.acquire("r", rpm=60, tpm=None, tokens=1).wait == 0.0
    assert state(limits, "r").request_tat_s == clock.now + 1.0
    assert limits.acquire("r", rpm=60, tpm=None, tokens=1).wait == pytest.approx(1.0)
    assert limits.acquire("t", rpm=None, tpm=60, tokens=3).wait == 0.0
    assert state(limits, "t").token_tat_s == clock.now + 3.0
    assert state(limits, "t").window_count == 1


def test_a_success_clears_a_backoff_step_and_nothing_else(limits, clock):
    limits.pause("k", seconds=None, base_s=5, cap_s=120, epoch=0)
    assert limits.pause_state("k").backoff_step == 1
    limits.clear_backoff("k")
    s = state(limits, "k")
    assert s.backoff_step == 0 and s.pause_until_s == clock.now + 5
    limits.clear_backoff("never-seen")
    assert state(limits, "never-seen") is None, "nothing to clear writes nothing"


def test_a_success_after_a_clean_acquire_skips_the_read_but_a_429_elsewhere_is_cleared(
    limits, backend, clock, tmp_path
):
    limits.acquire("k", rpm=None, tpm=None, tokens=1)
    # Another process's 429 (its own SqliteLimits on the same file) sets a step here.
    other = broker.build_backend(f"sqlite:///{tmp_path / 'bulk.db'}")
    try:
        other.limits.db.clock = clock
        other.limits.pause("k", seconds=None, base_s=5, cap_s=120, epoch=0)
    finally:
        other.close()
    limits.clear_backoff("k")
    assert state(limits, "k").backoff_step == 1, (
        "this process saw no step: the success skips the read"
    )
    clock.now += 5
    limits.acquire("k", rpm=None, tpm=None, tokens=1)  # sees the step: no longer clean
    limits.clear_backoff("k")
    assert state(limits, "k").backoff_step == 0
    limits.pause("k", seconds=1.0, base_s=5, cap_s=120, epoch=1)
    assert limits._clean["k"] is False, "after its own 429 a success reads again"


def test_a_pacing_acquire_marks_a_key_with_a_step_as_not_clean(limits, clock):
    limits.pause("k", seconds=None, base_s=5, cap_s=120, epoch=0)
    clock.now += 5
    assert limits.acquire("k", rpm=60, tpm=None, tokens=1).wait == 0.0
    assert limits._clean["k"] is False
    limits.clear_backoff("k")
    assert state(limits, "k").backoff_step == 0
    assert limits.acquire("k", rpm=60, tpm=None, tokens=1).wait > 0
    assert limits._clean["k"] is True


def test_a_refused_acquire_writes_nothing(limits, clock):
    assert limits.acquire("r", rpm=60, tpm=None, tokens=1).wait == 0.0
    before = state(limits, "r").values()
    clock.now += 0.5
    assert limits.acquire("r", rpm=60, tpm=None, tokens=1).wait == pytest.approx(0.5)
    assert state(limits, "r").values() == before


def test_pause_state_is_only_a_wait_still_running(limits, clock):
    assert limits.pause_state("k") is None
    limits.pause("k", seconds=2.0, base_s=5, cap_s=120, epoch=0)
    assert limits.pause_state("k").until == clock.now + 2.0
    clock.now += 2.0
    assert limits.pause_state("k") is None, "a wait that ends now is over"
    clock.now += 1.0
    assert limits.pause_state("k") is None, "and stays over"
