"""The budget as the plugin, the bulk gate and the commands use it: admit a call, report a window.

`Budget.admit` never raises. Settings come from budget.json (re-read when it changes, so a
`set` in one process reaches a running gateway at its next call); the window from the settings
and the clock; the decision from the ledger's one atomic admission. If any of that fails, the
call goes through (decision `failed_open`), the failure is noted for `status` until the window
ends, and the ledger is left alone for RETRY_AFTER_S so an outage does not slow every call.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, HermesBulkError
from ..redact import public_url
from . import policy
from .failopen import FailOpenNote, FailOpenNotes
from .ledger import Admission, CallRecord, RequestLedger, WindowCounts
from .ledger_location import ledger_file_missing, open_ledger
from .settings import BudgetSettings, SettingsFile, ledger_location
from .windows import Window, ZonedInstant, window_at

log = logging.getLogger("hermes_bulk.budget")

#: After the ledger failed, calls skip it (and go through, noted) for this long.
RETRY_AFTER_S = 2.0

HELD_FOR_WINDOW, HELD_FOR_JOB_LIMIT = "window", "job_limit"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one call."""

    decision: str
    window: Window | None
    settings: BudgetSettings
    admission: Admission | None = None  # None when failed open

    @property
    def held(self) -> bool:
        return self.decision == policy.HELD

    @property
    def held_because(self) -> str:
        """Why an over-cap call was stopped: the window's background cap, or its job's job_limit."""
        a = self.admission
        if a is not None and a.window_total < self.settings.background_cap:
            return HELD_FOR_JOB_LIMIT
        return HELD_FOR_WINDOW

    @property
    def first_held_run(self) -> bool:
        """This call belongs to its job's first held run in the window (that one says why)."""
        return self.held and self.admission is not None and self.admission.job_held_runs <= 1


@dataclass(frozen=True)
class Report:
    """Everything `status` shows."""

    settings: BudgetSettings
    window: Window
    counts: WindowCounts | None  # None when the ledger could not be read
    failopen: FailOpenNote | None
    ledger: str  # where the ledger is, fit to print
    ledger_error: str | None
    now_s: float
    settings_error: str | None = (
        None  # budget.json cannot be used: the defaults are shown, calls fail open
    )


class Budget:
    """One budget directory (budget.json, the fail-open note, and by default the SQLite ledger)."""

    def __init__(
        self,
        directory: Path,
        *,
        clock: Callable[[], float] = time.time,
        ledger_factory: Callable[[str], RequestLedger] = open_ledger,
    ) -> None:
        self.directory = directory
        self.settings_file = SettingsFile(directory)
        self.notes = FailOpenNotes(directory)
        self.clock = clock
        self._ledger_factory = ledger_factory
        self._lock = threading.Lock()
        self._settings: BudgetSettings | None = None
        self._settings_mtime_ns = -1
        self._ledger: RequestLedger | None = None
        self._ledger_at = ""
        self._skip_until = 0.0
        self._skip_reason = ""

    # Settings and ledger, kept current ------------------------------------------------------
    def settings(self) -> BudgetSettings:
        """budget.json as it is now (re-read only when it changed); ConfigError if it is bad."""
        mtime = self.settings_file.mtime_ns()
        with self._lock:
            if self._settings is None or mtime != self._settings_mtime_ns:
                self._settings = self.settings_file.load()
                self._settings_mtime_ns = mtime
            return self._settings

    def settings_in_force(self) -> tuple[BudgetSettings, str | None]:
        """budget.json's settings; or, when it cannot be used, the defaults and why (for status)."""
        try:
            return self.settings(), None
        except ConfigError as exc:
            return BudgetSettings(), str(exc)

    def ledger(self, settings: BudgetSettings) -> RequestLedger:
        location = ledger_location(settings, self.directory)
        with self._lock:
            if self._ledger is None or location != self._ledger_at:
                if self._ledger is not None:
                    self._ledger.close()
                    self._ledger = None
                self._ledger = self._ledger_factory(location)
                self._ledger_at = location
            return self._ledger

    def window(self, settings: BudgetSettings, at_s: float | None = None) -> Window:
        return window_at(self.clock() if at_s is None else at_s, settings.reset, settings.zone)

    # Admission ------------------------------------------------------------------------------
    def admit(self, call: CallRecord) -> Outcome:
        """Decide on one provider request and count it; never raises (fails open)."""
        settings, window = BudgetSettings(), None
        try:
            settings = self.settings()
            window = self.window(settings)
            if self.clock() < self._skip_until:
                return self._failed_open(settings, window, self._skip_reason)
            terms = policy.terms_for(
                call.call_class,
                call.model,
                call.job_id,
                mode=settings.mode,
                daily_limit=settings.daily_limit,
                chat_reserve=settings.chat_reserve,
                job_limit=settings.job_limit,
                models=settings.models,
            )
            admission = self.ledger(settings).admit(call, window, terms)
        except HermesBulkError as exc:
            return self._failed_open(settings, window, self._skip_for_a_while(str(exc)))
        except Exception as exc:  # a budget must never stop an agent: log it, let the call through
            log.exception("cron-budget accounting failed")
            return self._failed_open(
                settings, window, self._skip_for_a_while(f"internal error ({type(exc).__name__})")
            )
        return Outcome(admission.decision, window, settings, admission)

    def take_back(self, call: CallRecord, outcome: Outcome) -> None:
        """The call admitted with outcome never reached the provider: if it was counted, its
        count goes back (in the window it was counted in). Never raises: a take-back that fails
        leaves the call counted, which errs on the side of the reserve."""
        if outcome.admission is None or not outcome.admission.counted or outcome.window is None:
            return
        try:
            self.ledger(outcome.settings).take_back(call, outcome.window)
        except Exception:
            log.warning("cron-budget: a request never sent stays counted", exc_info=True)

    def _skip_for_a_while(self, reason: str) -> str:
        self._skip_reason = reason
        self._skip_until = self.clock() + RETRY_AFTER_S
        return reason

    def _failed_open(self, settings: BudgetSettings, window: Window | None, reason: str) -> Outcome:
        if window is None:
            try:
                window = self.window(BudgetSettings())
            except Exception:  # the machine's zone data itself is unusable
                window = None
        if window is not None:
            self.notes.note(window.start_s, reason)
        log.warning("cron-budget: accounting failed, call allowed uncounted: %s", reason)
        return Outcome(policy.FAILED_OPEN, window, settings)

    # Reading --------------------------------------------------------------------------------
    def report(self) -> Report:
        """The current window's counts; a ledger or a budget.json that cannot be read is reported,
        not raised.

        With a broken budget.json every call fails open (its settings are unknown), so the
        defaults shown here are what status can say, marked as such, with the file's error.
        """
        settings, settings_error = self.settings_in_force()
        window = self.window(settings)
        counts, error = None, None
        location = ledger_location(settings, self.directory)
        try:
            # A look at the budget on a fresh machine makes no ledger file (the first count does).
            counts = (
                WindowCounts(window.start_s)
                if ledger_file_missing(location)
                else self.ledger(settings).counts(window)
            )
        except HermesBulkError as exc:
            error = str(exc)
        return Report(
            settings=settings,
            window=window,
            counts=counts,
            failopen=self.notes.read_since(window.start_s),
            ledger=public_url(location),
            ledger_error=error,
            now_s=self.clock(),
            settings_error=settings_error,
        )

    def background_held_until(self, model: str | None) -> ZonedInstant | None:
        """When background calls of this model may go again, if the window's cap holds them now
        (in the budget's zone, which is how a user is shown it)."""
        try:
            settings = self.settings()
            if settings.mode != policy.ENFORCE or not policy.model_counts(model, settings.models):
                return None
            window = self.window(settings)
            if self.ledger(settings).counts(window).total >= settings.background_cap:
                return ZonedInstant(window.end_s, window.zone)
        except Exception:  # status must not fail because the budget cannot be read
            log.debug("cron-budget: cannot tell whether background work is held", exc_info=True)
        return None

    def close(self) -> None:
        with self._lock:
            if self._ledger is not None:
                self._ledger.close()
                self._ledger = None
