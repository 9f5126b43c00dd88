"""The budget as a bulk job sees it: `BudgetGate`, the pipeline's RequestGate.

Each model request of a bulk job is charged as class `bulk` before it is sent. When the window's
background cap is reached in enforce mode the request is not sent: `admit` returns the seconds
until the window reopens, the pipeline gives the item back, and the job waits (its status says
until when) instead of failing items. Accounting failures let the request through (fail open).

The gate follows the budget as it is now, not as it was when the process started: before each
request it looks (a stat or two, no read) whether a budget is configured, so a budget set up or
switched to enforce while a gateway or worker runs holds that process's next request. The
Budget itself re-reads budget.json when it changes.

Hermes' `ctx.llm` calls are not seen by the cron-budget middleware, and in Hermes 0.19.0 the
plugin counts them through an auxiliary-call observer instead; a request this gate has already
charged is marked (`mark_precharged`) so that observer does not count it a second time.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..config.provider import ANTHROPIC
from ..store.protocol import JobRecord
from ..words import count
from .ledger import CallRecord
from .policy import BULK
from .service import Budget, Outcome
from .settings import LEDGER_ENV, LEDGER_FILE, SETTINGS_FILE, budget_dir
from .windows import ZonedInstant

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


def hold_s(outcome: Outcome, now: float) -> float:
    """How long a bulk request waits: 0 when it may go; held, until its window reopens, and at
    least MIN_HOLD_S. A hold with no window (none was read) lets it go: the budget failed open."""
    if not outcome.held or outcome.window is None:
        return 0.0
    return max(MIN_HOLD_S, outcome.window.end_s - now)


@dataclass(frozen=True)
class Hold:
    """Why the budget holds a request, and until when (in the budget's zone)."""

    until: ZonedInstant
    why: str


def budget_hold(gate: BudgetGate, call: CallRecord) -> Hold | None:
    """Charge one request that is no job's (doctor's check) as bulk: None when it may be sent
    (counted, and marked so Hermes' observer does not count it again), else why it is held."""
    outcome = gate.charge(call, precharge=True)
    if outcome is None or not outcome.held or outcome.window is None:
        return None
    s, a, w = outcome.settings, outcome.admission, outcome.window
    until = ZonedInstant(w.end_s, w.zone)
    used = (
        f"this window has used {a.window_total} of its {count(s.daily_limit, 'request')}, "
        if a
        else ""
    )
    return Hold(
        until,
        f"the request budget holds bulk requests until {until.shown(gate.budget.clock())}: "
        f"{used}and cron and bulk stop at {s.background_cap} ({s.chat_reserve} kept for chat)",
    )


def route_of(job: JobRecord) -> tuple[str, str]:
    """(provider, API mode) of a job's requests as far as the job says: a hermes-bulk endpoint's
    protocol (Claude's Messages API, or OpenAI-compatible chat completions). Jobs made in Hermes
    go where Hermes' model is configured: the plugin gives its gate a describe of its own."""
    if job.spec.client == "hermes" and job.spec.protocol != ANTHROPIC:
        return "hermes", "unknown"
    return protocol_route(job.spec.protocol)


def protocol_route(protocol: str | None) -> tuple[str, str]:
    """(provider, API mode) of a request to an endpoint of Bulk's own, by its protocol."""
    if protocol == ANTHROPIC:
        return ANTHROPIC, "anthropic_messages"
    return "openai-compatible", "chat_completions"


def _never() -> bool:
    return False


class BudgetGate:
    """pipeline.RequestGate over the budget in one directory: one bulk request charged per model
    request while a budget is configured there; every request goes uncharged while none is.

    `counting_here` says whether this process counts requests anyway (the cron-budget plugin is
    loaded): then a budget counts from the first request, and a bulk request must be charged here
    as bulk, or the plugin's observer would count it as auxiliary.
    """

    def __init__(
        self,
        directory: Path,
        *,
        profile: str = "",
        counting_here: Callable[[], bool] = _never,
        budget: Budget | None = None,
        describe: Callable[[JobRecord], tuple[str, str]] | None = None,
    ) -> None:
        self.directory = directory
        #: (provider, API mode) of a job's requests, as the ledger records them
        self.describe = describe or route_of
        # Looked for before every request, so joined once, as plain strings. os.path.exists is
        # False where this user cannot look (another user's home): such a budget is not this user's.
        self._budget_files = (
            os.path.join(directory, SETTINGS_FILE),
            os.path.join(directory, LEDGER_FILE),
        )
        self.profile = profile or socket.gethostname()  # hermes-bulk workers are told apart by host
        self.counting_here = counting_here
        self._budget = budget
        self._lock = threading.Lock()
        self._last = threading.local()  # the request admitted last on each thread

    @property
    def budget(self) -> Budget:
        with self._lock:
            if self._budget is None:
                self._budget = Budget(self.directory)
            return self._budget

    def close(self) -> None:
        """Close the budget's ledger, if this gate opened one."""
        with self._lock:
            budget, self._budget = self._budget, None
        if budget is not None:
            budget.close()

    def configured(self) -> bool:
        """Whether a budget applies now: HERMES_BULK_BUDGET_LEDGER is set, this process counts
        (counting_here), or the budget directory holds budget.json or a ledger someone counts in."""
        return bool(
            os.environ.get(LEDGER_ENV, "").strip()
            or self.counting_here()
            or any(map(os.path.exists, self._budget_files))
        )

    def admit(self, job: JobRecord) -> float:
        take_precharged()  # a mark left by a ctx.llm call that failed (unseen) must not carry over
        outcome = self.charge(self.call_of(job), precharge=job.spec.client == "hermes")
        return 0.0 if outcome is None else hold_s(outcome, self.budget.clock())

    def call_of(self, job: JobRecord) -> CallRecord:
        """The ledger record of one request of job: the provider and API mode it goes to."""
        spec = job.spec
        provider, api_mode = self.describe(job)
        return CallRecord(
            call_class=BULK,
            profile=self.profile,
            job_id=spec.job_id,
            job_name="bulk job",
            provider=provider,
            model=spec.model or "",
            api_mode=api_mode,
        )

    def charge(self, call: CallRecord, *, precharge: bool = False) -> Outcome | None:
        """Admit one request (None: no budget is configured, it goes uncharged). When it may go,
        it is remembered on this thread for not_sent, and with precharge the auxiliary-call
        observer is told it is counted already (a ctx.llm call)."""
        self._last.admitted = None
        if not self.configured():
            return None
        outcome = self.budget.admit(call)
        if hold_s(outcome, self.budget.clock()):
            return outcome
        self._last.admitted = (call, outcome)
        if precharge:
            mark_precharged()
        return outcome

    def doctor_call(self, model: str, provider: str, api_mode: str) -> CallRecord:
        """The ledger record of doctor's one check request: a bulk request of no job."""
        return CallRecord(
            call_class=BULK,
            profile=self.profile,
            provider=provider,
            model=model or "",
            api_mode=api_mode,
        )

    def not_sent(self, job: JobRecord | None = None) -> None:
        """The request admitted last on this thread (for job, when one is named) never reached
        the provider: its count is taken back. A provider counts what it received."""
        admitted, self._last.admitted = getattr(self._last, "admitted", None), None
        take_precharged()  # nothing reached Hermes' observer either
        if admitted is None or (job is not None and admitted[0].job_id != job.spec.job_id):
            return
        self.budget.take_back(*admitted)

    def held_until(self, job: JobRecord) -> ZonedInstant | None:
        if not self.configured():
            return None
        return self.budget.background_held_until(job.spec.model)


def gate_from_environment(
    root: Path | None = None,
    *,
    profile: str = "",
    counting_here: Callable[[], bool] = _never,
    describe: Callable[[JobRecord], tuple[str, str]] | None = None,
) -> BudgetGate:
    """The BudgetGate of this machine's budget: `<root Hermes home>/plugin-data/cron-budget/`
    (root from HERMES_HOME as Hermes resolves it), or HERMES_BULK_BUDGET_LEDGER. It charges
    nothing until a budget is configured there, and follows it from the next request once one is."""
    return BudgetGate(
        budget_dir(root), profile=profile, counting_here=counting_here, describe=describe
    )
