"""The request ledger: what a ledger does, and its records (budget/ledgers.py opens one).

A ledger holds, per quota window, counters and a record of every provider request: time,
profile, class, cron job id and name, provider, model, API mode and decision. Never message
text. `sqlite_ledger.py` (one file, shared by every profile on a machine) and
`redis_ledger.py` (shared by every machine) implement it; `tests/budget/test_ledger_contract.py`
holds both to it.

Counters are named the same on both backends (a window's counters are one flat mapping):

    calls                    every call recorded in the window, counted or not
    total                    counted requests in the window, all classes
    class:<class>            counted requests of one class (chat, cron, auxiliary, bulk)
    profile:<profile>        counted requests of one Hermes profile
    decision:<decision>      calls by decision (allowed, held, would_block), counted or not
    uncounted                calls whose model matches none of `models` (the globs in force
                             when each call was made)
    not_sent                 counted calls taken back: they never reached the provider
    job:<id>:requests        counted requests of one job
    job:<id>:held            held calls of one job
    job:<id>:held_runs       distinct runs of the job that were held
    job:<id>:would_block_runs  distinct runs of the job that would have been held
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from ..errors import BackendUnavailable
from .policy import CALL_CLASSES, HELD, WOULD_BLOCK, Terms
from .windows import Window

#: Records and counters are kept this long after their window ended, then dropped.
KEEP_AFTER_WINDOW_S = 7 * 86_400


class LedgerUnavailable(BackendUnavailable):
    """The ledger could not answer in time (database locked, Redis down); callers fail open."""


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One provider request as the ledger keeps it. Never message text."""

    call_class: str  # chat | cron | auxiliary | bulk
    profile: str = ""
    job_id: str = ""  # the cron job's id, or the bulk job's
    job_name: str = ""
    run_id: str = ""  # one run of a job (the cron session id): held and would-block runs count once
    provider: str = ""
    model: str = ""
    api_mode: str = ""

    def __post_init__(self) -> None:
        if self.call_class not in CALL_CLASSES:
            raise ValueError(f"unknown call class {self.call_class!r}")


@dataclass(frozen=True, slots=True)
class Admission:
    """What one admission decided, and the counts right after it."""

    decision: str
    counted: bool
    window_total: int  # counted requests in the window, this one included if it counted
    job_requests: int  # counted requests of this call's job (0 without a job)
    job_held_runs: int  # distinct held runs of this call's job, this one included


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """A stored record of one call, with what was decided."""

    at: float
    window_start_s: int
    call: CallRecord
    decision: str
    counted: bool


@dataclass(frozen=True, slots=True)
class JobCounts:
    job_id: str
    call_class: str
    name: str
    requests: int
    held: int
    held_runs: int
    would_block_runs: int


@dataclass(frozen=True)
class WindowCounts:
    """A window's counters (names in the module docstring) and the names of its jobs."""

    window_start_s: int
    counters: dict[str, int] = field(default_factory=dict)
    job_names: dict[str, tuple[str, str]] = field(default_factory=dict)  # id -> (class, name)

    def get(self, key: str) -> int:
        return self.counters.get(key, 0)

    @property
    def total(self) -> int:
        return self.get("total")

    def by_class(self) -> dict[str, int]:
        return {c: self.get(f"class:{c}") for c in CALL_CLASSES}

    def by_profile(self) -> dict[str, int]:
        return {
            k.split(":", 1)[1]: v
            for k, v in sorted(self.counters.items())
            if k.startswith("profile:")
        }

    def decisions(self, decision: str) -> int:
        return self.get(f"decision:{decision}")

    def jobs(self) -> list[JobCounts]:
        ids = set(self.job_names)
        ids.update(k.split(":")[1] for k in self.counters if k.startswith("job:"))
        rows = []
        for job_id in ids:
            call_class, name = self.job_names.get(job_id, ("", ""))
            rows.append(
                JobCounts(
                    job_id=job_id,
                    call_class=call_class,
                    name=name,
                    requests=self.get(f"job:{job_id}:requests"),
                    held=self.get(f"job:{job_id}:held"),
                    held_runs=self.get(f"job:{job_id}:held_runs"),
                    would_block_runs=self.get(f"job:{job_id}:would_block_runs"),
                )
            )
        return sorted(rows, key=lambda j: (-j.requests, -j.held_runs, j.job_id))


def counter_updates(call: CallRecord, decision: str, counted: bool) -> list[str]:
    """The counters one call increments (runs are counted separately, once per distinct run)."""
    keys = ["calls", f"decision:{decision}"]
    if counted:
        keys += ["total", f"class:{call.call_class}", f"profile:{call.profile or 'default'}"]
        if call.job_id:
            keys.append(f"job:{call.job_id}:requests")
    elif decision != HELD:
        keys.append("uncounted")
    if decision == HELD and call.job_id:
        keys.append(f"job:{call.job_id}:held")
    return keys


#: The decision a take-back records (its record, beside the call's own).
NOT_SENT = "not_sent"


def counters_taken_back(call: CallRecord) -> list[str]:
    """The counters a counted call incremented that a take-back decrements (take_back)."""
    keys = ["total", f"class:{call.call_class}", f"profile:{call.profile or 'default'}"]
    if call.job_id:
        keys.append(f"job:{call.job_id}:requests")
    return keys


def run_counter(call: CallRecord, decision: str) -> str | None:
    """The distinct-run counter a held or would-block call of a job run feeds, if any."""
    if not call.job_id or decision not in (HELD, WOULD_BLOCK):
        return None
    return f"job:{call.job_id}:{'held_runs' if decision == HELD else 'would_block_runs'}"


class RequestLedger(Protocol):
    """Counts and records provider requests per window; admission is one atomic operation."""

    location: str  # where it is (a path, or redis host:port), never credentials

    def admit(self, call: CallRecord, window: Window, terms: Terms) -> Admission:
        """Atomically decide (policy.decide) on the window's counts so far, count, and record.

        Under any concurrency across threads, processes and machines: the counted total never
        passes what `decide` allows (a background call is only counted while the total is below
        terms.background_cap, and a cron job's while its requests are below terms.job_cap);
        chat and auxiliary calls are always allowed and counted; every call is recorded.
        Raises LedgerUnavailable when the ledger cannot answer within its short timeout.
        """

    def take_back(self, call: CallRecord, window: Window) -> None:
        """A call this window counted never reached the provider (no connection was made, or it
        was refused before it was sent): atomically, its counts go back (counters_taken_back,
        never below 0), `not_sent` counts it, and a record with decision NOT_SENT says so.
        Raises LedgerUnavailable as admit does."""

    def counts(self, window: Window) -> WindowCounts:
        """The window's counters and job names (empty when nothing was recorded in it)."""

    def entries(self, window: Window, limit: int = 1000) -> list[LedgerEntry]:
        """The window's oldest records, in admission order (at most limit)."""

    def close(self) -> None:
        """Release connections."""
