"""SharedLimits (store/protocol.py) against a model, by random sequences of steps on a moved clock.

Steps: acquire (unpaced, or paced by rpm and tpm, with token costs above the burst), pause
(a 429 with or without Retry-After, to a request of the key's current epoch or a stale one),
clear_backoff, pause_state, and time passing. The clock is the test's (clocked.py), so 429
waits, pacing and the adaptive rate's recovery are checked to the millisecond on both backends
without waiting for any of it.

The model keeps each key's state as store/limits_math.py's LimitState and moves it with that
module's rules, which the protocol names as the arithmetic of record: on SQLite the test holds
the SQL plumbing to them (what is read, written and counted, and the unpaced path that reads
without the write lock and counts its grants every COUNT_EVERY_S), on Redis it holds the Lua
copy of the arithmetic to them. What the protocol's docstrings say in words is asserted apart
from the arithmetic: a wait is never shortened, a paused key grants nothing and says how long,
a granted request waits 0 and carries the key's epoch, clear_backoff restarts the doubling.

HERMES_BULK_STATEFUL_EXAMPLES sets the number of examples (as test_store_stateful.py).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from hermes_bulk.store import limits_math
from hermes_bulk.store.limits_math import LimitState
from hermes_bulk.store.sqlite.limits import SqliteLimits

from .clocked import clocked_backend

KEYS = ("k0", "k1")
EXAMPLES = int(os.environ.get("HERMES_BULK_STATEFUL_EXAMPLES", "100"))
# HERMES_BULK_STATEFUL_SHRINK=0: report the first failing example as found, unshrunk (a planted
# bug's yes or no in seconds, where shrinking a long example takes minutes).
PHASES = (
    tuple(Phase)
    if os.environ.get("HERMES_BULK_STATEFUL_SHRINK", "1") != "0"
    else (Phase.explicit, Phase.reuse, Phase.generate)
)
STATESTEP = settings(
    max_examples=EXAMPLES,
    phases=PHASES,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
# Pacing intervals that are whole or half seconds (rpm 60/30/12, tpm 60/120 a token), so the
# paced times are exact in both backends' arithmetic (SQLite: float seconds; Redis: ms).
RPMS = st.sampled_from([None, None, 60, 30, 12])
TPMS = st.sampled_from([None, None, 60, 120])
COSTS = st.sampled_from(
    [0, 1, 2, 5]
)  # 2 and 5 tokens: above the burst of one, through an empty bucket
ADVANCES = st.sampled_from([0.001, 0.05, 0.1, 0.5, 1.0, 2.0, 2.5, 5.0, 30.0, 130.0])
TOLERANCE_S = 1e-5  # Redis keeps times in ms with three decimals


@dataclass
class KeyModel:
    state: LimitState = field(default_factory=LimitState)
    epochs: list[int] = field(default_factory=list)  # epochs granted so far (a 429 answers one)
    uncounted: int = 0  # SQLite: grants not yet added to the shared count
    counted_at: float = 0.0


class LimitsMachine(RuleBasedStateMachine):
    backend = None
    _ids = itertools.count()

    def __init__(self) -> None:
        super().__init__()
        self.limits, self.clock = self.backend.limits, self.backend.clock
        self.batches_counts = isinstance(self.limits, SqliteLimits)
        self.prefix = f"lm{next(self._ids):07d}"
        self.keys = {k: KeyModel() for k in KEYS}

    def key(self, name: str) -> str:
        return f"{self.prefix}:{name}"

    def _take_uncounted(
        self, k: KeyModel, now_s: float, *, plus: int = 0, force: bool = False
    ) -> int:
        """SqliteLimits counts an unpaced key's grants every COUNT_EVERY_S (protocol: acquire)."""
        n = k.uncounted + plus
        if not force and now_s - k.counted_at < SqliteLimits.COUNT_EVERY_S:
            k.uncounted = n
            return 0
        k.uncounted, k.counted_at = 0, now_s
        return n

    @rule(name=st.sampled_from(KEYS), rpm=RPMS, tpm=TPMS, tokens=COSTS)
    def acquire(self, name, rpm, tpm, tokens):
        k, now_s = self.keys[name], self.clock()
        turn = self.limits.acquire(self.key(name), rpm=rpm, tpm=tpm, tokens=tokens)
        paused_until = k.state.pause_until_s
        if (
            self.batches_counts
            and not rpm
            and not tpm
            and limits_math.unpaced(k.state, now_s, rpm=rpm, tpm=tpm)
        ):
            want = 0.0
            n = self._take_uncounted(k, now_s, plus=1)
            if n:
                limits_math.count(k.state, now_s, n)
        else:
            trial = replace(k.state)
            want = limits_math.acquire(trial, now_s, rpm=rpm, tpm=tpm, tokens=tokens)
            if want == 0:
                k.state = trial
        assert abs(turn.wait - want) <= TOLERANCE_S and (turn.wait == 0) == (want == 0), (
            turn,
            want,
        )
        assert turn.epoch == k.state.decreases
        if paused_until > now_s:  # the words of the protocol, apart from the arithmetic
            assert abs(turn.wait - (paused_until - now_s)) <= TOLERANCE_S, (
                "a paused key says how long, takes nothing"
            )
        if turn.wait == 0:
            k.epochs.append(turn.epoch)

    @rule(name=st.sampled_from(KEYS), n=st.integers(2, 12))
    def burst(self, name, n):
        """Unpaced requests sent together (a pool of workers at once): what a 429 then measures."""
        for _ in range(n):
            self.acquire(name, None, None, 1)

    @rule(
        name=st.sampled_from(KEYS),
        seconds=st.sampled_from([None, None, 0.5, 2.0, 30.0]),
        base_s=st.sampled_from([1.0, 5.0]),
        cap_s=st.sampled_from([8.0, 120.0]),
        pick=st.integers(0, 5),
    )
    def pause(self, name, seconds, base_s, cap_s, pick):
        """A 429 to one of the key's granted requests (the newest, or an earlier, maybe stale
        one)."""
        k, now_s = self.keys[name], self.clock()
        epoch = k.epochs[-1 - pick % len(k.epochs)] if k.epochs else 0
        before = k.state.pause_until_s
        until = self.limits.pause(
            self.key(name), seconds=seconds, base_s=base_s, cap_s=cap_s, epoch=epoch
        )
        if self.batches_counts:
            n = self._take_uncounted(k, now_s, force=True)
            if n:
                limits_math.count(k.state, now_s, n)
        fresh, step = epoch == k.state.decreases, k.state.backoff_step
        limits_math.rate_limited(
            k.state, now_s, retry_after_s=seconds, base_s=base_s, cap_s=cap_s, epoch=epoch
        )
        assert abs(until - k.state.pause_until_s) <= TOLERANCE_S, (until, k.state)
        assert until >= before - TOLERANCE_S, "a wait is extended, never shortened"
        if seconds is not None:
            assert until >= now_s + seconds - TOLERANCE_S, "Retry-After is waited at least"
        else:
            chosen = min(cap_s, base_s * 2 ** (step if fresh else max(0, step - 1)))
            assert until >= now_s + chosen - TOLERANCE_S, "base * 2**step, capped"

    @rule(name=st.sampled_from(KEYS))
    def clear_backoff(self, name):
        self.limits.clear_backoff(self.key(name))
        limits_math.succeeded(self.keys[name].state)

    @rule(seconds=ADVANCES)
    def advance(self, seconds):
        self.clock.advance(seconds)

    @rule(
        name=st.sampled_from(KEYS),
        past=st.sampled_from([0, 1]),
        which=st.sampled_from(["pause_until_s", "request_tat_s", "token_tat_s"]),
    )
    def advance_to_an_end(self, name, past, which):
        """Time passes to exactly the end of a wait or of a pacing interval (past=0), or one
        millisecond past it: where "still waiting" and "may go" meet."""
        end_ms = round(getattr(self.keys[name].state, which) * 1000) + past
        if self.clock.ms < end_ms:
            self.clock.set_ms(end_ms)

    @invariant()
    def waits_agree(self):
        now_s = self.clock()
        for name, k in self.keys.items():
            got = self.limits.pause_state(self.key(name))
            if k.state.pause_until_s > now_s:
                assert got is not None and abs(got.until - k.state.pause_until_s) <= TOLERANCE_S, (
                    got,
                    k.state,
                )
                assert got.backoff_step == k.state.backoff_step, (got, k.state)
            else:
                assert got is None, (got, k.state, now_s)


@pytest.fixture(params=["sqlite", "redis"])
def clocked(request, tmp_path):
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    backend = clocked_backend(request.param, tmp_path, url)
    yield backend
    backend.close()


def test_the_shared_limiter_behaves_like_its_model(clocked):
    machine = type("Machine", (LimitsMachine,), {"backend": clocked})
    run_state_machine_as_test(machine, settings=STATESTEP)
