"""A terminal waiting on a job: its progress while it runs (status --watch, wait, run --wait),
and workers run in this process until it stops processing (run, resume and retry --wait), which a
Ctrl-C stops without losing an answer.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from ..errors import InvalidTransition
from ..jobs import hints
from . import views
from .terminal import say, stderr_console

if TYPE_CHECKING:
    from ..config.settings import Settings
    from ..jobs.service import Jobs, JobStatus
    from ..providers.pacing import RequestGate
    from ..runtime.worker import WorkerRuntime


def run_here(
    jobs: Jobs, settings: Settings, job_id: str, threads: int, gate: RequestGate
) -> JobStatus | None:
    """Workers in this process until the job stops processing, with its progress: the last
    status, or None when a Ctrl-C stopped them (stop_on_interrupt)."""
    from ..runtime.process import worker_runtime

    runtime, served = worker_runtime(
        jobs.backend, settings, threads, request_gate=gate, only_job=job_id
    )
    job = jobs.get(job_id)
    if job.spec.client not in runtime.clients:  # its triggers would wait for another worker forever
        raise InvalidTransition(
            f"Job {job_id} cannot be processed here: this machine {served.note}. It stays queued "
            f"for a worker that can; or continue it with: {hints.process(job, 'run', hints.CLI)}"
        )
    if not runtime.serves(job):  # made for another endpoint or key: its workers take it
        raise InvalidTransition(
            f"Job {job_id} cannot be processed here: it was created for {job.spec.endpoint} "
            f"({job.spec.protocol}), and the endpoint, protocol or API key here differ "
            "(HERMES_BULK_PROVIDER, HERMES_BULK_BASE_URL, HERMES_BULK_API_KEY). It stays queued "
            "for a worker configured for that endpoint."
        )
    try:  # a Ctrl-C while the consumers start finds answers on their way too
        runtime.start()
        runtime.start_embedded_consumer()
        st = follow(jobs, job_id, until=lambda s: s.state != "processing")
    except KeyboardInterrupt:
        stop_on_interrupt(runtime, settings.request_timeout_seconds)
        return None
    runtime.stop(graceful=True)
    return st


def stop_on_interrupt(runtime: WorkerRuntime, timeout_s: float) -> None:
    """The first Ctrl-C: nothing new starts and the answers on their way are saved as they
    land, for at most the request timeout (each of them ends by then); a second Ctrl-C, or the
    timeout, abandons them: their items go back to the queue and are asked again at the next
    run (docs/decisions.md, "Ctrl-C in run --wait"). Nothing is lost either way."""
    saved = runtime.processor.counters.snapshot()["items_completed"]
    try:
        try:
            on_their_way = runtime.stop_starting()
            for line in views.stopping_lines(on_their_way, timeout_s):
                say(line)
            drained = runtime.drain(timeout_s)
            saved = runtime.processor.counters.snapshot()["items_completed"] - saved
            say(views.stopped_line(on_their_way, saved, drained, timeout_s))
        except KeyboardInterrupt:
            say(views.abandoned_line(runtime.processor.on_their_way()))
    finally:
        runtime.stop(graceful=False)


def follow(jobs: Jobs, job_id: str, *, until, timeout_s: float | None = None, quiet: bool = False):
    """Progress while waiting on standard error: a live bar on a terminal, a plain line every
    views.PROGRESS_LINE_EVERY_S elsewhere (a log, CI), nothing with --json; the last status."""
    if not quiet and sys.stderr.isatty():
        return views.follow(jobs, job_id, stderr_console(), until=until, timeout_s=timeout_s)
    return views.follow_lines(
        jobs, job_id, (lambda line: None) if quiet else say, until=until, timeout_s=timeout_s
    )
