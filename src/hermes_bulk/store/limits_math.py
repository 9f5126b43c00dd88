"""The arithmetic of the shared limiter, on one provider key's state (no I/O).

SqliteLimits runs these functions inside one BEGIN IMMEDIATE transaction; the Redis Lua
scripts (store/redis_lua/acquire.lua, pause.lua, succeeded.lua) implement the same rules and
the contract suite holds both to them.

- Pacing is GCRA (generic cell rate) with a burst of one unit: requests, and tokens, are spaced
  evenly at the rate, so a provider limit is met without bouncing off it. A cost larger than
  the burst goes through when the bucket is empty, so one large item never blocks forever.
- A 429 starts (or extends, never shortens) the shared wait: Retry-After, else
  base · 2^step up to the cap.
- Adaptive pacing (AIMD): the first 429 of a wait halves the request rate the key was seeing
  (measured over about the last second), later ones in the same wait change nothing; each
  success raises the rate by 1 %. Without it, every worker released at the end of a wait hits
  the provider at once and earns the next 429.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass

AIMD_DECREASE = 0.5  #: a 429 multiplies the request rate by this
AIMD_INCREASE = 1.01  #: each success multiplies it by this
AUTO_MAX_INTERVAL_S = 60.0  #: adaptive pacing never goes below one request a minute
AUTO_OFF_BELOW_S = 0.001  #: above 1,000 requests a second adaptive pacing switches itself off


@dataclass
class LimitState:
    request_tat: float = 0.0  # theoretical arrival time of the next request (GCRA)
    token_tat: float = 0.0
    pause_until: float = 0.0
    backoff_step: int = 0
    auto_interval: float = 0.0  # seconds between requests learned from 429s; 0 = off
    window_start: float = 0.0  # a one-second window counting granted requests
    window_count: int = 0
    previous_count: int = 0  # the count of the window before

    FIELDS = ("request_tat", "token_tat", "pause_until", "backoff_step", "auto_interval",
              "window_start", "window_count", "previous_count")

    def values(self) -> tuple:
        return astuple(self)


def _gcra(tat: float, now: float, interval: float, cost: int) -> tuple[float, float]:
    """(new theoretical arrival time, seconds to wait)."""
    if interval <= 0 or cost <= 0:
        return tat, 0.0
    if tat > now:
        return tat, tat - now
    return now + interval * cost, 0.0


def observed_rate(state: LimitState, now: float) -> float:
    """Requests granted over about the last second (a sliding-window estimate)."""
    elapsed = now - state.window_start
    if elapsed >= 2.0:
        return 0.0
    if elapsed >= 1.0:
        return state.window_count * max(0.0, 2.0 - elapsed)
    return state.previous_count * (1.0 - elapsed) + state.window_count


def acquire(state: LimitState, now: float, *, rpm: int | None, tpm: int | None, tokens: int) -> float:
    """0.0 and state updated when a request may go now; else the seconds to wait (state as was)."""
    if state.pause_until > now:
        return state.pause_until - now
    interval = max(60.0 / rpm if rpm else 0.0, state.auto_interval)
    request_tat, wait_requests = _gcra(state.request_tat, now, interval, 1)
    token_tat, wait_tokens = _gcra(state.token_tat, now, 60.0 / tpm if tpm else 0.0, tokens)
    wait = max(wait_requests, wait_tokens)
    if wait > 0:
        return wait
    state.request_tat, state.token_tat = request_tat, token_tat
    if now - state.window_start >= 1.0:
        state.previous_count = state.window_count if now - state.window_start < 2.0 else 0
        state.window_start, state.window_count = now, 0
    state.window_count += 1
    return 0.0


def rate_limited(state: LimitState, now: float, *, seconds: float | None, base_s: float, cap_s: float) -> None:
    """A 429: start or extend the shared wait, and halve the request rate once per wait."""
    if state.pause_until <= now:  # the first 429 of this wait
        rate = 1.0 / state.auto_interval if state.auto_interval else observed_rate(state, now)
        state.auto_interval = min(AUTO_MAX_INTERVAL_S, 1.0 / max(rate * AIMD_DECREASE, 1.0 / AUTO_MAX_INTERVAL_S))
    if seconds is None:
        seconds = min(cap_s, base_s * 2 ** state.backoff_step)
        state.backoff_step += 1
    state.pause_until = max(state.pause_until, now + seconds)


def succeeded(state: LimitState) -> None:
    """A request went through: the doubling starts again from base, and the rate creeps up."""
    state.backoff_step = 0
    if state.auto_interval:
        state.auto_interval /= AIMD_INCREASE
        if state.auto_interval < AUTO_OFF_BELOW_S:
            state.auto_interval = 0.0
