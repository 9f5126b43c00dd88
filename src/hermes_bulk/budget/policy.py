"""The budget's rules, pure: which calls count, and what one admission decides.

Both ledgers apply `decide` inside their one atomic operation (the SQLite ledger calls it inside
its transaction; `lua/admit_request.lua` is its line-by-line mirror, and the contract suite
holds both to it), so the rule is written once here and nowhere else in Python.

The rule (DESIGN.md invariant 8):
- chat and auxiliary calls are always allowed, and count;
- a background call (cron, bulk) whose model counts is over the cap when the window's counted
  total has reached `daily_limit - chat_reserve`, or its cron job has reached `job_limit`;
  over the cap it is `held` in enforce mode (not sent, not counted) or `would_block` in observe
  mode (sent, and counted, since it reaches the provider);
- a call whose model matches none of `models` is recorded but does not count, and is never held.

Counting the total, not only background calls, against the background cap is what keeps the
reserve for people: chat that has eaten into the quota leaves cron less, never more.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

CHAT, CRON, AUXILIARY, BULK = "chat", "cron", "auxiliary", "bulk"
CALL_CLASSES = (CHAT, CRON, AUXILIARY, BULK)
BACKGROUND = (CRON, BULK)

ALLOWED, HELD, WOULD_BLOCK, FAILED_OPEN = "allowed", "held", "would_block", "failed_open"

OBSERVE, ENFORCE = "observe", "enforce"


@dataclass(frozen=True, slots=True)
class Terms:
    """What one admission needs to know of the settings, resolved for this call."""

    counted: bool  # the model matches `models`
    enforce: bool
    background_cap: int  # daily_limit - chat_reserve
    job_cap: int | None  # job_limit, for cron calls with a job id; None = no cap


def model_counts(model: str | None, globs: tuple[str, ...]) -> bool:
    """Whether a model name counts toward the budget; an unknown model counts (the safe side)."""
    if not model:
        return True
    name = model.lower()
    return any(fnmatch.fnmatchcase(name, g.lower()) for g in globs)


def terms_for(
    call_class: str,
    model: str | None,
    job_id: str | None,
    *,
    mode: str,
    daily_limit: int,
    chat_reserve: int,
    job_limit: int | None,
    models: tuple[str, ...],
) -> Terms:
    return Terms(
        counted=model_counts(model, models),
        enforce=mode == ENFORCE,
        background_cap=max(0, daily_limit - chat_reserve),
        job_cap=job_limit if call_class == CRON and job_id else None,
    )


def decide(call_class: str, terms: Terms, *, window_total: int, job_requests: int) -> str:
    """The decision for one call, given the window's counted total and its job's count so far."""
    if call_class not in BACKGROUND or not terms.counted:
        return ALLOWED
    over = window_total >= terms.background_cap or (
        terms.job_cap is not None and job_requests >= terms.job_cap
    )
    if not over:
        return ALLOWED
    return HELD if terms.enforce else WOULD_BLOCK


def counts_toward_total(decision: str, terms: Terms) -> bool:
    """A call counts when its model counts and it reaches the provider (held calls do not)."""
    return terms.counted and decision in (ALLOWED, WOULD_BLOCK)
