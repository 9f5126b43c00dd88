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

import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping

from ..config.provider import ANTHROPIC
from ..config.settings import Settings
from ..errors import ClientUnavailable, ConfigError, HermesBulkError
from ..fleet import endpoints
from ..fleet.broker import Backend
from ..fleet.liveness import (
    Liveness,
    heartbeat_interval,
    new_worker_id,
    recover_interrupted,
    serves_record,
    this_host,
)
from ..fleet.tasks import EmbeddedConsumer, consumer_options, serve, stop_serving
from ..full_disk import disk_full_at
from ..providers.anthropic import AnthropicModelClient
from ..providers.batch_api import BatchApi
from ..providers.client import HttpModelClient, ModelClient
from ..providers.message_batches import MessageBatchApi
from ..providers.pacing import OpenGate, RequestGate, provider_key
from ..store.protocol import (
    IN_FLIGHT,
    INTERRUPTED_WORKER_STOP,
    PAUSE_USER,
    PAUSED,
    RUNNING,
    Claim,
    ClaimRefused,
    Event,
    JobRecord,
    WorkerInfo,
)
from ..words import count
from . import metrics
from .batch_driver import BatchDriver, runs_live
from .breaker import EndpointBreaker
from .pipeline import ItemProcessor

log = logging.getLogger("hermes_bulk.runtime.worker")

ClientFactory = Callable[[JobRecord], ModelClient]

#: Why a worker without a client for a job's kind leaves the job to others (job.spec.client).
_CANNOT_SERVE = {
    "http": "it was created by hermes-bulk create, and this worker serves only jobs created in "
    "Hermes; "
    "process it with: hermes-bulk run JOB --wait, or a hermes-bulk worker",
    "hermes": "it was created in Hermes, and this worker cannot call Hermes' model (that needs "
    "hermes-agent "
    "installed here and HERMES_HOME set to the profile the job was created in)",
}

#: How long a trigger of a job that a `run JOB --wait` does not serve waits before it is queued
#: again.
FOREIGN_TRIGGER_DELAY_S = 1.0
#: How long one trigger keeps claiming the next item of its job before it re-enqueues itself.
CHAIN_SLICE_S = 1.0
#: How often expired leases are looked for (the rest of the maintenance runs every lease/3, 5 s at
#: most).
REAP_EVERY_S = 1.0
#: How often drain() looks whether the answers on their way have landed.
DRAIN_POLL_S = 0.05


class WorkerRuntime:
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
        self._taken: set[str] = (
            set()
        )  # jobs this worker works on now: said when taken up, until they end
        self._worked: set[str] = set()  # every job it claimed items of (marked at a graceful stop)
        self._taken_lock = threading.Lock()
        self._lock_fd: int | None = None
        self._maintenance: threading.Thread | None = None
        self.consumers: list[EmbeddedConsumer] = []
        #: Batch jobs (create --batch) need the HTTP endpoint's Batch API: only a worker that has it
        #: runs them.
        self.batch_driver = (
            BatchDriver(
                store=backend.store,
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
            if "http" in self.clients
            else None
        )
        self._batch_thread: threading.Thread | None = None
        self._batch_apis: dict[str, BatchApi] = {}

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
            # On a queue this worker serves but not the job's (sent before queues were per kind
            # of client and endpoint): pass it on to the workers that can serve it, at once.
            self.backend.trigger(job_id, index_hint, client=client)
            return None
        if not self._runs_live(job_id):
            return None  # a batch job: its items go to the provider in batches (the batch driver)
        goes_on = self._chain_slices(job_id, client)
        taken = None  # what the last completion claimed (complete_and_claim), or its refusal
        while True:
            if (
                self._stopping.is_set()
            ):  # stopping: claim nothing more, the chain stays on the queue
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
        slice; in doubt, yes, as every chain did before."""
        try:
            if self.liveness.live_worker_ids() - {self.worker_id}:
                return True
            if self.backend.queue_length((client,)) == 0:
                return False
            return any(other != job_id for other in self.backend.store.active_job_ids())
        except HermesBulkError:
            return True

    @property
    def salt(self) -> str:
        if self._salt is None:
            self._salt = self.backend.store.fingerprint_salt()
        return self._salt

    @functools.cached_property
    def own_route(self) -> str:
        """The queue of jobs made for this worker's endpoint and credentials (fleet/endpoints.py):
        its fingerprint is computed here, once."""
        return endpoints.own_route(self.endpoint, self.salt)

    @functools.cached_property
    def old_route(self) -> str | None:
        """The route its jobs recorded before every credential bound them, when that differs
        (fleet/endpoints.legacy_route): consumed on one thread, chains go on on own_route."""
        route = endpoints.legacy_route(self.endpoint)
        return None if route == self.own_route else route

    def _own_routes(self) -> tuple[str, str | None]:
        """own_route and old_route, read (a fingerprint, the store's salt) only by an HTTP
        worker."""
        if endpoints.HTTP not in self.clients:
            return "", None
        return self.own_route, self.old_route

    def routes(self) -> list[str]:
        """The routes (queues) this worker consumes (fleet/endpoints.worker_routes)."""
        return endpoints.worker_routes(self.clients, *self._own_routes())

    def route_of(self, job: JobRecord) -> str:
        return endpoints.served_route(job.spec, *self._own_routes())

    def serves(self, job: JobRecord) -> bool:
        """Whether this worker takes the job's items: its kind and endpoint, and (run JOB --wait)
        its id."""
        if self.only_job is not None and job.job_id != self.only_job:
            return False
        return endpoints.serves(
            job.spec, self.clients, *self._own_routes(), batches=self.batch_driver is not None
        )

    def serves_record(self) -> str:
        """What this worker serves, as its registry entry says it (liveness.serves_record): its
        routes, the one job of `run JOB --wait`, and in words its endpoint, protocol and whether
        it runs provider batches, for `workers` and `status` to show."""
        http = endpoints.HTTP in self.clients
        return serves_record(
            self.routes(),
            self.only_job,
            endpoint=endpoints.endpoint_url(self.endpoint.base_url) if http else None,
            protocol=self.endpoint.protocol if http else None,
            batches=self.batch_driver is not None,
        )

    def _say_unserved(self, job: JobRecord) -> None:
        """Once per job: an HTTP job made for another endpoint or key is left to its workers."""
        if job.spec.client != endpoints.HTTP or job.job_id in self._told_unserved:
            return
        if self.only_job is not None and job.job_id != self.only_job:
            return
        self._told_unserved.add(job.job_id)
        own = endpoints.endpoint_url(self.endpoint.base_url)
        if job.spec.endpoint != own:
            why = f"and this worker calls {own}"
        elif job.spec.protocol != self.endpoint.protocol:
            why = f"to speak {job.spec.protocol}, and this worker speaks {self.endpoint.protocol}"
        else:
            why = "with other credentials than this worker's"
        log.info(
            "job %s is left to workers of its endpoint: it was created for %s %s",
            job.job_id,
            job.spec.endpoint,
            why,
        )

    def _api_key(self) -> str | None:
        return self.endpoint.api_key

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

    def client_for(self, job: JobRecord) -> ModelClient:
        """The model client for a job; ClientUnavailable when this worker does not serve its
        kind."""
        factory = self.clients.get(job.spec.client)
        if factory is None:
            raise ClientUnavailable(
                _CANNOT_SERVE.get(
                    job.spec.client, f"this worker has no {job.spec.client!r} model client"
                )
            )
        return factory(job)

    def http_client_for(self, job: JobRecord) -> ModelClient:
        """The endpoint in HERMES_BULK_* (jobs created by `hermes-bulk create`)."""
        model = job.spec.model or self.settings.model
        if not model:
            raise ConfigError(
                "No model configured: set HERMES_BULK_MODEL or pass --model to create."
            )
        endpoint = self.endpoint
        key = (endpoint.base_url, model)
        with self._clients_lock:
            client = self._clients.get(key)
            if client is None:
                speaker = (
                    AnthropicModelClient if endpoint.protocol == ANTHROPIC else HttpModelClient
                )
                client = self._clients[key] = speaker(
                    base_url=endpoint.base_url,
                    api_key=endpoint.api_key,
                    model=model,
                    timeout_s=self.settings.request_timeout_seconds,
                    max_connections=max(4, self.threads),
                    provider_key=provider_key(endpoint.base_url, endpoint.api_key, self.salt),
                )
            return client

    def _batch_api_for(self, job: JobRecord) -> BatchApi:
        """The Batch API of the endpoint in HERMES_BULK_* (one per worker; its calls share the key's
        limits)."""
        with self._clients_lock:
            api = self._batch_apis.get(self.endpoint.base_url)
            if api is None:
                speaker = MessageBatchApi if self.endpoint.protocol == ANTHROPIC else BatchApi
                api = self._batch_apis[self.endpoint.base_url] = speaker(
                    base_url=self.endpoint.base_url,
                    api_key=self.endpoint.api_key,
                    provider_key=job.spec.provider_key,
                    limits=self.backend.limits,
                    timeout_s=self.settings.request_timeout_seconds,
                    rpm=job.spec.rpm,
                )
            return api

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

    def queues(self) -> list:
        """The Huey queues this worker consumes: one per route (routes)."""
        return [self.backend.queue(route) for route in self.routes()]

    def queue_threads(self) -> list[int]:
        """Threads per queue (queues' order): `threads`, but one on the kind's HTTP queue and on
        the legacy route, where only triggers of jobs that recorded no endpoint, or the old
        fingerprint, arrive (their chains go on on this worker's own endpoint's queue)."""
        single = (endpoints.HTTP, self.old_route)
        return [1 if route in single else self.threads for route in self.routes()]

    def start_embedded_consumer(self) -> None:
        """Consumer threads inside this process, `threads` per queue; the host keeps its signal
        handlers."""
        self.consumers = [
            EmbeddedConsumer(huey, **consumer_options(n))
            for huey, n in zip(self.queues(), self.queue_threads(), strict=True)
        ]
        for consumer in self.consumers:
            consumer.start()

    def stopping(self) -> int:
        """From now on chains claim nothing more and no request is sent: an item whose request
        has not gone out goes back to the queue, the answers on their way are saved as they
        land; stop() follows. Said in one line. Returns how many answers are on their way."""
        on_their_way = self.processor.stop_sending()
        if not self._stopping.is_set():
            self._stopping.set()
            log.info(
                "worker %s stopping: no new items start; %s on %s way",
                self.worker_id,
                count(on_their_way, "answer"),
                "its" if on_their_way == 1 else "their",
            )
        return on_their_way

    def stop_starting(self) -> int:
        """The first Ctrl-C of `run --wait`: stopping(), and its consumers take no more
        triggers (those on the queue stay there). Returns the answers on their way."""
        for consumer in self.consumers:
            consumer.stop_flag.set()
        return self.stopping()

    def drain(self, timeout_s: float) -> bool:
        """Wait, at most timeout_s, until this worker holds no item: the answers on their way
        saved (or ended), the rest given back. Whether it came to that. In the caller's thread,
        so a KeyboardInterrupt (a second Ctrl-C) ends it."""
        ends = time.monotonic() + timeout_s
        while self.processor.held_items():
            left = ends - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(DRAIN_POLL_S, left))
        return True

    def stop(self, *, graceful: bool = True) -> None:
        """Stop consuming, return what this worker still holds to the queue, deregister (once)."""
        self.processor.stop_sending()
        self._stopping.set()
        if self._stopped:
            return
        self._stopped = True
        consumers, self.consumers = self.consumers, []
        for consumer in consumers:
            consumer.stop(graceful=graceful)
        self._stop.set()
        if self._maintenance is not None:
            self._maintenance.join(5)
        if self._batch_thread is not None:
            self._batch_thread.join(
                30
            )  # a pass ends at a step's end: a batch is never left half-recorded
        if (
            self.batch_driver is not None
        ):  # a job paused while this process ran it: its batches cancelled
            try:
                self.batch_driver.cancel_paused()
            except HermesBulkError as exc:
                log.warning("batches of paused jobs could not be cancelled: %s", exc)
        released: dict[str, int] = {}
        left: list[str] = []
        try:
            released = self.backend.store.release_worker_items(self.worker_id)
            for job_id, n in released.items():
                self.backend.trigger(job_id, 0, n)
            left = self._record_stop(released)
            self.backend.store.remove_worker(self.worker_id)
        except HermesBulkError as exc:
            log.warning("could not deregister worker %s: %s", self.worker_id, exc)
        went_back = sum(released.values())
        log.info(
            "worker %s stopped: %s went back to the queue%s%s",
            self.worker_id,
            "no items" if not went_back else count(went_back, "item"),
            "".join(f"; job {j}: {n}" for j, n in sorted(released.items()))
            if len(released) > 1
            else "",
            f"; unfinished: {', '.join(left)}" if left else "",
        )
        stop_serving(self)
        for client in self._clients.values():
            client.close()
        for api in self._batch_apis.values():
            api.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self.liveness.lock_path(self.worker_id).unlink(missing_ok=True)
            self._lock_fd = None

    def _record_stop(self, released: dict[str, int]) -> list[str]:
        """The running, unfinished jobs this worker leaves; a `hermes-bulk worker` records on each
        that it stopped gracefully (what --resume-interrupted continues)."""
        with self._taken_lock:
            worked = sorted(self._worked | set(released))
        left = []
        for job_id in worked:
            job = self.backend.store.get_job(job_id)
            if job is None or job.finished or job.state != RUNNING:
                continue
            left.append(job_id)
            if self.stops_gracefully:
                n = released.get(job_id, 0)
                self.backend.store.mark_interrupted(
                    job_id,
                    INTERRUPTED_WORKER_STOP,
                    event=Event(
                        "worker_stopped",
                        f"worker {self.worker_id} stopped gracefully"
                        + (f"; {count(n, 'item')} it held went back to the queue" if n else ""),
                    ),
                )
        return left

    def _recover_at_start(self) -> None:
        """Return dead workers' items now (recover_interrupted) and trigger those of jobs still
        running: a worker restarted after a crash gets its predecessor's items back at once, not
        at the next maintenance pass of whichever worker is alive. With resume_interrupted, jobs
        cut off by a graceful worker stop get their chains back too."""
        released, resumed = recover_interrupted(
            self.liveness, exclude=self.worker_id, resume=self.resume_interrupted
        )
        if released:
            running = set(self.backend.store.active_job_ids())
            self._send_triggers({job_id: n for job_id, n in released.items() if job_id in running})
        for job_id in resumed:
            if self.only_job is not None and job_id != self.only_job:
                continue
            job = self.backend.store.get_job(job_id)
            if job is not None and self.serves(job):
                slots = min(job.spec.concurrency, self.settings.max_concurrency) - job.running
                self.backend.trigger(job_id, 0, max(1, slots), client=self.route_of(job))

    def metrics_page(self) -> str:
        store = self.backend.store
        jobs = []
        for job_id in store.active_job_ids():
            job = store.get_job(job_id)
            if (
                job is not None and not job.finished
            ):  # a finished job keeps its run state; it is not running
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

    # Maintenance ---------------------------------------------------------------------------
    def _heartbeat(self) -> None:
        self.backend.store.heartbeat_worker(
            WorkerInfo(
                self.worker_id,
                this_host(),
                os.getpid(),
                self.started_at,
                0.0,
                self.threads,
                self.serves_record(),
            ),
            ttl_s=self.settings.lease_seconds,
        )
        self.backend.store.renew_leases(
            self.worker_id, self.processor.held_items(), lease_s=self.settings.lease_seconds
        )

    def _maintain(self) -> None:
        # Everything every interval_s, the first time at once; in between, expired leases every
        # REAP_EVERY_S, so an item of a worker that died on another machine is back within about
        # a second of its lease ending, rather than up to interval_s (5 s) later (benchmarks, row
        # 6).
        due = time.monotonic()
        while not self._stop.wait(
            min(self.interval_s, REAP_EVERY_S, max(0.0, due - time.monotonic()))
        ):
            try:
                if time.monotonic() >= due:
                    due = time.monotonic() + self.interval_s
                    self.maintain_once()
                else:
                    self._send_triggers(self.backend.store.release_expired_leases())
            except HermesBulkError as exc:
                log.warning("maintenance: %s (retrying)", exc)
            except Exception as exc:
                if (full := disk_full_at(exc, self.settings.home)) is None:
                    log.exception("maintenance failed (retrying)")
                else:
                    log.warning("maintenance: the disk is full at %s (retrying)", full)

    def _send_triggers(self, released: dict[str, int]) -> None:
        for job_id, n in released.items():
            self.backend.trigger(job_id, 0, n)

    def maintain_once(self) -> None:
        self._heartbeat()
        store = self.backend.store
        released = self.liveness.recover_dead(exclude=self.worker_id)
        for job_id, n in store.release_expired_leases().items():
            released[job_id] = released.get(job_id, 0) + n
        self._send_triggers(released)
        self.liveness.sweep()
        with self._taken_lock:
            taken = sorted(self._taken)
        for job_id in taken:  # jobs that ended where this worker's chains did not see it
            self._report_end(job_id)
        self._pump()

    def _pump(self) -> None:
        """Restart stalled chains: a running job with pending items and free slots but no claims.

        Only jobs this worker can serve: a worker that serves the kind pumps it, and triggers
        for a kind nobody serves would only pile up on its queue."""
        store, now = self.backend.store, self.backend.store.now()
        stall_s = max(2.0, 3 * self.interval_s)
        for job_id in store.active_job_ids():
            if self.only_job is not None and job_id != self.only_job:
                continue
            job = store.get_job(job_id)
            if job is None or job.pending == 0:
                continue
            if not self.serves(job):
                if job.spec.client in self.clients and job.state == RUNNING:
                    self._say_unserved(job)
                continue
            if job.spec.mode == "batch" and not runs_live(store, job):
                continue  # its items go in batches
            free = min(job.spec.concurrency, self.settings.max_concurrency) - job.running
            if free <= 0 or now - (job.last_claim_at or 0) < stall_s:
                continue
            if self.backend.limits.pause_state(
                job.spec.provider_key
            ) or self.request_gate.held_until(job):
                continue  # the provider is paused or the budget spent; triggers would only wait
            self.backend.trigger(job_id, 0, free, client=self.route_of(job))
