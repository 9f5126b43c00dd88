"""The arithmetic of the shared limiter, on one provider key's state (no I/O).

SqliteLimits runs these functions inside one BEGIN IMMEDIATE transaction; the Redis Lua
scripts (store/redis/lua/acquire.lua, pause.lua, clear_backoff.lua) implement the same rules and
the contract suite holds both to them.

- Pacing is GCRA (generic cell rate) with a burst of one unit: requests, and tokens, are spaced
  evenly at the rate, so a provider limit is met without bouncing off it. A cost larger than
  the burst goes through when the bucket is empty, so one large item never blocks forever.
- A 429 starts (or extends, never shortens) the shared wait: Retry-After, else
  base · 2^step up to the cap, the step growing once per generation of requests (below):
  sixteen 429s to one burst wait base once, not base · 2^15.
- Adaptive pacing: a 429 halves the request rate the key was seeing (its learned rate, else
  the rate measured over about the last second, or over the last window's age when a request
  took longer), once per generation of requests: only a 429
  to a request granted after the last decrease counts (every grant carries the key's count
  of decreases, its epoch), as TCP halves its window once per round trip. 429s to requests
  sent before the decrease arrive later, often after a short wait has ended, and say nothing
  about the new rate.
  From the end of the wait the learned rate doubles every AUTO_RECOVERY_DOUBLING_S until
  pacing switches itself off. Without it, every worker released at the end of a short wait
  hits the provider at once and earns the next 429; recovering by time, not per success,
  keeps a slow job from crawling for minutes after one 429.
"""

from __future__ import annotations

from dataclasses import dataclass

AIMD_DECREASE = 0.5  #: a 429 multiplies the request rate by this
AUTO_RECOVERY_DOUBLING_S = 5.0  #: after a wait, the learned rate doubles this often
AUTO_MAX_INTERVAL_S = 60.0  #: adaptive pacing never goes below one request a minute
AUTO_OFF_BELOW_S = 0.001  #: above 1,000 requests a second adaptive pacing switches itself off


@dataclass
class LimitState:
    """One provider key's state; SQLite keeps it in the `limits` columns COLUMNS (values()
    order)."""

    request_tat_s: float = 0.0  # theoretical arrival time of the next request (GCRA)
    token_tat_s: float = 0.0
    pause_until_s: float = 0.0
    backoff_step: int = 0
    auto_interval_s: float = 0.0  # seconds between requests learned at the last 429; 0 = off
    auto_since_s: float = 0.0  # when that interval started to relax (the end of the wait)
    window_start_s: float = 0.0  # a one-second window counting granted requests
    window_count: int = 0
    previous_count: int = 0  # the count of the window before
    decreases: int = 0  # adaptive decreases so far: the epoch a grant carries

    #: The stored names (a contract of the store's data, so they keep their unit-less spelling).
    COLUMNS = (
        "request_tat",
        "token_tat",
        "pause_until",
        "backoff_step",
        "auto_interval",
        "auto_since",
        "window_start",
        "window_count",
        "previous_count",
        "decreases",
    )

    def values(self) -> tuple:
        return (
            self.request_tat_s,
            self.token_tat_s,
            self.pause_until_s,
            self.backoff_step,
            self.auto_interval_s,
            self.auto_since_s,
            self.window_start_s,
            self.window_count,
            self.previous_count,
            self.decreases,
        )


def gcra(tat_s: float, now_s: float, interval_s: float, cost: int) -> tuple[float, float]:
    """(new theoretical arrival time, seconds to wait)."""
    if interval_s <= 0 or cost <= 0:
        return tat_s, 0.0
    if tat_s > now_s:
        return tat_s, tat_s - now_s
    return now_s + interval_s * cost, 0.0


def observed_rate_per_s(state: LimitState, now_s: float) -> float:
    """Requests granted over about the last second (a sliding-window estimate); once the last
    window is over a second old, its requests over the time since it began. A request slower
    than a second (a slow provider, a loaded machine) then leaves its 429 the rate it really
    saw, not one that decays to zero, which paced the key to AUTO_MAX_INTERVAL_S."""
    elapsed_s = now_s - state.window_start_s
    if elapsed_s >= 1.0:
        return state.window_count / elapsed_s
    return state.previous_count * (1.0 - elapsed_s) + state.window_count


def auto_interval_s(state: LimitState, now_s: float) -> float:
    """The learned interval now: it halves every AUTO_RECOVERY_DOUBLING_S after the wait."""
    if not state.auto_interval_s:
        return 0.0
    interval_s = state.auto_interval_s * 2.0 ** (
        -max(0.0, now_s - state.auto_since_s) / AUTO_RECOVERY_DOUBLING_S
    )
    return interval_s if interval_s >= AUTO_OFF_BELOW_S else 0.0


def acquire(
    state: LimitState, now_s: float, *, rpm: int | None, tpm: int | None, tokens: int
) -> float:
    """0.0 and state updated when a request may go now; else the seconds to wait (state as was)."""
    if state.pause_until_s > now_s:
        return state.pause_until_s - now_s
    learned_s = auto_interval_s(state, now_s)
    if state.auto_interval_s and not learned_s:
        state.auto_interval_s = 0.0  # relaxed all the way: adaptive pacing is off again
    interval_s = max(60.0 / rpm if rpm else 0.0, learned_s)
    request_tat_s, requests_wait_s = gcra(state.request_tat_s, now_s, interval_s, 1)
    token_tat_s, tokens_wait_s = gcra(state.token_tat_s, now_s, 60.0 / tpm if tpm else 0.0, tokens)
    wait_s = max(requests_wait_s, tokens_wait_s)
    if wait_s > 0:
        return wait_s
    state.request_tat_s, state.token_tat_s = request_tat_s, token_tat_s
    count(state, now_s)
    return 0.0


def unpaced(state: LimitState, now_s: float, *, rpm: int | None, tpm: int | None) -> bool:
    """True when acquire would grant at once and change nothing but the request count."""
    return (
        not rpm and not tpm and not auto_interval_s(state, now_s) and state.pause_until_s <= now_s
    )


def clean(state: LimitState) -> bool:
    """No backoff step: a success would change nothing (see succeeded)."""
    return not state.backoff_step


def count(state: LimitState, now_s: float, n: int = 1) -> None:
    """Record n granted requests in the one-second window that observed_rate_per_s reads."""
    if now_s - state.window_start_s >= 1.0:
        state.previous_count = state.window_count if now_s - state.window_start_s < 2.0 else 0
        state.window_start_s, state.window_count = now_s, 0
    state.window_count += n


def backoff_wait_s(state: LimitState, *, base_s: float, cap_s: float, doubling: bool) -> float:
    """The wait for a 429 without Retry-After: base · 2^step up to the cap for the first 429 of
    a generation (which then grows the step); a 429 to a request sent before that one (a stale
    one) gets the wait already chosen, base · 2^(step-1), so one burst doubles the wait once."""
    step = state.backoff_step if doubling else max(0, state.backoff_step - 1)
    return min(cap_s, base_s * 2**step)


def rate_limited(
    state: LimitState,
    now_s: float,
    *,
    retry_after_s: float | None,
    base_s: float,
    cap_s: float,
    epoch: int,
) -> None:
    """A 429 to a request granted at `epoch`: start or extend the shared wait, and, if the
    request was granted after the last decrease (the first 429 of its generation), halve the
    request rate and double the next wait without Retry-After (backoff_wait_s)."""
    decrease = epoch == state.decreases
    if decrease:
        learned_s = auto_interval_s(state, now_s)
        rate_per_s = 1.0 / learned_s if learned_s else observed_rate_per_s(state, now_s)
        state.auto_interval_s = min(
            AUTO_MAX_INTERVAL_S, 1.0 / max(rate_per_s * AIMD_DECREASE, 1.0 / AUTO_MAX_INTERVAL_S)
        )
        state.decreases += 1
    if retry_after_s is None:
        retry_after_s = backoff_wait_s(state, base_s=base_s, cap_s=cap_s, doubling=decrease)
        if decrease:
            state.backoff_step += 1
    state.pause_until_s = max(state.pause_until_s, now_s + retry_after_s)
    if decrease:
        state.auto_since_s = state.pause_until_s  # relaxing starts when the wait is over


def succeeded(state: LimitState) -> None:
    """A request went through: the next wait without Retry-After starts from base again."""
    state.backoff_step = 0
