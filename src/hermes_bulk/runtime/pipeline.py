"""One item's life, once a trigger arrives: claim → check source → wait on limits → call → save.

Nothing here knows about Huey: a trigger is just (job id, index hint), and the outcome says
whether the caller should reschedule the trigger or send the next one. That keeps the whole
pipeline testable against a real store and a real HTTP server without a queue.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    wait_exponential,
)

from .. import sources
from ..durations import zoned_clock
from ..errors import (
    BackendUnavailable,
    ClientUnavailable,
    EndpointUnreachable,
    InvalidAnswer,
    ModelError,
    PermanentModelError,
    RateLimited,
    SourceUnusable,
    TransientModelError,
    with_usage,
)
from ..files import write_private
from ..full_disk import disk_full_at
from ..jobs import bounds, prices, prompt
from ..providers import answers
from ..providers.client import Completion, ModelClient
from ..providers.pacing import MAX_RATE_LIMIT_WAITS, LongWait, OpenGate, ProviderGate, RequestGate
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
from ..words import count
from .breaker import SPACING_S, EndpointBreaker, EndpointBroken, pause_job, pause_reason, trips
from .metrics import WorkerCounters

log = logging.getLogger("hermes_bulk.runtime.pipeline")

RETRY_WAIT = wait_exponential(multiplier=2, max=30)  # 2, 4, 8, 16, 30, 30 … seconds
#: How soon a trigger this worker cannot serve goes back on the queue for another worker.
CLIENT_UNAVAILABLE_RETRY_S = 5.0
#: How soon a trigger tries again when its item must wait for the job's reservations to settle
#: (--max-tokens, --max-cost; claim refused with tokens_in_flight or cost_in_flight). The chains
#: whose items settle claim on at once; this brings the others back (Huey's scheduler runs once a
#: second).
TOKENS_IN_FLIGHT_RETRY_S = 1.0
#: How soon a request that could not connect is tried again (nothing reached the endpoint, nothing
#: was billed): as often as the breaker counts such failures, which pauses the job after its count.
CONNECT_RETRY_S = SPACING_S
#: Saving an outcome through a backend outage: the first wait, doubling up to the longest.
PERSIST_FIRST_WAIT_S, PERSIST_LONGEST_WAIT_S = 0.25, 5.0
#: Saving an answer onto a full disk: tried again this often until there is room (sooner than
#: a reaper's pass, should its lease have run out meanwhile).
ROOM_RETRY_S = 0.25


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of a trigger: `claimed` (an item was worked on), `reschedule_in` seconds; `next`:
    what the completion claimed after it (complete_and_claim), for the chain to go on with."""

    claimed: bool
    refused: str | None = None
    reschedule_in: float | None = None
    index: int | None = None
    next: Claim | ClaimRefused | None = None


class _LostClaim(Exception):
    """The item is no longer ours (its lease expired and it was given away)."""


class _NotSent(Exception):
    """This worker is stopping and the item's request was not sent: it goes back to the queue
    as it is (stop_sending)."""


class _NotConnected(TransientModelError):
    """A failure to connect while the endpoint answers nobody: the endpoint's failure, not the
    item's, so it does not use up the item's retries (the breaker bounds it)."""

    def __init__(self, cause: EndpointUnreachable) -> None:
        super().__init__(str(cause))
        self.cause = cause


def output_path(jobs_dir: Path, job_id: str, index: int) -> Path:
    return jobs_dir / job_id / "outputs" / f"{index:06d}.md"


class ItemProcessor:
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
        self._held: set[tuple[str, int]] = (
            set()
        )  # items this worker is working on: their leases are renewed
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
        self.on_claim = (
            on_claim  # told of every claim, with the job as the claim saw it (the worker's log)
        )
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
        except _LostClaim:
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

    def _output_file(self, job_id: str, index: int) -> str:
        """output_path as a string, its folder joined once per job (pathlib costs 25 µs an item)."""
        folder = self._outputs.get(job_id)
        if folder is None:
            folder = self._outputs[job_id] = str(output_path(self.jobs_dir, job_id, 0).parent)
        return os.path.join(folder, f"{index:06d}.md")

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
        client = self.client_for(
            claim.job
        )  # first: a worker that cannot serve the job reads nothing
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
                self._fail(claim, _item_error(exc))
            return None
        return self._save(claim, completion, chain, unpaced_key(client, spec))

    def _settle_billed(self, claim: Claim, exc: ModelError) -> None:
        """An answer the provider billed and that is not kept (truncated, invalid, refused):
        charged to the job in the store step that ends the claim (docs/decisions.md, "The
        job's cost is the provider's bill"). A permanent error fails the item; another counts
        an attempt and fails the item past its retries, else gives it back to pending, where
        the next attempt is reserved, and checked against the caps, by a claim of its own."""
        spec = claim.job.spec
        usage = prices.priced(claim.job, claim.content, exc.usage, by_batch=False)
        error = _item_error(exc)
        if isinstance(exc, PermanentModelError):
            settled = self._persist(
                self.store.fail_item, spec.job_id, claim.index, self.worker_id, error, usage=usage
            )
            failed = settled
        else:
            attempts = self._persist(
                self.store.settle_failed_attempt,
                spec.job_id,
                claim.index,
                self.worker_id,
                error,
                retries=spec.retries,
                usage=usage,
            )
            settled, failed = attempts >= 0, attempts > spec.retries
        if not settled:
            raise _LostClaim()
        if failed:
            self.counters.add(items_failed=1)

    def _save(
        self,
        claim: Claim,
        completion: Completion,
        chain: Callable[[], bool] | None,
        turn_key: str | None = None,
    ):
        """Complete the item; when the chain goes on, claim the next one in the same operation.

        A completion whose reply is lost and that is sent again (a backend outage, _persist) is
        refused the second time, and the item it claimed is then nobody's: its lease runs out
        and it goes back to the queue (at-least-once, as any claim whose reply is lost).
        turn_key: the provider key when its requests are unpaced: the next item's turn is then
        taken with its claim (complete_and_claim's take_turn; on Redis, a round trip less)."""
        spec = claim.job.spec
        usage = prices.priced(claim.job, claim.content, completion.usage, by_batch=False)
        args = (spec.job_id, claim.index, self.worker_id, completion.text, usage)
        names = {"provider": completion.provider, "model": completion.model}
        taken = None
        # A provider that bills above the bound: charged as reported, and no next item is
        # claimed with it (the caps no longer hold); the job pauses once this one is saved.
        beyond = bounds.beyond_bound(
            spec, claim.name, claim.content, claim.content_hash, completion.usage
        )
        if beyond is None and chain is not None and chain():
            done, taken = self._persist(
                self.store.complete_and_claim,
                *args,
                **names,
                index_hint=claim.index + 1,
                lease_s=self.lease_s,
                max_running=self.concurrency_cap,
                take_turn=turn_key,
            )
        else:
            done = self._persist(self.store.complete_item, *args, **names)
        if not done:
            raise _LostClaim()
        if isinstance(taken, Claim):
            with self._held_lock:  # its lease is renewed from now on
                self._held.add((spec.job_id, taken.index))
        if beyond is not None:
            pause_job(self.store, spec.job_id, beyond)
        try:
            self.counters.add(
                items_completed=1,
                tokens_in=completion.usage.tokens_in or 0,
                tokens_out=completion.usage.tokens_out or 0,
            )
            self._until_room(
                write_private,
                self._output_file(spec.job_id, claim.index),
                completion.text + "\n",
            )
        except BaseException:
            if isinstance(taken, Claim):
                self.give_back(taken)
            raise
        return taken

    def _call_with_retries(self, claim: Claim, client: ModelClient) -> Completion:
        """Transient errors: tenacity, waiting 2, 4, 8 … 30 s, at most the job's retries. A failure
        to connect while the endpoint answers nobody is retried every CONNECT_RETRY_S without using
        up retries, until the breaker pauses the job (EndpointBroken) or a request goes through.
        An answer the provider billed (ModelError.billed) is never retried here: it ends the
        claim (_settle_billed), whose reservation covered one attempt."""
        retries = claim.job.spec.retries
        counted = [
            0
        ]  # attempts charged to the item (a failure to connect while nobody is answered is not)

        def record(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            if isinstance(exc, _NotConnected):  # an event, not an attempt of the item
                self.store.add_events(
                    claim.job.job_id,
                    [
                        Event(
                            "attempt_failed",
                            f"{exc} (not counted against retries: the endpoint answers nobody)",
                            claim.index,
                            exc.error_type,
                        )
                    ],
                )
                return
            counted[0] += 1
            if (
                isinstance(exc, ModelError)
                and self.store.record_attempt(
                    claim.job.job_id,
                    claim.index,
                    self.worker_id,
                    _item_error(exc),
                    rate_limited=False,
                )
                < 0
            ):
                raise _LostClaim()

        def stop(state: RetryCallState) -> bool:
            return claim.attempts + counted[0] > retries

        def wait(state: RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            return CONNECT_RETRY_S if isinstance(exc, _NotConnected) else RETRY_WAIT(state)

        retrying = Retrying(
            retry=retry_if_exception(_retried_in_claim),
            stop=stop,
            wait=wait,
            after=record,
            sleep=self._wait_before_sending,
            reraise=True,
        )
        return retrying(self._call_through_limits, claim, client)

    def _call_through_limits(self, claim: Claim, client: ModelClient) -> Completion:
        """One attempt: wait for the shared limiter, call; a 429 pauses everyone and loops."""
        spec = claim.job.spec
        gate = ProviderGate(
            self.limits,
            client.provider_key,
            rpm=spec.rpm,
            tpm=spec.tpm,
            sleep=self._wait_before_sending,
            # Hermes' ctx.llm reads no headers: its client has no announced()
            announced=getattr(client, "announced", lambda: None),
        )
        text, digest = prompt.item_text(spec, claim.content, claim.content_hash)
        messages = prompt.build_messages(spec.instruction, claim.name, text, digest, spec.system)
        estimate = prompt.estimate_tokens(
            text, spec.instruction, claim.job.output_allowance, spec.system
        )
        schema = json.loads(spec.schema) if spec.schema else None
        taken = claim.turn  # taken with the claim, for the first request only
        try:
            while True:
                gate.wait_for_turn(estimate, taken=taken)
                taken = None
                try:
                    completion = self._send(claim, client, messages, schema)
                except RateLimited as exc:
                    self.counters.add(rate_limit_waits=1)
                    until = gate.rate_limited(exc.retry_after_s)
                    waits = self.store.record_attempt(
                        spec.job_id,
                        claim.index,
                        self.worker_id,
                        ItemError(
                            "RateLimitError",
                            f"rate limited (HTTP 429); all workers wait until {zoned_clock(until)}",
                            429,
                        ),
                        rate_limited=True,
                    )
                    if waits < 0:
                        raise _LostClaim() from None
                    if spec.retries == 0 or waits >= MAX_RATE_LIMIT_WAITS:
                        raise RateLimited(
                            f"rate limited (HTTP 429) {count(waits, 'time')} in a row; run retry "
                            "later or lower --concurrency"
                        ) from None
                    continue
                gate.succeeded(estimate)
                return structured(completion, spec.schema) if spec.schema else completion
        finally:
            gate.answered()  # a first request that failed otherwise lets the others go too

    def _send(self, claim: Claim, client: ModelClient, messages, schema) -> Completion:
        """One request: on its way from here (unless this worker stopped sending, _NotSent),
        admitted by the request gate, sent; no longer on its way if it ends without an answer
        to save."""
        self._sending(claim)  # first: a worker that stopped sending charges no budget
        try:
            held_s = self.request_gate.admit(claim.job)
            if held_s > 0:
                raise LongWait(held_s)  # the budget window is spent: back until it reopens
            self.counters.add(requests=1)
            attempt = self.breaker.attempt(client.provider_key)
            return self._call_once(claim, client, attempt, messages, schema)
        except BaseException:
            self._not_sending(claim)
            raise

    def _call_once(
        self, claim: Claim, client: ModelClient, attempt, messages, schema
    ) -> Completion:
        """client.complete, told to the breaker: an HTTP answer resets it; a refused key or an
        unknown model trips it (EndpointBroken), so does the last of its count of failures to
        connect."""
        spec = claim.job.spec
        try:
            completion = client.complete(
                messages,
                max_tokens=spec.max_output_tokens,
                json_schema=schema,
                options=spec.options,
            )
        except EndpointUnreachable as exc:
            self._uncharge(claim, exc)
            verdict = self.breaker.unreachable(attempt)
            if verdict.tripped:
                raise EndpointBroken(self._reason(claim, client, exc, verdict.streak)) from None
            if verdict.answered_since:  # the endpoint is up: this counts as any transient failure
                raise
            raise _NotConnected(exc) from None
        except ModelError as exc:
            self._uncharge(claim, exc)
            if exc.http_status is not None:
                self.breaker.answered(attempt.key)
            if trips(exc):
                raise EndpointBroken(self._reason(claim, client, exc)) from None
            raise
        self.breaker.answered(attempt.key)
        return completion

    def _uncharge(self, claim: Claim, exc: ModelError) -> None:
        """A request that never reached the provider is taken back from the request budget,
        which counts what a provider could bill or rate-limit."""
        if not exc.reached_provider:
            self.request_gate.not_sent(claim.job)

    def _reason(self, claim: Claim, client: ModelClient, exc: ModelError, streak: int = 0) -> str:
        spec = claim.job.spec
        return pause_reason(
            exc,
            endpoint=getattr(client, "endpoint", None),
            model=spec.model,
            streak=streak,
            http_client=spec.client == "http",
        )

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

    def _fail(self, claim: Claim, error: ItemError) -> None:
        if not self._persist(
            self.store.fail_item, claim.job.job_id, claim.index, self.worker_id, error
        ):
            raise _LostClaim()
        self.counters.add(items_failed=1)

    def _persist(self, write, *args, **kwargs):
        """Save an outcome, waiting out a backend outage of up to a lease (0.25, 0.5, 1 … 5 s
        between tries; a plain loop: it runs for every item, and tenacity's machinery cost more
        than the write on SQLite).

        The answer is already paid for: losing it to a Redis restart would send the item to the
        model again. Past a lease the item may have been handed to another worker anyway, and
        the store refuses a non-owner's write.
        """
        gives_up = time.monotonic() + self.lease_s
        pause = PERSIST_FIRST_WAIT_S
        while True:
            try:
                return self._until_room(write, *args, **kwargs)
            except BackendUnavailable:
                if time.monotonic() >= gives_up:
                    raise
                self.sleep(pause)
                pause = min(pause * 2, PERSIST_LONGEST_WAIT_S)

    def _until_room(self, write, *args, **kwargs):
        """write(*args), tried again while the disk it writes to is full: an answer received is
        never thrown away for want of space (it would be asked, and paid for, again). It waits
        in this thread, which takes no new item meanwhile; its lease is renewed with the other
        held items' where the store still takes so small a write. One that ran out anyway may be
        reaped before the next try once there is room: the save is then refused ("lease lost")
        and the item asked again."""
        told = False
        while True:
            try:
                result = write(*args, **kwargs)
            except Exception as exc:
                where = disk_full_at(exc, self.jobs_dir.parent)
                if where is None:
                    raise
                if not told:
                    told = True
                    log.warning(
                        "the disk is full at %s: an answer is kept in memory until it can be "
                        "saved (this thread takes no new item meanwhile); free some space there",
                        where,
                    )
                self.sleep(ROOM_RETRY_S)
                continue
            if told:
                log.info("there is room again: the answer kept in memory is saved")
            return result


def unpaced_key(client: ModelClient, spec) -> str | None:
    """The client's provider key when its next request needs no pacing: no --rpm or --tpm, and
    no rate-limit headers running low (ProviderGate.wait_for_turn would acquire with neither)."""
    if spec.rpm or spec.tpm:
        return None
    seen = getattr(client, "announced", lambda: None)()
    if seen is not None and any(seen.pace(None, None)):
        return None
    return client.provider_key


def structured(completion: Completion, schema: str) -> Completion:
    """A --schema answer as canonical JSON, once it is a JSON object valid under the job's
    schema (its JSON text); else InvalidAnswer, carrying the answer's usage (it was billed)."""
    try:
        return _structured(completion, schema)
    except ModelError as exc:
        raise with_usage(exc, completion.usage) from None


def _structured(completion: Completion, schema: str) -> Completion:
    text = completion.text.strip()
    if text.startswith("```"):  # some models fence JSON even when asked not to
        text = text.strip("`").removeprefix("json").strip()
    data = answers.loads(text, "the answer to a --schema request")
    if not isinstance(data, dict):
        raise InvalidAnswer("the answer is not a JSON object as --schema asks", http_status=200)
    answers.check_answer(data, schema)
    return Completion(
        json.dumps(data, ensure_ascii=False),
        completion.usage,
        completion.provider,
        completion.model,
    )


def _retried_in_claim(exc: BaseException) -> bool:
    """A transient failure the provider billed nothing for (a timeout, a 5xx, a connection)."""
    return isinstance(exc, TransientModelError) and not exc.billed


def _item_error(exc: ModelError) -> ItemError:
    # An attempt's event kind (attempt_failed) says it was an attempt: the message does not repeat
    # it.
    return ItemError(exc.error_type, str(exc), exc.http_status)
