"""A worker process from settings: its runtime, its Huey consumer, its metrics page, `--burst`.

`hermes-bulk worker` is this with the command line's flags (huey_consumer's: -w, -d, -m, -b, -t,
-g); `run --wait` starts a runtime here with an embedded consumer for one job.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from ..errors import HermesBulkError, InputError
from ..redact import public_url
from ..words import count

if TYPE_CHECKING:
    from ..config.settings import Settings
    from ..fleet.broker import Backend
    from ..providers.pacing import RequestGate
    from ..store.protocol import JobStore
    from .client_kinds import Served
    from .worker import WorkerRuntime

log = logging.getLogger("hermes_bulk")

#: --burst: how often the worker looks for work left, and how long none must be left before it stops
BURST_POLL_S = 0.5
BURST_IDLE_S = 1.0


def worker_runtime(
    backend: Backend, settings: Settings, threads: int, *, request_gate: RequestGate, **options
) -> tuple[WorkerRuntime, Served]:
    """A worker for every kind of job this machine can serve, and a line saying which.

    Jobs created by `hermes-bulk create` call the endpoint in HERMES_BULK_*; other kinds (jobs
    created in Hermes with `/bulk`) come from the packages that declare them (client_kinds.py),
    with the request gate their calls go through; the rest go through request_gate (the cron
    budget's when one is configured on this machine: its `models` globs decide which count).
    """
    from . import client_kinds
    from .worker import WorkerRuntime

    served = client_kinds.served(settings)
    runtime = WorkerRuntime(
        backend,
        settings,
        threads=threads,
        request_gate=served.request_gate or request_gate,
        **options,
    )
    runtime.clients.update(served.clients)
    return runtime, served


def run_worker(
    settings: Settings,
    *,
    request_gate: RequestGate,
    threads: int | None = None,
    delay: float | None = None,
    max_delay: float | None = None,
    backoff: float | None = None,
    shutdown_timeout: float | None = None,
    graceful_signal: str = "INT",
    burst: bool = False,
    resume_interrupted: bool | None = None,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
) -> None:
    """Run a worker until it is stopped (a signal), or with burst until no job it serves has
    work."""
    from ..fleet.broker import open_backend
    from ..fleet.tasks import QueuesConsumer, consumer_options
    from . import client_kinds, metrics

    threads = threads or settings.max_concurrency
    backend = open_backend(settings)
    resume = settings.resume_interrupted if resume_interrupted is None else resume_interrupted
    runtime, served = worker_runtime(
        backend,
        settings,
        threads,
        request_gate=request_gate,
        stops_gracefully=True,
        resume_interrupted=resume,
    )
    consumer = QueuesConsumer(
        runtime.queues(),
        threads=runtime.queue_threads(),
        on_stopping=runtime.stopping,
        on_stopped=lambda graceful: runtime.stop(graceful=False),
        **consumer_options(
            threads,
            initial_delay=delay,
            max_delay=max_delay,
            backoff=backoff,
            shutdown_timeout=shutdown_timeout,
            graceful_signal=graceful_signal,
        ),
    )
    for warning in backend.warnings():  # once, in the worker's log (stderr unless -l FILE)
        log.warning("%s", warning)
    try:
        if (where := backend.describe()) is not None:
            log.info("worker: writes go to %s", where)
    except HermesBulkError as exc:  # said once; a failover under way is waited out later
        log.warning("worker: %s", exc)
    runtime.start()
    if metrics_port:
        try:
            metrics.serve(metrics_host, metrics_port, runtime.metrics_page)
        except OSError as exc:
            runtime.stop(graceful=False)
            raise InputError(
                f"--metrics-port {metrics_port}: cannot listen on {metrics_host} "
                f"({exc.strerror}); choose another port."
            ) from None
    if burst:
        threading.Thread(
            target=stop_when_idle, args=(backend, consumer, runtime), daemon=True
        ).start()
    log.info(
        "worker %s: %s on %s; %s%s",
        runtime.worker_id,
        count(threads, "thread"),
        public_url(settings.backend_url),
        client_kinds.start_line(served, running_kinds(backend.store, runtime.clients)),
        "; resumes jobs a graceful worker stop cut off (--resume-interrupted)" if resume else "",
    )
    try:
        consumer.run()
    finally:
        runtime.stop(graceful=False)


def running_kinds(store: JobStore, served: dict) -> dict[str, list[str]]:
    """Running jobs of the kinds this worker does not serve: kind -> job ids."""
    kinds: dict[str, list[str]] = {}
    for job_id in store.active_job_ids():
        job = store.get_job(job_id)
        if job is not None and job.spec.client not in served and not job.finished:
            kinds.setdefault(job.spec.client, []).append(job_id)
    return kinds


def stop_when_idle(backend: Backend, consumer, runtime: WorkerRuntime) -> None:
    """--burst: stop once no running job this worker serves has pending or running items and its
    queues are empty."""
    store, idle_since = backend.store, None
    while True:
        time.sleep(BURST_POLL_S)
        busy = any(
            j.pending or j.running
            for j in (store.get_job(i) for i in store.active_job_ids())
            if j and runtime.serves(j)
        )
        if busy or backend.queue_length(runtime.routes()):
            idle_since = None
        elif idle_since is None:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > BURST_IDLE_S:
            consumer.stop(graceful=True)
            return
