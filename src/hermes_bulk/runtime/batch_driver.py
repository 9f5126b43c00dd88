"""A job run through the provider's Batch API: submit, poll, ingest, cancel (create --batch).

A batch job is the same job in the same store: its items go pending -> in a batch (running,
owned by "batch:<id>") -> completed or failed, through the store's own item steps. Every worker
that has an HTTP endpoint runs a BatchDriver; each pass, for every batch job it can see:

  - a paused job: its batches at the provider are cancelled (finished lines are ingested, the
    rest go back to pending); no new batch is opened for a job that is not running;
  - a batch past --batch-deadline: cancelled, and the job's remaining items run live;
  - every open batch, at most every batch_poll_seconds: polled, and once it has ended (completed,
    failed, expired, cancelled) its output and error files are read line by line: an answer is
    stored as a live result is, a failed line is a failed attempt (transient: back to pending
    within --retries; permanent: failed); what the batch still holds then goes back to pending;
  - while a running job has pending items: a batch is opened (at most one is being prepared per
    job), its file written from the store and streamed up, the batch created with metadata that
    names it, and the provider's batch id recorded.

Each step runs under the batch's lease in the store, so two workers never submit the same items
or ingest the same output at once. A worker killed between creating a batch at the provider and
recording its id leaves the batch `preparing` with its file recorded; the next worker to open a
batch of the job takes it over and finds the provider's batch by its metadata before creating
anything (docs/decisions.md, "Provider batches"). Ingesting is idempotent: a line whose
item the batch no longer holds changes nothing.

Nothing the provider answers is trusted (docs/decisions.md "Provider batches: what we trust"):
every batch object and line is checked (batch_api) before it is acted on. A line is bound to its
request by its custom_id, which names the job, the batch and the item; any other line is ignored.
An invalid line of an item, and an item a finished batch did not answer, is a failed attempt of
that item. A batch about which the provider keeps answering what cannot be used (MAX_STRIKES
times, a poll apart) is given up: its items get a failed attempt each. A cancel the provider
does not honour within CANCEL_GRACE_POLLS polls is given up too: the items go back (to run live,
past --batch-deadline). An error in one batch or job is logged and recorded, and the pass goes on.

The driver here runs the passes; each step is a part of it in a module of its own:
batch_submit.py (opening and submitting), batch_requests.py (the requests file and the ids that
bind a line to its request), batch_poll.py (polling, cancelling, the deadline), batch_ingest.py
(reading an ended batch's files), batch_faults.py (what goes wrong in a step: strikes, redirects,
giving a batch up); batch_delete.py is what `delete` does to a batch job's batches.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from .. import sources
from ..durations import parse_duration
from ..errors import HermesBulkError
from ..full_disk import disk_full_at
from ..providers.batch_api import DEFAULT_MAX_LINE_BYTES, TERMINAL, BatchApi
from ..providers.client import HttpModelClient
from ..store.protocol import BATCH_PREPARING, PAUSED, RUNNING, BatchRecord, JobRecord, JobStore
from .batch_faults import DISK_FULL, StepFaults
from .batch_ingest import Ingesting
from .batch_poll import Polling
from .batch_requests import RequestsFile
from .batch_submit import Submitting
from .breaker import DEFAULT_FAILURES

log = logging.getLogger("hermes_bulk.runtime.batch_driver")

MODE_LIVE, MODE_BATCH = "live", "batch"


def runs_live(store: JobStore, job: JobRecord) -> bool:
    """Whether the job's pending items are for live calls: a live job, or a batch job one of whose
    batches passed --batch-deadline (its rest runs live)."""
    return job.spec.mode != MODE_BATCH or any(
        b.run_rest_live for b in store.list_batches(job.job_id)
    )


class BatchDriver(Submitting, RequestsFile, Polling, Ingesting, StepFaults):
    """Drives the batch jobs one worker can serve (see the module docstring)."""

    def __init__(
        self,
        *,
        store: JobStore,
        worker_id: str,
        api_for: Callable[[JobRecord], BatchApi],
        client_for: Callable[[JobRecord], HttpModelClient],
        jobs_dir: Path,
        max_items: int,
        poll_s: float,
        window: str,
        lease_s: float,
        trigger: Callable[[str, int], None],
        max_item_bytes: int = sources.DEFAULT_MAX_ITEM_BYTES,
        live_workers: Callable[[], set[str]] | None = None,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        serves: Callable[[JobRecord], bool] | None = None,
        breaker_failures: int = DEFAULT_FAILURES,
    ) -> None:
        self.store, self.worker_id, self.api_for, self.client_for = (
            store,
            worker_id,
            api_for,
            client_for,
        )
        #: Whether this worker serves a job (its endpoint, run JOB --wait); None: all.
        self.serves = serves
        self.breaker_failures = breaker_failures
        #: job -> (polls in a row that reached nothing, when)
        self._unreachable: dict[str, tuple[int, float]] = {}
        self.jobs_dir, self.max_items, self.poll_s, self.window = (
            jobs_dir,
            max_items,
            poll_s,
            window,
        )
        window_s = parse_duration(window) or 86400.0
        #: How long items stay in a batch before the reaper could take them back: past the
        #: provider's window (a batch ends by then), with a day to spare.
        self.hold_s = 2 * window_s + 86400.0
        #: The lease of one step: ten item leases (5 min by default), long enough for an upload of
        #: 200 MB, renewed along the way; what a killed worker's batch waits before another takes
        #: it.
        self.lease_s = 10 * lease_s
        self.trigger, self.max_item_bytes = trigger, max_item_bytes
        #: The ids of live workers (liveness.Liveness.live_worker_ids): a batch leased to a worker
        #: not among them (killed) is taken over at once, not after its lease; None: leases only.
        self.live_workers = live_workers
        self._live: set[str] | None = None  # read at most once a pass, when a lease is another's
        self._polled: dict[str, float] = {}
        self.max_line_bytes = max_line_bytes
        # What this process counts of each batch (kept in memory: a restarted worker counts
        # afresh, so a bound holds per worker, and the store's records stay as they are).
        self._strikes: dict[str, int] = {}
        self._retry_at: dict[str, float] = {}  # a batch that failed a step waits a poll
        self._cancel_seen: dict[str, float] = {}  # when its cancel was first known sent
        self._reported: set[tuple[str, str]] = set()  # (job or batch, error type) recorded once
        self._redirects: dict[str, int] = {}  # job -> redirects in a row
        self._lock = threading.Lock()  # one pass at a time in this process

    # One pass ---------------------------------------------------------------------------
    def tick(self) -> None:
        with self._lock:
            self._live = None
            job_ids = sorted(set(self.store.batch_job_ids()) | set(self.store.active_job_ids()))
            for job_id in job_ids:
                try:
                    job = self.store.get_job(job_id)
                    if job is None or job.spec.mode != MODE_BATCH or job.spec.client != "http":
                        continue
                    if self.serves is not None and not self.serves(job):
                        continue
                    self._drive(job)
                except HermesBulkError as exc:  # the store, mostly: the next pass tries again
                    log.warning(
                        "job %s: batch step failed (%s); trying again at the next pass", job_id, exc
                    )
                except Exception as exc:  # a fault of ours: the other jobs go on
                    if (full := disk_full_at(exc, self.jobs_dir.parent)) is not None:
                        log.warning(DISK_FULL, job_id, full)
                        continue
                    log.exception("job %s: batch step failed; the other jobs go on", job_id)
                    self._report(job_id, job_id, exc)

    def cancel_paused(self) -> None:
        """Cancel at the provider the open batches of paused jobs, now: what a process that stops
        (`run --wait` once its job is paused) does last, so a pause cancels whoever runs the job."""
        with self._lock:
            for job_id in self.store.batch_job_ids():
                job = self.store.get_job(job_id)
                if (
                    job is None
                    or job.state != PAUSED
                    or job.spec.mode != MODE_BATCH
                    or job.spec.client != "http"
                ):
                    continue
                # run JOB --wait: that job only
                if self.serves is not None and not self.serves(job):
                    continue
                for batch in self.store.list_batches(job_id):
                    if (
                        batch.open
                        and batch.provider_id
                        and not batch.cancel_sent
                        and batch.status not in TERMINAL
                    ):
                        self._guarded(job, batch, lambda j=job, b=batch: self._look_after(j, b))

    def _drive(self, job: JobRecord) -> None:
        batches = self.store.list_batches(job.job_id)
        for batch in batches:
            if batch.open and batch.status != BATCH_PREPARING:
                self._guarded(job, batch, lambda b=batch: self._look_after(job, b))
        job = self.store.get_job(job.job_id) or job
        live = any(b.run_rest_live for b in self.store.list_batches(job.job_id))
        # A batch left preparing by a worker that stopped is taken over even when nothing is
        # pending.
        preparing = next((b for b in batches if b.status == BATCH_PREPARING), None)
        if preparing is not None and self._retry_at.get(preparing.batch_id, 0.0) > self.store.now():
            return  # its last step failed: it waits a poll
        orphan, take_from = preparing is not None, self._dead_holder(preparing)
        while job.state == RUNNING and (job.pending > 0 or orphan) and not live:
            orphan = False
            if not self._submit(job, take_from=take_from):
                break
            take_from = None
            job = self.store.get_job(job.job_id) or job

    def _dead_holder(self, batch: BatchRecord | None) -> str | None:
        """The worker holding the batch's lease when it is another worker, its lease has not run
        out, and it is not live (killed: on this host its lock file is free at once, elsewhere
        its heartbeat lapses): the lease is taken from it now, not ten item leases later. A live
        worker keeps its lease however slow its step (an upload of 200 MB)."""
        if batch is None or self.live_workers is None:
            return None
        holder = batch.lease_owner
        if not holder or holder == self.worker_id or batch.lease_until < self.store.now():
            return None
        if self._live is None:
            self._live = self.live_workers()
        return None if holder in self._live else holder
