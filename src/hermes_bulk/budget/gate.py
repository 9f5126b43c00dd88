"""The budget as a bulk job sees it: `BudgetGate`, the pipeline's RequestGate.

Each model request of a bulk job is charged as class `bulk` before it is sent. When the window's
background cap is reached in enforce mode the request is not sent: `admit` returns the seconds
until the window reopens, the pipeline gives the item back, and the job waits (its status says
until when) instead of failing items. Accounting failures let the request through (fail open).

Hermes' `ctx.llm` calls are not seen by the cron-budget middleware, and in Hermes 0.19.0 the
plugin counts them through an auxiliary-call observer instead; a request this gate has already
charged is marked (`mark_precharged`) so that observer does not count it a second time.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

from ..store.protocol import JobRecord
from .ledger import CallRecord
from .policy import BULK
from .service import Budget
from .settings import LEDGER_ENV, LEDGER_FILE, SETTINGS_FILE, budget_dir

#: A held request asks again after at least this long (a window's end seen from a skewed clock).
MIN_HOLD_S = 1.0

_precharged = threading.local()


def mark_precharged() -> None:
    """The next auxiliary-call observation on this thread was charged already (as bulk)."""
    _precharged.pending = True


def take_precharged() -> bool:
    """True once after mark_precharged on this thread: the observer skips that call."""
    pending = getattr(_precharged, "pending", False)
    _precharged.pending = False
    return pending


class BudgetGate:
    """pipeline.RequestGate over a Budget: one bulk request charged per model request."""

    def __init__(self, budget: Budget, *, profile: str = "") -> None:
        self.budget = budget
        self.profile = profile or socket.gethostname()  # hermes-bulk workers are told apart by host

    def admit(self, job: JobRecord) -> float:
        spec = job.spec
        take_precharged()  # a mark left by a ctx.llm call that failed (unseen) must not carry over
        outcome = self.budget.admit(CallRecord(
            call_class=BULK, profile=self.profile, job_id=spec.job_id, job_name="bulk job",
            provider="hermes" if spec.client == "hermes" else "openai-compatible",
            model=spec.model or "", api_mode="chat_completions"))
        if outcome.held and outcome.window is not None:
            return max(MIN_HOLD_S, outcome.window.end_s - self.budget.clock())
        if spec.client == "hermes":
            mark_precharged()
        return 0.0

    def held_until(self, job: JobRecord) -> float | None:
        return self.budget.background_held_until(job.spec.model)


def gate_from_environment(root: Path | None = None, *, profile: str = "") -> BudgetGate | None:
    """A BudgetGate for this machine's budget, or None when no budget is configured.

    Configured means: HERMES_BULK_BUDGET_LEDGER is set, or the budget directory
    (`<root Hermes home>/plugin-data/cron-budget/`, root from HERMES_HOME as Hermes resolves it)
    holds budget.json or a ledger that the cron-budget plugin has been counting in.
    """
    directory = budget_dir(root)
    if not (os.environ.get(LEDGER_ENV, "").strip() or _exists(directory / SETTINGS_FILE)
            or _exists(directory / LEDGER_FILE)):
        return None
    return BudgetGate(Budget(directory), profile=profile)


def _exists(path: Path) -> bool:
    """A budget this user cannot even look at (another user's home) is not this user's budget."""
    try:
        return path.exists()
    except OSError:
        return False
