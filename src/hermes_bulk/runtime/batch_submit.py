"""Submitting a batch: opened in the store (or taken over from a worker that stopped), its
file uploaded, the batch created at the provider (or found there by its metadata) and its id
recorded."""

from __future__ import annotations

import logging

from ..errors import ModelError, PermanentModelError
from ..providers.batch_api import META_BATCH, META_JOB, BatchAnswerInvalid, BatchApi
from ..store.protocol import (
    BATCH_DONE,
    RUNNING,
    BatchRecord,
    ClaimRefused,
    Event,
    JobRecord,
    JobStore,
)
from .batch_requests import new_batch_id
from .breaker import pause_job

log = logging.getLogger("hermes_bulk.runtime.batch_driver")

#: What a batch create (or a file upload) answers on an endpoint without the batch API.
NO_BATCH_API = frozenset({400, 404, 405})


class Submitting:
    """A batch got to the provider (a part of BatchDriver, batch_driver.py, whose state it
    uses)."""

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
        return recorded_ids(self.store, job_id)

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


def recorded_ids(store: JobStore, job_id: str) -> frozenset[str]:
    """The provider ids of the job's batches already recorded: never another batch's to adopt."""
    return frozenset(b.provider_id for b in store.list_batches(job_id) if b.provider_id)
