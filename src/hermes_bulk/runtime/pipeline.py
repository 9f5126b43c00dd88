"""One item's life, once a trigger arrives: claim → check source → wait on limits → call → save.

Nothing here knows about Huey: a trigger is just (job id, index hint), and the outcome says
whether the caller should reschedule the trigger or send the next one. That keeps the whole
pipeline testable against a real store and a real HTTP server without a queue.

The claim, the held items and the stop of sending are here; the request is sending.py's, the
saving of what came of it saving.py's (the two parts ItemProcessor is made of).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import sources
from ..errors import (
    BackendUnavailable,
    ClientUnavailable,
    PermanentModelError,
    RateLimited,
    SourceUnusable,
    TransientModelError,
)
from ..providers.client import ModelClient
from ..providers.pacing import LongWait, OpenGate, RequestGate
from ..store.protocol import (
    IN_FLIGHT,
    Claim,
    ClaimRefused,
    Event,
    ItemError,
    JobRecord,
    JobStore,
    SharedLimits,
)
from .breaker import EndpointBreaker, EndpointBroken, pause_job
from .metrics import WorkerCounters
from .saving import LostClaim, Saving, item_error
from .sending import Sending, unpaced_key

log = logging.getLogger("hermes_bulk.runtime.pipeline")

#: How soon a trigger this worker cannot serve goes back on the queue for another worker.
CLIENT_UNAVAILABLE_RETRY_S = 5.0
#: How soon a trigger tries again when its item must wait for the job's reservations to settle
#: (--max-tokens, --max-cost; claim refused with tokens_in_flight or cost_in_flight). The chains
#: whose items settle claim on at once; this brings the others back (Huey's scheduler runs once a
#: second).
TOKENS_IN_FLIGHT_RETRY_S = 1.0


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of a trigger: `claimed` (an item was worked on), `reschedule_in` seconds; `next`:
    what the completion claimed after it (complete_and_claim), for the chain to go on with."""

    claimed: bool
    refused: str | None = None
    reschedule_in: float | None = None
    index: int | None = None
    next: Claim | ClaimRefused | None = None


class _NotSent(Exception):
    """This worker is stopping and the item's request was not sent: it goes back to the queue
    as it is (stop_sending)."""


class ItemProcessor(Sending, Saving):
    """Processes triggers for one worker (one id, shared by its threads)."""

    def __init__(
        self,
        *,
        store: JobStore,
        limits: SharedLimits,
        worker_id: str,
        client_for: Callable[[JobRecord], ModelClient],
        jobs_dir: Path,
        lease_s: float,
        concurrency_cap: int,
        request_gate: RequestGate | None = None,
        sleep: Callable[[float], None] | None = None,
        max_item_bytes: int = sources.DEFAULT_MAX_ITEM_BYTES,
        on_claim: Callable[[JobRecord], None] | None = None,
        breaker: EndpointBreaker | None = None,
    ) -> None:
        self.store, self.limits, self.worker_id = store, limits, worker_id
        self.request_gate = request_gate or OpenGate()
        self.counters = WorkerCounters()
        # items this worker is working on: their leases are renewed
        self._held: set[tuple[str, int]] = set()
        self._held_lock = threading.Lock()
        self.client_for, self.jobs_dir = client_for, jobs_dir
        self.lease_s, self.concurrency_cap = lease_s, concurrency_cap
        #: Set by stop_sending: no request is sent from then on; the waits before one end.
        self._stopped_sending = threading.Event()
        #: The held items whose request went out (or whose answer is being saved): what a
        #: stopping worker waits for, and the only ones (stop_sending).
        self._sent: set[tuple[str, int]] = set()
        #: Waits while an answer is saved (a backend outage, a full disk): never cut short.
        self.sleep = sleep or time.sleep
        #: Waits before a request (pacing, a rate limit, a retry's backoff): cut short, and the
        #: item given back, when the worker stops sending.
        self._wait_to_send = sleep or self._stopped_sending.wait
        self.max_item_bytes = max_item_bytes  # the most a source-change check reads for one item
        self._told_cannot_serve: set[str] = set()  # job ids that have the event already
        #: Told of every claim, with the job as the claim saw it (the worker's log).
        self.on_claim = on_claim
        self.breaker = breaker or EndpointBreaker()  # this process's, shared by its threads
        self._outputs: dict[str, str] = {}  # job id -> its outputs folder (_output_file)

    def handle(
        self,
        job_id: str,
        index_hint: int,
        *,
        claim: Claim | ClaimRefused | None = None,
        chain: Callable[[], bool] | None = None,
    ) -> Outcome:
        """One item: claimed here, or `claim` when a completion claimed it already. `chain`, asked
        as the item completes: true when the caller goes on with the job, and then the completion
        claims the next item in the same store operation (Outcome.next)."""
        if claim is None:
            claim = self.store.claim_item(
                job_id,
                index_hint,
                self.worker_id,
                lease_s=self.lease_s,
                max_running=self.concurrency_cap,
            )
        if isinstance(claim, ClaimRefused):
            again = TOKENS_IN_FLIGHT_RETRY_S if claim.reason in IN_FLIGHT else None
            return Outcome(claimed=False, refused=claim.reason, reschedule_in=again)
        with self._held_lock:
            self._held.add((job_id, claim.index))
        if self.on_claim is not None:
            self.on_claim(claim.job)
        taken = None
        try:
            taken = self._process(claim, chain)
        except LongWait as wait:
            self.store.release_item(job_id, claim.index, self.worker_id)
            return Outcome(claimed=True, reschedule_in=wait.seconds, index=claim.index)
        except _NotSent:
            # Stopping before its request went out: back to pending, no attempt charged.
            self.store.release_item(job_id, claim.index, self.worker_id)
        except ClientUnavailable as exc:
            # Never send an item to a model it was not created for: give it back, and put the
            # trigger back on the queue, where a worker that can serve the job will take it.
            self.store.release_item(job_id, claim.index, self.worker_id)
            self._tell_cannot_serve(job_id, exc)
            return Outcome(
                claimed=True, reschedule_in=CLIENT_UNAVAILABLE_RETRY_S, index=claim.index
            )
        except EndpointBroken as exc:
            # No item can succeed there now: pause the job first (so nothing claims the item
            # again), then give the item back with no attempt charged for it.
            pause_job(self.store, claim.job.job_id, str(exc))
            self.store.release_item(job_id, claim.index, self.worker_id)
        except LostClaim:
            log.info("job %s item %s: lease lost; another worker has it", job_id, claim.index)
        except BackendUnavailable as exc:
            # Its lease runs out and a live worker returns it to the queue; nothing else to do.
            log.warning(
                "job %s item %s: %s; the item goes back to the queue when its lease ends",
                job_id,
                claim.index,
                exc,
            )
        except Exception:
            log.exception("job %s item %s: unexpected error", job_id, claim.index)
            self.store.fail_item(
                job_id,
                claim.index,
                self.worker_id,
                ItemError("InternalError", "unexpected error in the worker; see the worker log"),
            )
        finally:
            with self._held_lock:
                self._held.discard((job_id, claim.index))
                self._sent.discard((job_id, claim.index))
        return Outcome(claimed=True, index=claim.index, next=taken)

    def give_back(self, claim: Claim) -> None:
        """Return a claim the caller will not process (a chain that stops) to the queue."""
        try:
            self.store.release_item(claim.job.job_id, claim.index, self.worker_id)
        finally:
            with self._held_lock:
                self._held.discard((claim.job.job_id, claim.index))

    def held_items(self) -> list[tuple[str, int]]:
        with self._held_lock:
            return list(self._held)

    def stop_sending(self) -> int:
        """From now on no request is sent: an item whose request has not gone out goes back to
        the queue at once (a wait before it ends early), and the answers on their way are saved
        as they land. Returns how many are on their way now."""
        with self._held_lock:
            self._stopped_sending.set()
            return len(self._sent)

    def on_their_way(self) -> int:
        """Items whose request went out and whose answer is not saved yet."""
        with self._held_lock:
            return len(self._sent)

    def _sending(self, claim: Claim) -> None:
        """The item's request goes out now, unless this worker stopped sending (_NotSent)."""
        with self._held_lock:
            if self._stopped_sending.is_set():
                raise _NotSent()
            self._sent.add((claim.job.job_id, claim.index))

    def _not_sending(self, claim: Claim) -> None:
        """The item's request ended without an answer to save (it may be sent again)."""
        with self._held_lock:
            self._sent.discard((claim.job.job_id, claim.index))

    def _wait_before_sending(self, seconds: float) -> None:
        """A wait before a request (pacing, a rate limit, a retry's backoff), cut short when
        this worker stops sending: the item then goes back to the queue (_NotSent)."""
        if self._stopped_sending.is_set():
            raise _NotSent()
        self._wait_to_send(seconds)
        if self._stopped_sending.is_set():
            raise _NotSent()

    # The steps -----------------------------------------------------------------------------
    def _process(
        self, claim: Claim, chain: Callable[[], bool] | None = None
    ) -> Claim | ClaimRefused | None:
        """The item's steps; returns what its completion claimed next (see handle), if anything."""
        spec = claim.job.spec
        # first: a worker that cannot serve the job reads nothing
        client = self.client_for(claim.job)
        try:
            changed = sources.source_changed(
                spec.source_kind,
                spec.source,
                claim.origin,
                claim.offset,
                claim.index,
                claim.stat_sig,
                claim.content_hash,
                max_item_bytes=self.max_item_bytes,
            )
        except SourceUnusable as exc:
            self._fail(claim, ItemError(SourceUnusable.error_type, str(exc)))
            return
        if changed:
            self._fail(
                claim,
                ItemError("SourceChanged", "source content changed since the job was created"),
            )
            return None
        try:
            completion = self._call_with_retries(claim, client)
        except (PermanentModelError, TransientModelError, RateLimited) as exc:
            if exc.billed:
                self._settle_billed(claim, exc)
            else:
                self._fail(claim, item_error(exc))
            return None
        return self._save(claim, completion, chain, unpaced_key(client, spec))

    def _tell_cannot_serve(self, job_id: str, exc: ClientUnavailable) -> None:
        if job_id in self._told_cannot_serve:
            return
        self._told_cannot_serve.add(job_id)
        log.warning("job %s: worker %s leaves it to other workers: %s", job_id, self.worker_id, exc)
        self.store.add_events(
            job_id,
            [
                Event(
                    "worker_cannot_serve",
                    f"worker {self.worker_id} leaves this job to other workers: {exc}",
                )
            ],
        )
