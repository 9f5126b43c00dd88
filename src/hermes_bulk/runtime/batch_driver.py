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
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import secrets
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .. import sources
from ..config.provider import ANTHROPIC
from ..durations import parse_duration
from ..errors import (
    EndpointUnreachable,
    HermesBulkError,
    InvalidTransition,
    ModelError,
    PermanentModelError,
    RateLimited,
    SourceUnusable,
)
from ..files import private_dir, write_private
from ..full_disk import disk_full_at
from ..jobs import bounds, prices, prompt
from ..providers.batch_api import (
    DEFAULT_MAX_LINE_BYTES,
    MAX_BATCH_BYTES,
    META_BATCH,
    META_JOB,
    TERMINAL,
    BatchAnswerInvalid,
    BatchApi,
    BatchFileCut,
    BatchFileUnreadable,
    BatchRedirected,
    BatchUnreachable,
    FileLine,
    RemoteBatch,
)
from ..providers.client import HttpModelClient, classify_status
from ..providers.message_batches import MessageBatchApi
from ..providers.pacing import LongWait
from ..store.protocol import (
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
    Usage,
)
from ..words import count
from .breaker import (
    DEFAULT_FAILURES,
    pause_job,
    pause_reason,
    paused_by_redirects,
    redirect_reason,
    refuses_key,
)
from .pipeline import output_path, structured

if TYPE_CHECKING:
    from ..jobs.service import Jobs

log = logging.getLogger("hermes_bulk.runtime.batch_driver")

MODE_LIVE, MODE_BATCH = "live", "batch"
#: Lines ingested between renewals of the batch's lease.
RENEW_EVERY_LINES = 1000
#: Line errors that are the batch's end, not the item's fault: the item goes back with the rest.
NOT_ATTEMPTS = frozenset({"batch_expired", "batch_cancelled"})
#: Unusable answers about one batch (a poll, a create, an upload or a file download that failed
#: or could not be read), a poll apart, before the batch is given up.
MAX_STRIKES = 5
#: A full disk is no strike against a batch: what it has answered stays at the provider and
#: is read again once there is room; never bought again.
_FULL = "job %s: the disk is full at %s; its batches' results are read again once there is room"
#: Polls a cancelled batch is given to end before it is given up (20 polls: 10 min at the
#: default 30 s, OpenAI's own bound on cancelling).
CANCEL_GRACE_POLLS = 20
#: The final status recorded for a batch given up without the provider ending it.
ABANDONED = "abandoned"
#: A batch's output or error file is read to at most this many of the longest lines kept for
#: each request it holds, and as many more: a valid file holds one line a request, and a line
#: past the limit, skipped as it streams (an invalid answer of its item), may be far longer.
FILE_LINES_A_REQUEST = 64
#: The longest a redirected batch step waits before it is tried again, in polls (doubling).
REDIRECT_BACKOFF_POLLS = 32
#: What a batch create (or a file upload) answers on an endpoint without the batch API.
NO_BATCH_API = frozenset({400, 404, 405})
#: Item error types of what a batch did wrong (an attempt's event and, past --retries, the item's).
INVALID_LINE, UNANSWERED, BATCH_UNUSABLE = "InvalidBatchLine", "BatchUnanswered", "BatchUnusable"


def new_batch_id() -> str:
    """Our id of a batch: 16 hex digits (batches opened before custom_ids were bound had 12)."""
    return secrets.token_hex(8)


def custom_id(job_id: str, batch_id: str, index: int) -> str:
    """A request's custom_id: the job, the batch it is sent in and the item (short, and only
    [A-Za-z0-9_-] as OpenAI asks), so an answer is taken only for the request it answers."""
    return f"hb-{job_id}-{batch_id}-{index}"


_CUSTOM_ID = re.compile(r"^hb-([A-Za-z0-9]{1,64})-([A-Za-z0-9]{1,64})-(\d{1,9})$")
_LEGACY_CUSTOM_ID = re.compile(r"^item-(\d{1,9})$")
_LEGACY_BATCH_ID = re.compile(r"^[0-9a-f]{12}$")


def bound_index(line_id: object, job_id: str, batch_id: str) -> int | None:
    """The item a line's custom_id names when it is a request of this job sent in this batch;
    else None. `item-N` (unbound) is taken only from a batch opened before ids were bound."""
    if not isinstance(line_id, str):
        return None
    match = _CUSTOM_ID.match(line_id)
    if match:
        return int(match[3]) if (match[1], match[2]) == (job_id, batch_id) else None
    match = _LEGACY_CUSTOM_ID.match(line_id)
    return int(match[1]) if match and _LEGACY_BATCH_ID.match(batch_id) else None


class _Tally:
    """What one ingest of a batch saw: lines that settled an item it held, and lines it ignored."""

    def __init__(self) -> None:
        self.settled = self.foreign = self.unbound = 0


def runs_live(store: JobStore, job: JobRecord) -> bool:
    """Whether the job's pending items are for live calls: a live job, or a batch job one of whose
    batches passed --batch-deadline (its rest runs live)."""
    return job.spec.mode != MODE_BATCH or any(
        b.run_rest_live for b in store.list_batches(job.job_id)
    )


class BatchDriver:
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
        self.serves = (
            serves  #: whether this worker serves a job (its endpoint, run JOB --wait); None: all
        )
        self.breaker_failures = breaker_failures
        self._unreachable: dict[
            str, tuple[int, float]
        ] = {}  #: job -> (polls in a row that reached nothing, when)
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
                        log.warning(_FULL, job_id, full)
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
                if self.serves is not None and not self.serves(
                    job
                ):  # run JOB --wait: that job only
                    continue
                for batch in self.store.list_batches(job_id):
                    if (
                        batch.open
                        and batch.provider_id
                        and not batch.cancel_sent
                        and batch.status not in TERMINAL
                    ):
                        self._guarded(job, batch, lambda j=job, b=batch: self._look_after(j, b))

    def _report(self, job_id: str, about: str, exc: BaseException) -> None:
        """One event per job and kind of fault of ours (its traceback is in the log)."""
        if (about, type(exc).__name__) in self._reported:
            return
        self._reported.add((about, type(exc).__name__))
        with contextlib.suppress(HermesBulkError):
            self.store.add_events(
                job_id,
                [
                    Event(
                        "batch_error",
                        f"an internal error ({type(exc).__name__}) while "
                        "handling a batch; the details are in the worker's log",
                    )
                ],
            )

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

    # Submitting -----------------------------------------------------------------------------
    def _submit(self, job: JobRecord, *, take_from: str | None = None) -> bool:
        """Open (or take over) a batch and get it to the provider; False when none was opened.
        take_from: the dead worker whose preparing batch may be taken at once (_dead_holder)."""
        opened = self.store.open_batch(
            job.job_id,
            self.worker_id,
            batch_id=new_batch_id(),
            max_items=self.max_items,
            lease_s=self.lease_s,
            hold_s=self.hold_s,
            take_from=take_from,
        )
        if isinstance(opened, ClaimRefused):
            if opened.reason in ("token_limit", "cost_limit"):
                log.info(
                    "job %s paused at its %s limit before a batch would go over it",
                    job.job_id,
                    opened.reason.removesuffix("_limit"),
                )
            return False
        return self._guarded(job, opened, lambda: self._send_batch(job, opened), failed=False)

    def _send_batch(self, job: JobRecord, batch: BatchRecord | None) -> bool:
        """Get an opened (or taken over) batch to the provider; False when it was not."""
        assert batch is not None
        api = self.api_for(job)
        if batch.input_file and not batch.provider_id:
            # Taken over after its worker stopped: the batch may exist at the provider already.
            found = api.find(batch, recorded=self._recorded(job.job_id))
            if found is not None:
                log.info(
                    "job %s: batch %s found at the provider by its metadata and adopted",
                    job.job_id,
                    found.id,
                )
                self._record(job, batch, found, provider_id=found.id, submitted_at=self.store.now())
                return True
        current = self.store.get_job(job.job_id)
        if current is None or current.state != RUNNING:
            self._close(job, batch, "the job stopped before its batch was submitted")
            return False
        if not batch.input_file:
            uploaded = self._upload(job, batch, api)
            if not isinstance(uploaded, BatchRecord):
                return uploaded
            batch = uploaded
        batch = self.store.lease_batch(
            job.job_id, batch.batch_id, self.worker_id, lease_s=self.lease_s
        )
        if batch is None:
            return False
        try:
            created = api.create(
                batch.input_file or "",
                window=self.window,
                metadata={META_BATCH: batch.batch_id, META_JOB: job.job_id},
            )
        except PermanentModelError as exc:
            if self._no_batch_api(job, batch, api, exc):
                return False
            raise
        except BatchAnswerInvalid as exc:
            # The batch may exist all the same: look for it by its metadata. Not found, it is given
            # up at once (creating it again could pay for it twice): its items get an attempt each.
            found = api.find(batch, recorded=self._recorded(job.job_id))
            if found is None:
                self._give_up(
                    job, batch, f"batch {batch.batch_id} was given up: {exc}", attempt=True
                )
                return False
            created = found
        recorded = self._record(
            job, batch, created, provider_id=created.id, submitted_at=self.store.now()
        )
        if recorded is not None:
            self._forget(batch.batch_id)
            log.info(
                "job %s: batch %s submitted with %d items", job.job_id, created.id, recorded.items
            )
            self.store.add_events(
                job.job_id,
                [Event("batch_submitted", f"batch {created.id} submitted: {recorded.items} items")],
            )
        return True

    def _upload(self, job: JobRecord, batch: BatchRecord, api: BatchApi) -> BatchRecord | bool:
        """The batch's file written and uploaded, its id recorded: the batch as it is now; else
        what _send_batch returns (True: closed, nothing to send; False: not sent)."""
        path = self._write_file(job, batch)
        if path is None:
            self._close(job, batch, "no item of the batch could be sent")
            return True
        try:
            file_id = api.upload(path)
        except ModelError as exc:
            if self._no_batch_api(job, batch, api, exc):
                return False
            raise
        finally:
            path.unlink(missing_ok=True)
        # None: the lease was lost, and the worker that took it over submits it.
        updated = self.store.update_batch(
            job.job_id, batch.batch_id, self.worker_id, input_file=file_id
        )
        return False if updated is None else updated

    def _recorded(self, job_id: str) -> frozenset[str]:
        return _recorded(self.store, job_id)

    def _write_file(self, job: JobRecord, batch: BatchRecord) -> Path | None:
        """The batch's JSONL file, written from the store item by item (never whole in memory).
        Items whose source changed fail here, as a live call's would; items past the byte limit go
        back to pending (the next batch takes them). None when no line was written."""
        spec = job.spec
        client, api = self.client_for(job), self.api_for(job)
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
                messages = prompt.item_messages(spec, item.name, item.content, item.content_hash)
                body = client.request_body(
                    messages,
                    max_tokens=spec.max_output_tokens,
                    json_schema=schema,
                    options=spec.options,
                )
                request = api.request_line(custom_id(job.job_id, batch.batch_id, item.index), body)
                line = json.dumps(request, ensure_ascii=False) + "\n"
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
            changed = sources.source_changed(
                spec.source_kind,
                spec.source,
                item.origin,
                item.offset,
                item.index,
                item.stat_sig,
                item.content_hash,
                max_item_bytes=self.max_item_bytes,
            )
        except SourceUnusable as exc:
            return ItemError(SourceUnusable.error_type, str(exc))
        return (
            ItemError("SourceChanged", "source content changed since the job was created")
            if changed
            else None
        )

    def _close(self, job: JobRecord, batch: BatchRecord, why: str) -> None:
        n = self.store.release_batch_items(job.job_id, batch.batch_id)
        self.store.update_batch(job.job_id, batch.batch_id, self.worker_id, status=BATCH_DONE)
        log.info(
            "job %s: batch %s closed (%s); %d items back to pending",
            job.job_id,
            batch.batch_id,
            why,
            n,
        )

    # Polling, cancelling, ingesting ---------------------------------------------------------
    def _guarded(
        self,
        job: JobRecord,
        batch: BatchRecord,
        step: Callable[[], bool | None],
        *,
        failed: bool | None = None,
    ) -> bool | None:
        """One step of one batch, whatever goes wrong in it: what the provider answered wrong
        counts a strike against the batch (MAX_STRIKES of them, a poll apart, and it is given
        up); a fault of ours is logged with its traceback, recorded once, and counts too. Nothing
        goes past it, so the job's other batches and the other jobs go on. `failed`: returned
        when the step failed."""
        try:
            done = step()
            self._unreachable.pop(job.job_id, None)
            return done
        except BatchRedirected as exc:  # an answer that could not be read: asked again, no strike
            self._count_redirect(job, batch, exc)
            return failed
        except (
            BatchUnreachable,
            RateLimited,
        ) as exc:  # no answer, or the key's shared wait: no strike
            log.warning(
                "job %s: batch %s: %s; trying again at the next poll",
                job.job_id,
                batch.provider_id or batch.batch_id,
                exc,
            )
            self._retry_at[batch.batch_id] = self.store.now() + self.poll_for(job)
            if isinstance(exc, BatchUnreachable):
                self._count_unreachable(job)
            return failed
        except ModelError as exc:
            # The key refused: no batch can succeed. (A 404 here names one batch or file, not the
            # model or the endpoint: it counts a strike against that batch.)
            if refuses_key(exc):
                self._pause_for_endpoint(job, exc)
                return failed
            what = _what(exc)
            log.warning(
                "job %s: batch %s: %s", job.job_id, batch.provider_id or batch.batch_id, what
            )
        except HermesBulkError as exc:  # the store: the next pass tries again
            log.warning(
                "job %s: batch %s step failed (%s); trying again at the next pass",
                job.job_id,
                batch.batch_id,
                exc,
            )
            return failed
        except Exception as exc:
            if (full := disk_full_at(exc, self.jobs_dir.parent)) is not None:
                log.warning(_FULL, job.job_id, full)  # not the batch's fault: no strike
                self._retry_at[batch.batch_id] = self.store.now() + self.poll_for(job)
                return failed
            log.exception(
                "job %s: batch %s: a step failed", job.job_id, batch.provider_id or batch.batch_id
            )
            self._report(job.job_id, batch.batch_id, exc)
            what = f"an internal error ({type(exc).__name__}); the details are in the worker's log"
        self._strike(job, batch, what)
        return failed

    def poll_for(self, job: JobRecord) -> float:
        """How often the job's batches are polled: its --poll, else batch_poll_seconds."""
        return job.spec.batch_poll_s or self.poll_s

    def _count_unreachable(self, job: JobRecord) -> None:
        """Polls in a row that reached nothing, counted once a poll: at the breaker's count the
        job pauses naming the endpoint, as a live job's breaker does (runtime/breaker.py)."""
        now = self.store.now()
        streak, last = self._unreachable.get(job.job_id, (0, 0.0))
        if now - last >= self.poll_for(job) * 0.9:
            streak, last = streak + 1, now
        self._unreachable[job.job_id] = (streak, last)
        if streak >= self.breaker_failures:
            self._unreachable.pop(job.job_id, None)
            endpoint = self.api_for(job).endpoint
            self._pause_for_endpoint(
                job, EndpointUnreachable(f"cannot connect to {endpoint}"), streak=streak
            )

    def _count_redirect(self, job: JobRecord, batch: BatchRecord, exc: BatchRedirected) -> None:
        """A redirect: the same step is tried again after a wait that doubles each time; at the
        breaker's count in a row the job pauses naming what the provider does. The batch stays
        open (its items are not put in another batch while the provider may still answer it)."""
        streak = self._redirects[job.job_id] = self._redirects.get(job.job_id, 0) + 1
        wait = self.poll_for(job) * min(2 ** (streak - 1), REDIRECT_BACKOFF_POLLS)
        self._retry_at[batch.batch_id] = self.store.now() + wait
        log.warning(
            "job %s: batch %s: %s (%d in a row); asked again in %.0f s",
            job.job_id,
            batch.provider_id or batch.batch_id,
            exc,
            streak,
            wait,
        )
        if streak >= self.breaker_failures:
            self._redirects.pop(job.job_id, None)
            where = f"the Batch API of {self.api_for(job).endpoint}"
            pause_job(self.store, job.job_id, redirect_reason(where, exc.http_status, streak))

    def _no_batch_api(self, job: JobRecord, batch: BatchRecord, api: BatchApi, exc: Exception):
        """Whether exc, the answer to a batch create or a file upload, says the endpoint has no
        batch API; then the batch is closed (its items back to pending, nothing charged) and the
        job pauses at once saying so and what to do: an answer that will not change is not
        asked again."""
        if not isinstance(exc, PermanentModelError) or exc.http_status not in NO_BATCH_API:
            return False
        api.discard(batch.input_file)
        self._close(job, batch, f"the endpoint has no {api.KIND}")
        pause_job(
            self.store,
            job.job_id,
            f"the endpoint {api.endpoint} has no {api.KIND} (it answered a batch create with "
            f"HTTP {exc.http_status}); nothing was failed or charged. Create the job without "
            "--batch to run it with live requests, or resume it once the endpoint has them",
        )
        return True

    def _pause_for_endpoint(self, job: JobRecord, exc: ModelError, *, streak: int = 0) -> None:
        reason = pause_reason(
            exc, endpoint=self.api_for(job).endpoint, model=job.spec.model, streak=streak
        )
        pause_job(self.store, job.job_id, reason)

    def _strike(self, job: JobRecord, batch: BatchRecord, what: str) -> None:
        strikes = self._strikes[batch.batch_id] = self._strikes.get(batch.batch_id, 0) + 1
        self._retry_at[batch.batch_id] = self.store.now() + self.poll_for(job)
        if strikes >= MAX_STRIKES:
            name = batch.provider_id or batch.batch_id
            self._give_up(
                job, batch, f"batch {name} was given up after {strikes} tries: {what}", attempt=True
            )

    def _give_up(self, job: JobRecord, batch: BatchRecord, why: str, *, attempt: bool) -> None:
        """Close a batch the provider will not end usably: a cancel is sent if none was (best
        effort: it may be paid for), then its items get a failed attempt each (attempt) or go
        back as they are (a cancel not honoured: not their fault); past --batch-deadline they
        run live. Lines it answers later are never read (the batch is done)."""
        leased = self.store.lease_batch(
            job.job_id,
            batch.batch_id,
            self.worker_id,
            lease_s=self.lease_s,
            take_from=self._dead_holder(batch),
        )
        if leased is None:
            return  # another worker has it now
        batch = leased
        if batch.provider_id and not batch.cancel_sent and batch.status not in TERMINAL:
            try:
                self.api_for(job).cancel(batch.provider_id)
            except Exception as exc:  # noqa: BLE001 - best effort; the batch is given up either way
                log.warning(
                    "job %s: batch %s could not be cancelled (%s)",
                    job.job_id,
                    batch.provider_id,
                    exc,
                )
        if attempt:
            error = ItemError(BATCH_UNUSABLE, why)
            for index in [
                item.index for item in self.store.iter_batch_items(job.job_id, batch.batch_id)
            ]:
                self.store.settle_failed_attempt(
                    job.job_id, index, batch.owner, error, retries=job.spec.retries
                )
        deadline = job.spec.batch_deadline_s
        live = batch.run_rest_live or bool(
            deadline and batch.submitted_at and self.store.now() > batch.submitted_at + deadline
        )
        back = self.store.release_batch_items(job.job_id, batch.batch_id)
        if (
            self.store.update_batch(
                job.job_id,
                batch.batch_id,
                self.worker_id,
                status=BATCH_DONE,
                final_status=ABANDONED,
                run_rest_live=live,
            )
            is None
        ):
            return
        self._forget(batch.batch_id)
        self.store.add_events(
            job.job_id,
            [
                Event(
                    "batch_abandoned",
                    f"{why}; {back} items back to pending" + (", to run live" if live else ""),
                )
            ],
        )
        log.warning("job %s: %s; %d items back to pending", job.job_id, why, back)
        if back and live:
            self.trigger(job.job_id, back)

    def _forget(self, batch_id: str) -> None:
        for memory in (self._polled, self._strikes, self._retry_at, self._cancel_seen):
            memory.pop(batch_id, None)

    def _look_after(self, job: JobRecord, batch: BatchRecord) -> None:
        now = self.store.now()
        deadline = job.spec.batch_deadline_s
        past_deadline = bool(
            deadline and batch.submitted_at and now > batch.submitted_at + deadline
        )
        cancel = (
            batch.status not in TERMINAL
            and not batch.cancel_sent
            and (
                (job.state == PAUSED and not paused_by_redirects(job.pause_reason)) or past_deadline
            )
        )
        poll_s = self.poll_for(job)
        due = now - self._polled.get(batch.batch_id, 0.0) >= poll_s
        if self._retry_at.get(batch.batch_id, 0.0) > now and not cancel:
            return  # its last step failed: it waits a poll
        if not (cancel or due or batch.status in TERMINAL):
            return
        leased = self.store.lease_batch(
            job.job_id,
            batch.batch_id,
            self.worker_id,
            lease_s=self.lease_s,
            take_from=self._dead_holder(batch),
        )
        if leased is None or not leased.provider_id:
            return
        batch, api = leased, self.api_for(job)
        if cancel:
            self._polled[batch.batch_id] = now
            api.cancel(batch.provider_id)
            self._cancel_seen[batch.batch_id] = now
            why = (
                "its --batch-deadline passed; the rest run live"
                if past_deadline and job.state == RUNNING
                else "the job was paused"
            )
            batch = (
                self.store.update_batch(
                    job.job_id,
                    batch.batch_id,
                    self.worker_id,
                    cancel_sent=True,
                    run_rest_live=past_deadline and job.state == RUNNING,
                )
                or batch
            )
            self.store.add_events(
                job.job_id,
                [Event("batch_cancelled", f"batch {batch.provider_id} cancelled: {why}")],
            )
        if batch.cancel_sent and batch.status not in TERMINAL:
            sent = self._cancel_seen.setdefault(batch.batch_id, now)
            grace_s = CANCEL_GRACE_POLLS * poll_s
            if now - sent > grace_s:
                self._give_up(
                    job,
                    batch,
                    f"batch {batch.provider_id} did not end within {grace_s:.0f} s of its cancel",
                    attempt=False,
                )
                return
        if batch.status not in TERMINAL or not (batch.output_file or batch.error_file):
            # Also an ended batch whose files are not recorded yet (one that ended before its
            # create answered, or was adopted so): ask once more before reading nothing.
            self._polled[batch.batch_id] = now
            batch = self._record(job, batch, api.get(batch.provider_id))
            if batch is None:
                return
            self._strikes.pop(
                batch.batch_id, None
            )  # a usable answer: the strikes were not in a row
        if batch.status in TERMINAL:
            self._ingest(job, batch, api)

    def _record(
        self, job: JobRecord, batch: BatchRecord, remote: RemoteBatch, **more
    ) -> BatchRecord | None:
        """What the provider says of the batch (status, counts, its files: checked), recorded on
        it."""
        self._redirects.pop(job.job_id, None)  # it answered: redirects are no longer in a row
        return self.store.update_batch(
            job.job_id,
            batch.batch_id,
            self.worker_id,
            polled_at=self.store.now(),
            status=remote.status,
            completed=remote.completed,
            failed=remote.failed,
            output_file=remote.output_file,
            error_file=remote.error_file,
            **more,
        )

    def _ingest(self, job: JobRecord, batch: BatchRecord, api: BatchApi) -> None:
        """Read the batch's output and error files into the store; then settle what it still
        holds: after a batch that completed or failed, a failed attempt each (it was not
        answered); after one that expired (or was cancelled, not by us), the same when the
        batch answered nothing at all, else back to pending as they are."""
        tally = _Tally()
        if not self._read_files(job, batch, api, tally):
            return  # another worker took the batch over; it ingests again, idempotently
        if tally.foreign or tally.unbound:
            log.warning(
                "job %s: batch %s: %d lines for requests not sent in it and %d unreadable lines "
                "were ignored",
                job.job_id,
                batch.provider_id,
                tally.foreign,
                tally.unbound,
            )
            self.store.add_events(
                job.job_id,
                [
                    Event(
                        "batch_lines_ignored",
                        f"batch {batch.provider_id}: {tally.foreign} lines for requests not sent "
                        f"in it and {tally.unbound} unreadable lines ignored",
                    )
                ],
            )
        final = batch.status
        ended_by_us = batch.cancel_sent and final == "cancelled"
        error: ItemError | None = None
        if final == "failed":
            error = ItemError(
                UNANSWERED, f"the provider failed the whole batch {batch.provider_id}"
            )
        elif final == "completed":
            error = ItemError(
                UNANSWERED,
                f"batch {batch.provider_id} completed without a usable answer for this item",
            )
        elif not ended_by_us and not tally.settled:
            error = ItemError(
                UNANSWERED, f"batch {batch.provider_id} {final} without answering any item"
            )
        if error is not None:
            for index in [
                item.index for item in self.store.iter_batch_items(job.job_id, batch.batch_id)
            ]:
                self.store.settle_failed_attempt(
                    job.job_id, index, batch.owner, error, retries=job.spec.retries
                )
        back = self.store.release_batch_items(job.job_id, batch.batch_id)
        if (
            self.store.update_batch(
                job.job_id,
                batch.batch_id,
                self.worker_id,
                status=BATCH_DONE,
                final_status=batch.status,
            )
            is None
        ):
            return
        self._forget(batch.batch_id)
        self._redirects.pop(job.job_id, None)
        self.store.add_events(
            job.job_id,
            [
                Event(
                    "batch_done",
                    f"batch {batch.provider_id} {batch.status}: "
                    f"ingested; {back} items back to pending",
                )
            ],
        )
        log.info(
            "job %s: batch %s %s, ingested; %d items back to pending",
            job.job_id,
            batch.provider_id,
            batch.status,
            back,
        )
        if back and batch.run_rest_live:
            self.trigger(job.job_id, back)

    def _read_files(self, job: JobRecord, batch: BatchRecord, api: BatchApi, tally: _Tally) -> bool:
        """Every line of the batch's output and error files, ingested; False when the batch's
        lease was lost on the way. A file that does not end within its bounds (BatchFileCut)
        has what came ingested; while the batch still holds items the cut is raised (a strike),
        so the same batch is read again at the next poll, never put in another."""
        seen = 0
        cut: BatchFileCut | None = None
        max_bytes = (batch.items + 1) * FILE_LINES_A_REQUEST * self.max_line_bytes
        for file_id in (batch.output_file, batch.error_file):
            if not file_id:
                continue
            lines = api.lines(file_id, max_line_bytes=self.max_line_bytes, max_bytes=max_bytes)
            try:
                for line in lines:
                    self._line(job, batch, api, line, tally)
                    seen += 1
                    if seen % RENEW_EVERY_LINES == 0 and not self._renew(job, batch):
                        return False
            except BatchFileCut as exc:
                cut = exc  # what came is ingested; the other file is read too
        if cut is not None and next(self.store.iter_batch_items(job.job_id, batch.batch_id), None):
            raise cut
        return True

    def _renew(self, job: JobRecord, batch: BatchRecord) -> bool:
        leased = self.store.lease_batch(
            job.job_id, batch.batch_id, self.worker_id, lease_s=self.lease_s
        )
        return leased is not None

    def _line(
        self, job: JobRecord, batch: BatchRecord, api: BatchApi, read: FileLine, tally: _Tally
    ) -> None:
        """One checked line: bound to a request of this batch, or ignored (and counted)."""
        index = bound_index(read.custom_id, job.job_id, batch.batch_id)
        if index is None:
            if read.custom_id is None:
                tally.unbound += 1
            else:
                tally.foreign += 1
            return
        if self._bound_line(job, batch, api, index, read):
            tally.settled += 1

    def _bound_line(
        self, job: JobRecord, batch: BatchRecord, api: BatchApi, index: int, read: FileLine
    ) -> bool:
        """A line of a request sent in this batch; whether it settled an item the batch held (a
        line ingested again, or naming an item the batch never held, changes nothing)."""
        line = read.data
        if line is None:
            return self._failed_attempt(
                job,
                batch,
                index,
                ItemError(
                    INVALID_LINE,
                    f"batch {batch.provider_id} answered this item with {read.problem}",
                ),
            )
        response = line.get("response") or {}
        status = response.get("status_code")
        error = line.get("error")
        if status == 200 and not error:
            try:
                completion = api.parse(response.get("body"), job.spec.model or "")
                if job.spec.schema:
                    completion = structured(completion, job.spec.schema)
            except ModelError as exc:  # a cut or invalid answer the provider billed: charged
                return self._failed_attempt(
                    job,
                    batch,
                    index,
                    _item_error(exc),
                    permanent=isinstance(exc, PermanentModelError),
                    usage=prices.priced(job, "", exc.usage, by_batch=True) if exc.billed else None,
                )
            if self.store.complete_item(
                job.job_id,
                index,
                batch.owner,
                completion.text,
                # a line without usage is priced without its item's text (not read again here)
                prices.priced(job, "", completion.usage, by_batch=True),
                provider=completion.provider,
                model=completion.model,
            ):
                write_private(output_path(self.jobs_dir, job.job_id, index), completion.text + "\n")
                beyond = bounds.beyond_bound(job.spec, str(index + 1), None, "", completion.usage)
                if beyond is not None:
                    pause_job(self.store, job.job_id, beyond)
                return True
            return False
        code = error.get("code") if error else None
        if code in NOT_ATTEMPTS:
            return False  # the batch's end, not the item's: settled with what the batch still holds
        if isinstance(status, int) and status >= 400:
            exc = classify_status(status, None)
            return self._failed_attempt(
                job, batch, index, _item_error(exc), permanent=isinstance(exc, PermanentModelError)
            )
        what = f" ({code})" if isinstance(code, str) and _SAFE_CODE.match(code) else ""
        return self._failed_attempt(
            job,
            batch,
            index,
            ItemError(
                INVALID_LINE,
                f"batch {batch.provider_id} answered this item with no answer{what}",
                status,
            ),
        )

    def _failed_attempt(
        self,
        job: JobRecord,
        batch: BatchRecord,
        index: int,
        error: ItemError,
        *,
        permanent: bool = False,
        usage: Usage | None = None,
    ) -> bool:
        """A failed line, classified as live errors are: permanent fails; transient (a 429 line
        too, and a line that was not valid) counts an attempt and goes back to pending for a
        later batch, within --retries. usage: what the provider billed for the line's answer,
        charged in the same store step (an answer not kept)."""
        if permanent:
            return bool(self.store.fail_item(job.job_id, index, batch.owner, error, usage=usage))
        # One store step: a worker killed in it leaves the attempt counted, charged and the item
        # settled, or none of it; a line ingested again finds the item no longer the batch's (-1).
        return (
            self.store.settle_failed_attempt(
                job.job_id, index, batch.owner, error, retries=job.spec.retries, usage=usage
            )
            >= 0
        )


_SAFE_CODE = re.compile(
    r"^[a-z_]{1,40}$"
)  # an error code, never free text (which may echo credentials)


def _recorded(store: JobStore, job_id: str) -> frozenset[str]:
    """The provider ids of the job's batches already recorded: never another batch's to adopt."""
    return frozenset(b.provider_id for b in store.list_batches(job_id) if b.provider_id)


def _item_error(exc: ModelError) -> ItemError:
    return ItemError(exc.error_type, str(exc), exc.http_status)


def _what(exc: ModelError) -> str:
    """What went wrong in a batch step, in our words: a Batch API answer that could not be
    used names itself; an HTTP error is its status (model.classify_status speaks of the
    endpoint or model, which a batch's missing file or unknown id is not)."""
    if isinstance(exc, (BatchAnswerInvalid, BatchFileUnreadable)) or exc.http_status is None:
        return str(exc)
    return f"the provider's Batch API answered HTTP {exc.http_status}"


#: How long `delete` sits out a shared 429 pause before it cancels a batch job's batches at the
#: provider; a longer pause refuses the delete, saying how long.
DELETE_WAIT_S = 10.0


def cancel_open_batches(jobs: Jobs, job: JobRecord) -> None:
    """Cancel at the provider every open batch of the job that may still run there: one with
    the provider's id and no final status, and one left preparing with its file uploaded (a
    worker may have created it before it was killed: looked for by its metadata). Raises,
    naming the batches, when the provider cannot be asked (docs/decisions.md). The Jobs of every
    front end that can reach a provider (`hermes-bulk`, `/bulk`, the dashboard) delete with this."""
    open_ = [
        b
        for b in jobs.store.list_batches(job.job_id)
        if b.open
        and (b.provider_id and b.status not in TERMINAL or not b.provider_id and b.input_file)
    ]
    if not open_:
        return
    ids = ", ".join(b.provider_id or b.batch_id for b in open_)
    own = jobs.settings.endpoint
    speaker = MessageBatchApi if own.protocol == ANTHROPIC else BatchApi
    api = speaker(
        base_url=own.base_url,
        provider_key=job.spec.provider_key,
        limits=jobs.backend.limits,
        api_key=own.api_key,
        timeout_s=min(jobs.settings.request_timeout_seconds, 30.0),
        max_wait_s=DELETE_WAIT_S,
    )
    try:
        for batch in open_:
            remote_id = batch.provider_id
            if remote_id is None:
                found = api.find(batch, recorded=_recorded(jobs.store, job.job_id))
                if found is None or found.status in TERMINAL:
                    continue  # never created, or ended: nothing runs
                remote_id = found.id
            try:
                api.cancel(remote_id)
            except PermanentModelError as exc:
                # Refused: unknown there (404), or it ended before the cancel arrived.
                if exc.http_status != 404 and api.get(remote_id).status not in TERMINAL:
                    raise
    except LongWait as wait:
        raise InvalidTransition(
            f"Job {job.job_id} was not deleted: the provider asked every worker on this key to "
            f"wait {wait.seconds:.0f} s more (HTTP 429) before its {count(len(open_), 'batch')} "
            f"({ids}) can be cancelled; delete it again then, or cancel them at the provider and "
            "delete it with --abandon-batches."
        ) from None
    except ModelError as exc:
        raise InvalidTransition(
            f"Job {job.job_id} was not deleted: its {count(len(open_), 'batch')} at the provider "
            f"({ids}) could not be cancelled ({exc}); check {jobs.setting_name('base_url')} and "
            "delete it again, or cancel them at the provider and delete it with --abandon-batches."
        ) from None
    finally:
        api.close()
