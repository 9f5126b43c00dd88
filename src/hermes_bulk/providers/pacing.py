"""Waiting policy over the backend's shared limiter: 429 pauses, pacing, how long to block.

The atomic parts (take a request, extend a pause) live in the store (`SharedLimits`); this
module decides how long to wait and when to give a worker thread back instead of sleeping.

Flow of a 429, as every worker sees it:
  1. a worker gets HTTP 429 → `pause(key, Retry-After or 5 s · 2^step, at most 2 min)`; the
     step grows once per generation of requests, so a burst of 429s doubles the wait once
  2. every worker asks `acquire(key)` before each request → "wait N s" while the pause lasts
  3. the pause ends → requests resume (paced, if --rpm/--tpm are set); a success resets the step
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from typing import Protocol

from .. import credentials
from ..redact import public_url
from ..store.protocol import JobRecord, SharedLimits, Turn
from .rate_headers import RateHeaders

RATE_LIMIT_BASE_S = 5.0  #: first wait after a 429 without Retry-After
RATE_LIMIT_CAP_S = 120.0  #: longest wait without Retry-After (5 s doubling, 2 min at most)
RETRY_AFTER_CAP_S = 3600.0  #: a provider's Retry-After is honoured up to an hour
MAX_RATE_LIMIT_WAITS = 8  #: consecutive 429s after which an item fails
IN_PLACE_WAIT_S = 15.0  #: longer waits give the worker thread back and reschedule the item
#: How long a process's other threads wait for its first answer from a key before sending anyway
#: (the first request may take long; a minute-long answer must not stall a worker for a minute).
FIRST_ANSWER_WAIT_S = 5.0


class FirstAnswers:
    """Per process and provider key: whether an answer has come back yet. The first request goes
    alone and the others wait for its answer (or FIRST_ANSWER_WAIT_S), so a worker's threads
    start paced by the provider's headers instead of all sending into a bucket they have not
    seen."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._answered: dict[str, threading.Event] = {}

    def turn(self, key: str) -> bool | threading.Event:
        """True when the caller's request is the key's first (it must call `answered`), False
        when an answer has come, else the event to wait on for the first answer."""
        event = self._answered.get(key)  # every request asks: once answered, no lock is taken
        if event is not None and event.is_set():
            return False
        with self._lock:
            event = self._answered.get(key)
            if event is None:
                self._answered[key] = threading.Event()
                return True
        return False if event.is_set() else event

    def answered(self, key: str) -> None:
        with self._lock:
            self._answered.setdefault(key, threading.Event()).set()


FIRST_ANSWERS = FirstAnswers()


def provider_key(base_url: str, api_key: str | None, salt_record: str | None = None) -> str:
    """Workers that share an endpoint and credentials share one quota, so they share one wait.
    Stored (limits, job specs): a hash of the public URL and of the credentials' slow salted
    fingerprint (credentials.py), never a fast hash of a key."""
    material = credentials.credentials(base_url, api_key)
    salt_record = salt_record or credentials.fixed_salt_record()
    shown = f"{public_url(base_url.rstrip('/'))}\0{credentials.fingerprint(material, salt_record)}"
    return "p:" + hashlib.sha256(shown.encode()).hexdigest()[:20]


class RequestGate(Protocol):
    """Decides, before each model request, whether the job may spend one (the cron budget)."""

    def admit(self, job: JobRecord) -> float:
        """Count one request for job; 0.0 to send it now, else seconds until it may be (nothing
        counted)."""

    def held_until(self, job: JobRecord) -> float | None:
        """When the job may send again, if it is being held now; for status and the pump."""

    def not_sent(self, job: JobRecord) -> None:
        """The request admitted last on this thread for job never reached the provider (no
        connection, or refused before sending): whatever admit counted is taken back."""


class OpenGate:
    """No budget: every request may go."""

    def admit(self, job: JobRecord) -> float:
        return 0.0

    def held_until(self, job: JobRecord) -> float | None:
        return None

    def not_sent(self, job: JobRecord) -> None:
        pass


class LongWait(Exception):
    """The provider is paused for longer than a thread should sleep; reschedule the item."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"provider paused for {seconds:.1f} s")
        self.seconds = seconds


def _NOTHING_ANNOUNCED() -> RateHeaders | None:  # noqa: N802 - a constant, called
    """A client that reads no rate-limit headers (Hermes' ctx.llm, the batch APIs)."""
    return None


class ProviderGate:
    """One provider key's shared wait and pacing, as one worker uses it.

    announced: the rate-limit headers of the client's latest answer (providers/rate_headers.py):
    a limit running low paces requests at it, below --rpm/--tpm; an answer that leaves too
    little for the next request holds every worker of the key until it has come back. With it,
    a process's first request to a key goes alone (FIRST_ANSWERS), and a 429 to that one
    request is a plain wait: one request's rate is no rate to halve."""

    def __init__(
        self,
        limits: SharedLimits,
        key: str,
        *,
        rpm: int | None,
        tpm: int | None,
        sleep: Callable[[float], None] = time.sleep,
        announced: Callable[[], RateHeaders | None] | None = None,
    ) -> None:
        self.limits, self.key, self.rpm, self.tpm, self.sleep = limits, key, rpm, tpm, sleep
        self.announced = announced or _NOTHING_ANNOUNCED
        self.epoch = 0  # of the last turn taken: a 429 to it hands this back
        self.first_alone = announced is not None
        self.first = False  # this gate's request is the key's first in this process

    def _wait_for_first_answer(self) -> None:
        if not self.first_alone or self.first:
            return
        turn = FIRST_ANSWERS.turn(self.key)
        if isinstance(turn, bool):
            self.first = turn
        else:
            turn.wait(FIRST_ANSWER_WAIT_S)

    def answered(self) -> None:
        """The first request has its answer, whatever it was: the others may go."""
        if self.first:
            self.first = False
            FIRST_ANSWERS.answered(self.key)

    def wait_for_turn(
        self, tokens: int, *, max_block_s: float = IN_PLACE_WAIT_S, taken: Turn | None = None
    ) -> None:
        """Block until this worker may send one request; raise LongWait past max_block_s.

        taken: the turn the store took with the item's claim (Claim.turn), used instead of a
        first acquire while the key is still unpaced (as it was when it was taken)."""
        self._wait_for_first_answer()
        while True:
            seen = self.announced()
            rpm, tpm = seen.pace(self.rpm, self.tpm) if seen else (self.rpm, self.tpm)
            if taken is not None and not rpm and not tpm:
                wait, epoch = taken
            else:
                wait, epoch = self.limits.acquire(self.key, rpm=rpm, tpm=tpm, tokens=tokens)
            taken = None
            if wait <= 0:
                self.epoch = epoch
                return
            if wait > max_block_s:
                raise LongWait(wait)
            self.sleep(wait)

    def rate_limited(self, retry_after_s: float | None) -> float:
        """Record a 429 to the last turn for every worker on this key; returns when the shared
        wait ends. Only a 429 to a request sent after the key's last slow-down slows it again."""
        seconds = None if retry_after_s is None else min(retry_after_s, RETRY_AFTER_CAP_S)
        if self.first:  # a lone request: wait as asked, teach the adaptive rate nothing
            until = self.hold(RATE_LIMIT_BASE_S if seconds is None else seconds)
            self.answered()  # after the wait is shared: the others must not go before it
            return until
        return self.limits.pause(
            self.key,
            seconds=seconds,
            base_s=RATE_LIMIT_BASE_S,
            cap_s=RATE_LIMIT_CAP_S,
            epoch=self.epoch,
        )

    def succeeded(self, tokens: int = 0) -> None:
        """An answer: the backoff starts from the base again; when its headers say too little
        is left for another request of about `tokens`, every worker waits for it to come back."""
        self.limits.clear_backoff(self.key)
        seen = self.announced()
        hold_s = seen.hold_s(tokens) if seen else 0.0
        if hold_s > 0:
            self.hold(hold_s)
        self.answered()  # after any wait its headers asked for is shared

    def hold(self, seconds: float) -> float:
        """A shared wait that is not a 429: the epoch no grant carries makes the store treat it
        as a late answer to an earlier generation, which slows nothing and grows no backoff."""
        return self.limits.pause(
            self.key, seconds=seconds, base_s=RATE_LIMIT_BASE_S, cap_s=RATE_LIMIT_CAP_S, epoch=-1
        )
