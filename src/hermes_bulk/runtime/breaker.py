"""The circuit breaker of an endpoint: when no item can succeed there, the job pauses.

An endpoint that is down, a key it refuses or a model it does not know fails every item alike;
retrying each item and failing it one by one costs hours on a large job and leaves a job to
retry by hand. The breaker tells those apart from an item's own failures:

- a refused key (HTTP 401/403) or an unknown model or endpoint (HTTP 404) trips it at once;
- failures to connect trip it after `failures` in a row, counted at most once every
  `spacing_s` (a second, as often as an item tries again): sixteen parallel requests failing
  in the same moment are one failure, so N failures mean the endpoint could not be reached
  for N - 1 seconds at least, whatever the concurrency, and a shorter blip pauses nothing.
  Any HTTP answer from the endpoint, even an error status, resets the count.

A trip pauses the job with a reason that names the endpoint and what to do (`pause_reason`);
the item goes back to pending uncharged. The count is kept per process (see docs/decisions.md,
"When the endpoint is down"): whether a connection can be made is a fact of the machine's own
network path, and a 401 or 404 trips at once wherever it is seen.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import EndpointRedirects, EndpointUnreachable, HermesBulkError, ModelError
from ..store.protocol import PAUSED, RUNNING, Event, JobStore

DEFAULT_FAILURES = 5
#: Failures to connect closer together than this count once (an item tries again a second later).
SPACING_S = 1.0
#: HTTP statuses that say no item of the job can succeed at this endpoint with this key and model.
TRIPPING_STATUS = frozenset({401, 403, 404})
#: Of those, the statuses of a refused key: the only ones that pause a batch job (a 404 there
#: names one batch or file, not the model or the endpoint).
REFUSED_STATUS = frozenset({401, 403})


class EndpointBroken(HermesBulkError):
    """No item of the job can succeed at its endpoint now: the job pauses with this reason."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """What the breaker knew of an endpoint when a request to it started."""

    key: str
    answers: int  #: HTTP answers the endpoint had given this process until then


@dataclass(frozen=True, slots=True)
class Verdict:
    """A failure to connect, judged: `tripped` (the job pauses), `streak` (failures counted in a
    row), `answered_since` (the endpoint answered other requests since this one started: it is
    up, and the failure counts against the item's retries as any transient error does)."""

    tripped: bool
    streak: int
    answered_since: bool


class _Endpoint:
    __slots__ = ("answers", "last_counted_at", "streak")

    def __init__(self) -> None:
        self.streak = 0
        self.last_counted_at = -math.inf
        self.answers = 0


class EndpointBreaker:
    """One per worker process, shared by its threads; endpoints by key
    (ModelClient.provider_key)."""

    def __init__(
        self,
        failures: int = DEFAULT_FAILURES,
        *,
        spacing_s: float = SPACING_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failures, self.spacing_s = failures, spacing_s
        self._clock = clock
        self._lock = threading.Lock()
        self._endpoints: dict[str, _Endpoint] = {}

    def _of(self, key: str) -> _Endpoint:
        endpoint = self._endpoints.get(key)
        if endpoint is None:
            endpoint = self._endpoints[key] = _Endpoint()
        return endpoint

    def attempt(self, key: str) -> Attempt:
        """Before a request: what the verdict on its failure is measured against."""
        with self._lock:
            return Attempt(key, self._of(key).answers)

    def answered(self, key: str) -> None:
        """The endpoint gave an HTTP answer (any status): it can be reached."""
        with self._lock:
            endpoint = self._of(key)
            endpoint.answers += 1
            endpoint.streak = 0
            endpoint.last_counted_at = -math.inf

    def unreachable(self, attempt: Attempt) -> Verdict:
        """The request of `attempt` could not connect."""
        with self._lock:
            endpoint, now = self._of(attempt.key), self._clock()
            if now - endpoint.last_counted_at >= self.spacing_s:  # else: the same moment's failure
                endpoint.streak += 1
                endpoint.last_counted_at = now
            return Verdict(
                endpoint.streak >= self.failures,
                endpoint.streak,
                endpoint.answers != attempt.answers,
            )


def trips(exc: ModelError) -> bool:
    """An HTTP answer that trips the breaker at once: the key refused, the model or endpoint
    unknown."""
    return not isinstance(exc, EndpointUnreachable) and exc.http_status in TRIPPING_STATUS


def refuses_key(exc: ModelError) -> bool:
    """An HTTP answer that says the key is refused: it trips the batch path too."""
    return trips(exc) and exc.http_status in REFUSED_STATUS


def pause_reason(
    exc: ModelError,
    *,
    endpoint: str | None,
    model: str | None,
    streak: int = 0,
    http_client: bool = True,
) -> str:
    """Why the job paused and what to do, in our own words: the endpoint's public URL (no
    credentials), the model, the HTTP status; never the provider's text. http_client: the job
    calls the endpoint in HERMES_BULK_* (else Hermes' model, whose errors say where to fix it)."""
    if not http_client:
        return f"{exc}; then resume the job (/bulk doctor checks the model)"
    where = f"the endpoint {endpoint}" if endpoint else "the endpoint"
    then = "check with: hermes-bulk doctor, then resume the job"
    # A job keeps the endpoint, key and model it was created with (docs/decisions.md, "Who serves a
    # job"): what to do is fix that endpoint or account, or create the job again with other ones.
    again = (
        "or create the job again with the right HERMES_BULK_BASE_URL, HERMES_BULK_API_KEY or "
        "--model"
    )
    if isinstance(exc, EndpointRedirects):
        return redirect_reason(where, exc.http_status, streak)
    if isinstance(exc, EndpointUnreachable):
        return (
            f"{exc}: {streak} connection attempts in a row failed; start the endpoint there, "
            f"{then}; {again} (a job keeps the endpoint it was created with)"
        )
    if exc.http_status in REFUSED_STATUS:
        return (
            f"{where} refused the API key this job was created with (HTTP {exc.http_status}); "
            f"restore that key's access, {then}; {again} (a job keeps its endpoint and key)"
        )
    named = f"the model {model!r}" if model else "the model"
    return (
        f"{where} does not know {named} (HTTP {exc.http_status}); {then} once it does; {again} "
        "(a job keeps the endpoint and model it was created with)"
    )


#: What every redirect pause reason says (redirect_reason), so paused_by_redirects knows it.
REDIRECT_MARK = "requests in a row with a redirect (HTTP"


def paused_by_redirects(reason: str | None) -> bool:
    """Whether a job paused because its provider answered with redirects: its batches stay open
    at the provider (cancelling would be a call to the endpoint that redirects, and a batch still
    known there is read again on resume, never bought again)."""
    return bool(reason) and REDIRECT_MARK in reason


def redirect_reason(where: str, status: int | None, streak: int) -> str:
    """Why a job paused after its endpoint answered with redirects, and what to do."""
    return (
        f"{where} answered {streak} {REDIRECT_MARK} {status}) to another "
        "address, which hermes-bulk never follows (the API key would go with it); nothing was "
        "charged for it. Check the endpoint (hermes-bulk doctor) and resume the job once it "
        "answers without a redirect; or create the job again with HERMES_BULK_BASE_URL set to "
        "the address the provider names (a job keeps the endpoint it was created with)"
    )


def pause_job(store: JobStore, job_id: str, reason: str) -> None:
    """Pause the running job with the reason, once: the live and batch paths (and the other
    threads that trip at the same moment) find it paused and change nothing."""
    if (
        store.set_state(
            job_id,
            PAUSED,
            from_states=[RUNNING],
            pause_reason=reason,
            event=Event("paused", reason),
        )
        is not None
    ):
        logging.getLogger("hermes_bulk.runtime.breaker").warning(
            "job %s paused: %s", job_id, reason
        )
