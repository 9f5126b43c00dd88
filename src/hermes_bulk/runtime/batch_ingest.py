"""Ingesting an ended batch: its output and error files read line by line, each line bound to
the request it answers and settled as a live answer or a failed attempt of its item; then what
the batch still holds is settled."""

from __future__ import annotations

import logging
import re

from ..errors import ModelError, PermanentModelError
from ..files import write_private
from ..jobs import bounds, prices
from ..providers.batch_api import BatchApi, BatchFileCut, FileLine
from ..providers.client import classify_status
from ..store.protocol import BATCH_DONE, BatchRecord, Event, ItemError, JobRecord, Usage
from .batch_requests import bound_index
from .breaker import pause_job
from .saving import output_path
from .sending import structured

log = logging.getLogger("hermes_bulk.runtime.batch_driver")

#: Lines ingested between renewals of the batch's lease.
RENEW_EVERY_LINES = 1000
#: Line errors that are the batch's end, not the item's fault: the item goes back with the rest.
NOT_ATTEMPTS = frozenset({"batch_expired", "batch_cancelled"})
#: A batch's output or error file is read to at most this many of the longest lines kept for
#: each request it holds, and as many more: a valid file holds one line a request, and a line
#: past the limit, skipped as it streams (an invalid answer of its item), may be far longer.
FILE_LINES_A_REQUEST = 64
#: Item error types of what a batch did wrong (an attempt's event and, past --retries, the item's).
INVALID_LINE, UNANSWERED = "InvalidBatchLine", "BatchUnanswered"


class _Tally:
    """What one ingest of a batch saw: lines that settled an item it held, and lines it ignored."""

    def __init__(self) -> None:
        self.settled = self.foreign = self.unbound = 0


class Ingesting:
    """An ended batch ingested (a part of BatchDriver, batch_driver.py, whose state it uses)."""

    def _ingest(self, job: JobRecord, batch: BatchRecord, api: BatchApi) -> None:
        """Read the batch's output and error files into the store; then settle what it still
        holds: after a batch that completed or failed, a failed attempt each (it was not
        answered); after one that expired (or was cancelled, not by us), the same when the
        batch answered nothing at all, else back to pending as they are."""
        tally = _Tally()
        if not self._read_files(job, batch, api, tally):
            return  # another worker took the batch over; it ingests again, idempotently
        if tally.foreign or tally.unbound:
            self._tell_ignored(job, batch, tally)
        error = _unanswered(batch, tally)
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

    def _tell_ignored(self, job: JobRecord, batch: BatchRecord, tally: _Tally) -> None:
        """Lines the batch answered that named no request sent in it: logged, and an event."""
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


#: An error code, never free text (which may echo credentials).
_SAFE_CODE = re.compile(r"^[a-z_]{1,40}$")


def _item_error(exc: ModelError) -> ItemError:
    return ItemError(exc.error_type, str(exc), exc.http_status)


def _unanswered(batch: BatchRecord, tally: _Tally) -> ItemError | None:
    """What an item an ended batch still holds failed of: after a batch that completed or
    failed, not being answered; after one that expired (or was cancelled, not by us), the
    same when the batch answered nothing at all; else nothing (back to pending as it is)."""
    final = batch.status
    ended_by_us = batch.cancel_sent and final == "cancelled"
    error: ItemError | None = None
    if final == "failed":
        error = ItemError(UNANSWERED, f"the provider failed the whole batch {batch.provider_id}")
    elif final == "completed":
        error = ItemError(
            UNANSWERED,
            f"batch {batch.provider_id} completed without a usable answer for this item",
        )
    elif not ended_by_us and not tally.settled:
        error = ItemError(
            UNANSWERED, f"batch {batch.provider_id} {final} without answering any item"
        )
    return error
