"""Polling a batch: cancelled when its job is paused or its --batch-deadline passed (the rest
then runs live), given up when a cancel is not honoured, asked how it stands, and ingested once
it has ended."""

from __future__ import annotations

import logging

from ..providers.batch_api import TERMINAL, RemoteBatch
from ..store.protocol import PAUSED, RUNNING, BatchRecord, Event, JobRecord
from .breaker import paused_by_redirects

log = logging.getLogger("hermes_bulk.runtime.batch_driver")

#: Polls a cancelled batch is given to end before it is given up (20 polls: 10 min at the
#: default 30 s, OpenAI's own bound on cancelling).
CANCEL_GRACE_POLLS = 20


class Polling:
    """Each open batch looked after (a part of BatchDriver, batch_driver.py, whose state it
    uses)."""

    def poll_for(self, job: JobRecord) -> float:
        """How often the job's batches are polled: its --poll, else batch_poll_seconds."""
        return job.spec.batch_poll_s or self.poll_s

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
            # a usable answer: the strikes were not in a row
            self._strikes.pop(batch.batch_id, None)
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
