"""A worker process's runtime: its leases, recovery passes and Huey consumer (who is alive is
`fleet/liveness.py`'s).

One WorkerRuntime per process that consumes triggers (`hermes-bulk worker`, `run --wait`, the
Hermes gateway). At start it returns the items of dead workers to the queue; besides the
consumer threads it runs one maintenance thread that, at start and every lease/3 seconds
(5 s at most):
  1. heartbeats the worker registry and renews the leases of the items it holds;
  2. returns to the queue items whose owner is dead (lease expired, or, on this host, the
     owner's lock file is free) and sends triggers for them;
  3. sends triggers to running jobs whose chain of triggers has stalled (lost with a killed
     consumer), up to the job's concurrency.
All three are idempotent and atomic in the store, so every worker can run them: scaling needs
no special flag.

A worker says what it does, in one line each: a job taken up (its first claim here), the job
finished or paused (seen by a claim that is refused, or by the maintenance pass), and the stop,
with how many items went back to the queue. A `hermes-bulk worker` (stops_gracefully) also
records on the jobs it leaves unfinished that it stopped gracefully; one started with
resume_interrupted continues such jobs (liveness.recover_interrupted).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from ..config.settings import Settings
from ..errors import HermesBulkError
from ..fleet import endpoints
from ..fleet.broker import Backend
from ..fleet.liveness import Liveness, heartbeat_interval, new_worker_id
from ..fleet.tasks import EmbeddedConsumer, consumer_options, serve
from ..providers.batch_api import BatchApi
from ..providers.client import ModelClient
from ..providers.pacing import OpenGate, RequestGate
from ..store.protocol import IN_FLIGHT, PAUSE_USER, PAUSED, RUNNING, Claim, ClaimRefused, JobRecord
from ..words import count
from . import metrics
from .batch_driver import BatchDriver, runs_live
from .breaker import EndpointBreaker
from .pipeline import ItemProcessor
from .worker_maintenance import Maintenance
from .worker_serving import ClientFactory, Serving
from .worker_stop import Stopping

log = logging.getLogger("hermes_bulk.runtime.worker")

#: How long a trigger of a job that a `run JOB --wait` does not serve waits before it is queued
#: again.
FOREIGN_TRIGGER_DELAY_S = 1.0
#: How long one trigger keeps claiming the next item of its job before it re-enqueues itself.
CHAIN_SLICE_S = 1.0


class WorkerRuntime(Serving, Maintenance, Stopping):
    """The per-process worker: processes triggers, and keeps leases and recovery going."""

    def __init__(
        self,
        backend: Backend,
        settings: Settings,
        *,
        threads: int,
        clients: Mapping[str, ClientFactory] | None = None,
        client_for: ClientFactory | None = None,
        request_gate: RequestGate | None = None,
        stops_gracefully: bool = False,
        resume_interrupted: bool = False,
        only_job: str | None = None,
    ) -> None:
        """`clients`: a model-client factory per kind of job (job.spec.client) this worker serves;
        by default only "http", the endpoint in HERMES_BULK_*. A job of another kind is left to
        workers that serve it. `client_for` replaces the routing altogether.

        `stops_gracefully`: this is a `hermes-bulk worker`, whose stop (on a signal) is recorded
        on the jobs it leaves unfinished; `resume_interrupted`: at start, continue jobs whose
        last interruption was such a stop (`worker --resume-interrupted`).

        `only_job`: this worker serves that job alone (`run JOB --wait`): a trigger of another
        job goes back to the queues' schedule for the workers that serve every job."""
        self.backend, self.settings, self.threads = backend, settings, threads
        self.clients: dict[str, ClientFactory] = (
            dict(clients) if clients is not None else {"http": self.http_client_for}
        )
        self.worker_id = new_worker_id()
        self.started_at = time.time()
        self.liveness = Liveness(backend.store, settings.home / "workers")
        self._clients: dict[tuple, ModelClient] = {}
        self._clients_lock = threading.Lock()
        self.request_gate = request_gate or OpenGate()
        self.processor = ItemProcessor(
            store=backend.store,
            limits=backend.limits,
            worker_id=self.worker_id,
            client_for=client_for or self.client_for,
            jobs_dir=settings.jobs_dir,
            lease_s=settings.lease_seconds,
            concurrency_cap=settings.max_concurrency,
            request_gate=self.request_gate,
            max_item_bytes=settings.max_item_bytes,
            on_claim=self._took,
            breaker=EndpointBreaker(settings.breaker_failures),
        )
        self.interval_s = heartbeat_interval(settings.lease_seconds)
        self._stop = threading.Event()
        self._stopping = threading.Event()  # set first thing in stop(): chains hand back at once
        self._stopped = False
        self.stops_gracefully, self.resume_interrupted = stops_gracefully, resume_interrupted
        self.only_job = only_job
        #: The provider's protocol, URL and key (config/provider.py), resolved once.
        self.endpoint = settings.endpoint
        #: The store's salt of credential fingerprints (credentials.py), asked once.
        self._salt: str | None = None
        self._told_unserved: set[str] = set()  # jobs whose endpoint is not this worker's: said once
        # jobs this worker works on now: said when taken up, until they end
        self._taken: set[str] = set()
        self._worked: set[str] = set()  # every job it claimed items of (marked at a graceful stop)
        self._taken_lock = threading.Lock()
        self._lock_fd: int | None = None
        self._maintenance: threading.Thread | None = None
        self.consumers: list[EmbeddedConsumer] = []
        #: Batch jobs (create --batch) need the HTTP endpoint's Batch API: only a worker that has it
        #: runs them.
        self.batch_driver = self._new_batch_driver() if "http" in self.clients else None
        self._batch_thread: threading.Thread | None = None
        self._batch_apis: dict[str, BatchApi] = {}

    def _new_batch_driver(self) -> BatchDriver:
        """The driver of this worker's batch jobs (batch_driver.py)."""
        settings = self.settings
        return BatchDriver(
            store=self.backend.store,
            worker_id=self.worker_id,
            api_for=self._batch_api_for,
            client_for=self.http_client_for,
            jobs_dir=settings.jobs_dir,
            max_items=settings.batch_max_items,
            poll_s=settings.batch_poll_seconds,
            window=settings.batch_window,
            lease_s=settings.lease_seconds,
            max_item_bytes=settings.max_item_bytes,
            live_workers=self.liveness.live_worker_ids,
            max_line_bytes=settings.batch_max_line_bytes,
            serves=self.serves,
            breaker_failures=settings.breaker_failures,
            trigger=lambda job_id, n: self.backend.trigger(job_id, 0, n),
        )

    # Triggers ------------------------------------------------------------------------------
    def handle_trigger(self, job_id: str, index_hint: int) -> float | None:
        """Process items of the job one after another, as one chain: a job keeps `concurrency`
        chains going. After CHAIN_SLICE_S the chain goes back through the queue as the next
        trigger, so jobs that share these threads take turns and workers share a job, unless
        this is the only worker and no other job's trigger can be waiting: then nobody's turn
        comes sooner, and the chain takes another slice.
        Within a chain the next item is claimed here, which spares each item a queue round
        trip (benchmarks, row 1), and by the completion of the item before it
        (complete_and_claim: in the steady state, one store operation an item)."""
        if self.only_job is not None and job_id != self.only_job:
            # Not this worker's job (`run JOB --wait` serves JOB alone): the trigger waits in the
            # shared schedule, so a worker that serves every job takes it; it is never lost.
            return FOREIGN_TRIGGER_DELAY_S
        client = self.backend.client_of(job_id)
        if client is None:
            return None  # the job was deleted
        if client not in self.routes():
            # On a queue this worker serves but not the job's route: pass it on to the workers
            # that can serve it, at once.
            self.backend.trigger(job_id, index_hint, client=client)
            return None
        if not self._runs_live(job_id):
            return None  # a batch job: its items go to the provider in batches (the batch driver)
        goes_on = self._chain_slices(job_id, client)
        taken = None  # what the last completion claimed (complete_and_claim), or its refusal
        while True:
            # stopping: claim nothing more, the chain stays on the queue
            if self._stopping.is_set():
                if isinstance(taken, Claim):
                    self.processor.give_back(taken)
                # ... unless it has ended: its last completion found nothing more to claim
                # (reservations in flight only delay it).
                if not isinstance(taken, ClaimRefused) or taken.reason in IN_FLIGHT:
                    self.backend.trigger(job_id, index_hint, client=client)
                return None
            outcome = self.processor.handle(job_id, index_hint, claim=taken, chain=goes_on)
            taken = outcome.next
            if not outcome.claimed and outcome.refused not in (None, "at_capacity", *IN_FLIGHT):
                self._report_end(job_id)  # done, paused, deleted: say so once
            if outcome.reschedule_in is not None:  # nothing was completed: nothing claimed next
                return outcome.reschedule_in
            if not outcome.claimed:
                return None  # nothing to claim (done, paused, at capacity): the chain ends
            index_hint = (outcome.index or 0) + 1
            if taken is None and not goes_on():
                self.backend.trigger(job_id, index_hint, client=client)
                return None

    def _chain_slices(self, job_id: str, client: str) -> Callable[[], bool]:
        """Whether the chain goes on, asked as each item completes (the completion then claims
        the next): within its slice, and after it while nobody wants the thread."""
        ends = time.monotonic() + CHAIN_SLICE_S

        def goes_on() -> bool:
            nonlocal ends
            if self._stopping.is_set():
                return False
            if time.monotonic() < ends:
                return True
            if self._turn_is_wanted(job_id, client):
                return False
            ends = time.monotonic() + CHAIN_SLICE_S
            return True

        return goes_on

    def _turn_is_wanted(self, job_id: str, client: str) -> bool:
        """Whether a chain of job_id, at the end of its slice, hands its thread to the queue:
        when another worker is alive (its threads get a share of the job that way: a worker
        that joins a running job must not wait for it to end), or when a trigger waits there
        and another job is running that it may be for (the pump can leave a spare trigger of
        this job on the queue, which would only be refused at capacity). A few reads, once a
        slice; in doubt, yes."""
        try:
            if self.liveness.live_worker_ids() - {self.worker_id}:
                return True
            if self.backend.queue_length((client,)) == 0:
                return False
            return any(other != job_id for other in self.backend.store.active_job_ids())
        except HermesBulkError:
            return True

    def _runs_live(self, job_id: str) -> bool:
        job = self.backend.store.get_job(job_id)
        return job is None or runs_live(self.backend.store, job)

    # What it says -------------------------------------------------------------------------
    def _took(self, job: JobRecord) -> None:
        """Every claim here: one line the first time the worker takes the job up (until it ends)."""
        with self._taken_lock:
            self._worked.add(job.job_id)
            if job.job_id in self._taken:
                return
            self._taken.add(job.job_id)
        log.info(
            "job %s taken up: %s left of %d, up to %d at once",
            job.job_id,
            count(job.pending + job.running, "item"),
            job.total,
            min(job.spec.concurrency, self.settings.max_concurrency),
        )

    def _report_end(self, job_id: str) -> None:
        """One line when a job this worker took up finishes, pauses or is deleted (else nothing)."""
        with self._taken_lock:
            if job_id not in self._taken:
                return
        job = self.backend.store.get_job(job_id)
        if job is None:
            line = f"job {job_id} was deleted"
        elif job.finished:
            line = f"job {job_id} finished: {job.completed} completed, {job.failed} failed"
        elif job.state == PAUSED:
            why = "by a user" if job.pause_reason == PAUSE_USER else f"({job.pause_reason})"
            line = f"job {job_id} paused {why}: {count(job.pending + job.running, 'item')} left"
        elif job.state != RUNNING:
            line = f"job {job_id} stopped ({job.state.replace('_', ' ')})"
        else:
            return
        with self._taken_lock:
            if job_id not in self._taken:
                return  # another thread said it
            self._taken.discard(job_id)
        log.info("%s", line)

    def _drive_batches(self) -> None:
        """The batch driver's thread: a pass every second (it polls each batch every
        batch_poll_seconds)."""
        assert self.batch_driver is not None
        while not self._stopping.is_set():
            try:
                self.batch_driver.tick()
            except HermesBulkError as exc:
                log.warning("batches: %s (retrying)", exc)
            except Exception:
                log.exception("batches: a pass failed (retrying)")
            if self._stopping.wait(min(1.0, self.settings.batch_poll_seconds)):
                break

    # Life ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Register, recover what dead workers left, and start the maintenance thread."""
        self._lock_fd = self.liveness.hold_lock(self.worker_id)
        self._heartbeat()  # before the scan, so two workers starting together see each other
        self._recover_at_start()
        if endpoints.HTTP in self.clients:
            self.backend.legacy_http_route = self.own_route
        serve(self.queues(), self)  # triggers of these queues, run here, come to this runtime
        self._maintenance = threading.Thread(
            target=self._maintain, name="hermes-bulk-maintenance", daemon=True
        )
        self._maintenance.start()
        if self.batch_driver is not None:
            self._batch_thread = threading.Thread(
                target=self._drive_batches, name="hermes-bulk-batches", daemon=True
            )
            self._batch_thread.start()

    def start_embedded_consumer(self) -> None:
        """Consumer threads inside this process, `threads` per queue; the host keeps its signal
        handlers."""
        self.consumers = [
            EmbeddedConsumer(huey, **consumer_options(n))
            for huey, n in zip(self.queues(), self.queue_threads(), strict=True)
        ]
        for consumer in self.consumers:
            consumer.start()

    def metrics_page(self) -> str:
        store = self.backend.store
        jobs = []
        for job_id in store.active_job_ids():
            job = store.get_job(job_id)
            # a finished job keeps its run state; it is not running
            if job is not None and not job.finished:
                jobs.append(
                    (
                        job_id,
                        {
                            "pending": job.pending,
                            "running": job.running,
                            "completed": job.completed,
                            "failed": job.failed,
                        },
                    )
                )
        return metrics.render(
            self.worker_id,
            self.processor.counters.snapshot(),
            len(self.processor.held_items()),
            self.backend.queue_length(self.routes()),
            jobs,
        )
