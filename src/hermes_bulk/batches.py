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
anything (docs/decisions.md "Provider batches (issue 13)"). Ingesting is idempotent: a line whose
item the batch no longer holds changes nothing.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import threading
from collections.abc import Callable
from pathlib import Path

from . import prompt, sources
from .batch_api import MAX_BATCH_BYTES, META_BATCH, META_JOB, TERMINAL, BatchApi
from .durations import parse_duration
from .errors import (
    HermesBulkError,
    ModelError,
    PermanentModelError,
    SourceUnusable,
    TransientModelError,
)
from .files import private_dir, write_private
from .model import HttpModelClient, classify_status, parse_completion
from .pipeline import output_path, structured
from .store.protocol import (
    BATCH_DONE,
    BATCH_PREPARING,
    PAUSED,
    RUNNING,
    BatchRecord,
    ClaimRefused,
    Event,
    ItemError,
    JobRecord,
    JobStore,
)

log = logging.getLogger("hermes_bulk.batches")

MODE_LIVE, MODE_BATCH = "live", "batch"
#: Lines ingested between renewals of the batch's lease.
RENEW_EVERY_LINES = 1000
#: Line errors that are the batch's end, not the item's fault: the item goes back with the rest.
NOT_ATTEMPTS = frozenset({"batch_expired", "batch_cancelled"})


def custom_id(index: int) -> str:
    return f"item-{index}"


def index_of(line_id: object) -> int | None:
    if isinstance(line_id, str) and line_id.startswith("item-") and line_id[5:].isdigit():
        return int(line_id[5:])
    return None


def runs_live(store: JobStore, job: JobRecord) -> bool:
    """Whether the job's pending items are for live calls: a live job, or a batch job one of whose
    batches passed --batch-deadline (its rest runs live)."""
    return job.spec.mode != MODE_BATCH or any(b.run_rest_live for b in store.list_batches(job.job_id))


class BatchDriver:
    """Drives the batch jobs one worker can serve (see the module docstring)."""

    def __init__(self, *, store: JobStore, worker_id: str, api_for: Callable[[JobRecord], BatchApi],
                 client_for: Callable[[JobRecord], HttpModelClient], jobs_dir: Path, max_items: int,
                 poll_s: float, window: str, lease_s: float, trigger: Callable[[str, int], None],
                 max_item_bytes: int = sources.DEFAULT_MAX_ITEM_BYTES,
                 live_workers: Callable[[], set[str]] | None = None,
                 serves: Callable[[JobRecord], bool] | None = None) -> None:
        self.store, self.worker_id, self.api_for, self.client_for = store, worker_id, api_for, client_for
        self.serves = serves  #: whether this worker serves a job (its endpoint, run JOB --wait); None: all
        self.jobs_dir, self.max_items, self.poll_s, self.window = jobs_dir, max_items, poll_s, window
        window_s = parse_duration(window) or 86400.0
        #: How long items stay in a batch before the reaper could take them back: past the
        #: provider's window (a batch ends by then), with a day to spare.
        self.hold_s = 2 * window_s + 86400.0
        #: The lease of one step: ten item leases (5 min by default), long enough for an upload of
        #: 200 MB, renewed along the way; what a killed worker's batch waits before another takes it.
        self.lease_s = 10 * lease_s
        self.trigger, self.max_item_bytes = trigger, max_item_bytes
        #: The ids of live workers (liveness.Liveness.live_worker_ids): a batch leased to a worker
        #: not among them (killed) is taken over at once, not after its lease; None: leases only.
        self.live_workers = live_workers
        self._live: set[str] | None = None  # read at most once a pass, when a lease is another's
        self._polled: dict[str, float] = {}
        self._lock = threading.Lock()  # one pass at a time in this process

    # One pass ---------------------------------------------------------------------------
    def tick(self) -> None:
        with self._lock:
            self._live = None
            job_ids = sorted(set(self.store.batch_job_ids()) | set(self.store.active_job_ids()))
            for job_id in job_ids:
                job = self.store.get_job(job_id)
                if job is None or job.spec.mode != MODE_BATCH or job.spec.client != "http":
                    continue
                if self.serves is not None and not self.serves(job):
                    continue
                try:
                    self._drive(job)
                except (ModelError, HermesBulkError) as exc:
                    log.warning("job %s: batch step failed (%s); trying again at the next pass", job_id, exc)

    def _drive(self, job: JobRecord) -> None:
        batches = self.store.list_batches(job.job_id)
        for batch in batches:
            if batch.open and batch.status != BATCH_PREPARING:
                self._look_after(job, batch)
        job = self.store.get_job(job.job_id) or job
        live = any(b.run_rest_live for b in self.store.list_batches(job.job_id))
        # A batch left preparing by a worker that stopped is taken over even when nothing is pending.
        preparing = next((b for b in batches if b.status == BATCH_PREPARING), None)
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

    # Submitting -----------------------------------------------------------------------------
    def _submit(self, job: JobRecord, *, take_from: str | None = None) -> bool:
        """Open (or take over) a batch and get it to the provider; False when none was opened.
        take_from: the dead worker whose preparing batch may be taken at once (_dead_holder)."""
        opened = self.store.open_batch(job.job_id, self.worker_id, batch_id=secrets.token_hex(6),
                                       max_items=self.max_items, lease_s=self.lease_s, hold_s=self.hold_s,
                                       take_from=take_from)
        if isinstance(opened, ClaimRefused):
            if opened.reason == "token_limit":
                log.info("job %s paused at its token limit before a batch would go over it", job.job_id)
            return False
        batch: BatchRecord | None = opened
        api = self.api_for(job)
        if batch.input_file and not batch.provider_id:
            # Taken over after its worker stopped: the batch may exist at the provider already.
            found = api.find(batch.batch_id)
            if found is not None:
                log.info("job %s: batch %s found at the provider by its metadata and adopted", job.job_id, found["id"])
                self._record(job, batch, found, provider_id=str(found["id"]), submitted_at=self.store.now())
                return True
        current = self.store.get_job(job.job_id)
        if current is None or current.state != RUNNING:
            self._close(job, batch, "the job stopped before its batch was submitted")
            return False
        if not batch.input_file:
            path = self._write_file(job, batch)
            if path is None:
                self._close(job, batch, "no item of the batch could be sent")
                return True
            try:
                file_id = api.upload(path)
            finally:
                path.unlink(missing_ok=True)
            batch = self.store.update_batch(job.job_id, batch.batch_id, self.worker_id, input_file=file_id)
            if batch is None:
                return False  # the lease was lost: the worker that took it over submits it
        batch = self.store.lease_batch(job.job_id, batch.batch_id, self.worker_id, lease_s=self.lease_s)
        if batch is None:
            return False
        created = api.create(batch.input_file or "", window=self.window,
                             metadata={META_BATCH: batch.batch_id, META_JOB: job.job_id})
        recorded = self._record(job, batch, created, provider_id=str(created["id"]), submitted_at=self.store.now())
        if recorded is not None:
            log.info("job %s: batch %s submitted with %d items", job.job_id, created["id"], recorded.items)
            self.store.add_events(job.job_id, [Event("batch_submitted", f"batch {created['id']} submitted: "
                                                      f"{recorded.items} items")])
        return True

    def _write_file(self, job: JobRecord, batch: BatchRecord) -> Path | None:
        """The batch's JSONL file, written from the store item by item (never whole in memory).
        Items whose source changed fail here, as a live call's would; items past the byte limit go
        back to pending (the next batch takes them). None when no line was written."""
        spec = job.spec
        client = self.client_for(job)
        schema = json.loads(spec.schema) if spec.schema else None
        folder = private_dir(self.jobs_dir / job.job_id / "batches")
        path = folder / f"{batch.batch_id}.jsonl"
        written = size = 0
        with path.open("w", encoding="utf-8") as out:
            path.chmod(0o600)
            for item in self.store.iter_batch_items(job.job_id, batch.batch_id):
                error = self._source_error(job, item)
                if error is not None:
                    self.store.fail_item(job.job_id, item.index, batch.owner, error)
                    continue
                messages = prompt.build_messages(spec.instruction, item.name, item.content, item.content_hash)
                body = client.request_body(messages, max_tokens=spec.max_output_tokens, json_schema=schema)
                line = json.dumps({"custom_id": custom_id(item.index), "method": "POST",
                                   "url": "/v1/chat/completions", "body": body}, ensure_ascii=False) + "\n"
                encoded = len(line.encode("utf-8"))
                if size + encoded > MAX_BATCH_BYTES:
                    self.store.release_item(job.job_id, item.index, batch.owner)
                    continue
                out.write(line)
                size += encoded
                written += 1
        if not written:
            path.unlink(missing_ok=True)
            return None
        return path

    def _source_error(self, job: JobRecord, item) -> ItemError | None:
        spec = job.spec
        try:
            changed = sources.source_changed(spec.source_kind, spec.source, item.origin, item.offset, item.index,
                                             item.stat_sig, item.content_hash, max_item_bytes=self.max_item_bytes)
        except SourceUnusable as exc:
            return ItemError(SourceUnusable.error_type, str(exc))
        return ItemError("SourceChanged", "source content changed since the job was created") if changed else None

    def _close(self, job: JobRecord, batch: BatchRecord, why: str) -> None:
        n = self.store.release_batch_items(job.job_id, batch.batch_id)
        self.store.update_batch(job.job_id, batch.batch_id, self.worker_id, status=BATCH_DONE)
        log.info("job %s: batch %s closed (%s); %d items back to pending", job.job_id, batch.batch_id, why, n)

    # Polling, cancelling, ingesting ---------------------------------------------------------
    def _look_after(self, job: JobRecord, batch: BatchRecord) -> None:
        now = self.store.now()
        deadline = job.spec.batch_deadline_s
        past_deadline = bool(deadline and batch.submitted_at and now > batch.submitted_at + deadline)
        cancel = batch.status not in TERMINAL and not batch.cancel_sent and (job.state == PAUSED or past_deadline)
        due = now - self._polled.get(batch.batch_id, 0.0) >= self.poll_s
        if not (cancel or due or batch.status in TERMINAL):
            return
        leased = self.store.lease_batch(job.job_id, batch.batch_id, self.worker_id, lease_s=self.lease_s,
                                        take_from=self._dead_holder(batch))
        if leased is None or not leased.provider_id:
            return
        batch, api = leased, self.api_for(job)
        if cancel:
            api.cancel(batch.provider_id)
            why = "its --batch-deadline passed; the rest run live" if past_deadline and job.state == RUNNING \
                else "the job was paused"
            batch = self.store.update_batch(job.job_id, batch.batch_id, self.worker_id, cancel_sent=True,
                                            run_rest_live=past_deadline and job.state == RUNNING) or batch
            self.store.add_events(job.job_id, [Event("batch_cancelled", f"batch {batch.provider_id} cancelled: {why}")])
        if batch.status not in TERMINAL or not (batch.output_file or batch.error_file):
            # Also an ended batch whose files are not recorded yet (one that ended before its
            # create answered, or was adopted so): ask once more before reading nothing.
            self._polled[batch.batch_id] = now
            batch = self._record(job, batch, api.get(batch.provider_id))
            if batch is None:
                return
        if batch.status in TERMINAL:
            self._ingest(job, batch, api)

    def _record(self, job: JobRecord, batch: BatchRecord, remote: dict, **more) -> BatchRecord | None:
        """What the provider says of the batch (status, counts, its files), recorded on it."""
        counts = remote.get("request_counts") if isinstance(remote.get("request_counts"), dict) else {}
        return self.store.update_batch(
            job.job_id, batch.batch_id, self.worker_id, status=str(remote.get("status") or "validating"),
            completed=int(counts.get("completed") or 0), failed=int(counts.get("failed") or 0),
            output_file=remote.get("output_file_id"), error_file=remote.get("error_file_id"), **more)

    def _ingest(self, job: JobRecord, batch: BatchRecord, api: BatchApi) -> None:
        """Read the batch's output and error files into the store; the rest back to pending."""
        seen = 0
        for file_id in (batch.output_file, batch.error_file):
            if not file_id:
                continue
            for line in api.lines(file_id):
                self._line(job, batch, api, line)
                seen += 1
                if seen % RENEW_EVERY_LINES == 0 and self.store.lease_batch(
                        job.job_id, batch.batch_id, self.worker_id, lease_s=self.lease_s) is None:
                    return  # another worker took the batch over; it ingests again, idempotently
        if batch.status == "failed":  # the whole batch failed: an attempt for every item it held
            for index in [item.index for item in self.store.iter_batch_items(job.job_id, batch.batch_id)]:
                self._failed_attempt(job, batch, index, TransientModelError("the provider failed the whole batch"))
        back = self.store.release_batch_items(job.job_id, batch.batch_id)
        if self.store.update_batch(job.job_id, batch.batch_id, self.worker_id, status=BATCH_DONE,
                                   final_status=batch.status) is None:
            return
        self._polled.pop(batch.batch_id, None)
        self.store.add_events(job.job_id, [Event("batch_done", f"batch {batch.provider_id} {batch.status}: "
                                                  f"ingested; {back} items back to pending")])
        log.info("job %s: batch %s %s, ingested; %d items back to pending", job.job_id, batch.provider_id,
                 batch.status, back)
        if back and batch.run_rest_live:
            self.trigger(job.job_id, back)

    def _line(self, job: JobRecord, batch: BatchRecord, api: BatchApi, line: dict) -> None:
        index = index_of(line.get("custom_id"))
        if index is None:
            log.warning("job %s: a line of batch %s names no item of it", job.job_id, batch.provider_id)
            return
        response = line.get("response") if isinstance(line.get("response"), dict) else {}
        status = response.get("status_code")
        error = line.get("error") if isinstance(line.get("error"), dict) else None
        if status == 200 and not error:
            try:
                completion = parse_completion(response.get("body"), endpoint=api.endpoint,
                                              model=job.spec.model or "")
                if job.spec.schema:
                    completion = structured(completion)
            except ModelError as exc:
                self._failed_attempt(job, batch, index, exc)
                return
            if self.store.complete_item(job.job_id, index, batch.owner, completion.text, completion.usage,
                                        provider=completion.provider, model=completion.model):
                write_private(output_path(self.jobs_dir, job.job_id, index), completion.text + "\n")
            return
        code = error.get("code") if error else None
        if code in NOT_ATTEMPTS:
            return
        if isinstance(status, int) and status >= 400:
            exc: ModelError = classify_status(status, None)
        else:
            exc = TransientModelError("the batch line failed without an answer"
                                      + (f" ({code})" if isinstance(code, str) and _SAFE_CODE.match(code) else ""))
        self._failed_attempt(job, batch, index, exc)

    def _failed_attempt(self, job: JobRecord, batch: BatchRecord, index: int, exc: ModelError) -> None:
        """A failed line, classified as live errors are: permanent fails; transient (a 429 line
        too) counts an attempt and goes back to pending for a later batch, within --retries."""
        error = ItemError(exc.error_type, str(exc), exc.http_status)
        if isinstance(exc, PermanentModelError):
            self.store.fail_item(job.job_id, index, batch.owner, error)
            return
        # One store step: a worker killed in it leaves the attempt counted and the item settled,
        # or neither; a line ingested again finds the item no longer the batch's (-1).
        self.store.settle_failed_attempt(job.job_id, index, batch.owner, error, retries=job.spec.retries)


_SAFE_CODE = re.compile(r"^[a-z_]{1,40}$")  # an error code, never free text (which may echo credentials)

