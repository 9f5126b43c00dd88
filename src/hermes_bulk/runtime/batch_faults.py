"""What goes wrong in a batch step, and what it costs the batch: a strike for an answer that
cannot be used (MAX_STRIKES of them and the batch is given up), a wait for a redirect or an
unreachable endpoint (the breaker's count of them pauses the job), a pause for a refused key."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from ..errors import EndpointUnreachable, HermesBulkError, ModelError, RateLimited
from ..full_disk import disk_full_at
from ..providers.batch_api import (
    TERMINAL,
    BatchAnswerInvalid,
    BatchFileUnreadable,
    BatchRedirected,
    BatchUnreachable,
)
from ..store.protocol import BATCH_DONE, BatchRecord, Event, ItemError, JobRecord
from .breaker import pause_job, pause_reason, redirect_reason, refuses_key

log = logging.getLogger("hermes_bulk.runtime.batch_driver")

#: Unusable answers about one batch (a poll, a create, an upload or a file download that failed
#: or could not be read), a poll apart, before the batch is given up.
MAX_STRIKES = 5
#: A full disk is no strike against a batch: what it has answered stays at the provider and
#: is read again once there is room; never bought again.
DISK_FULL = "job %s: the disk is full at %s; its batches' results are read again once there is room"
#: The final status recorded for a batch given up without the provider ending it.
ABANDONED = "abandoned"
#: The longest a redirected batch step waits before it is tried again, in polls (doubling).
REDIRECT_BACKOFF_POLLS = 32
#: Item error type of a batch given up (an attempt's event and, past --retries, the item's).
BATCH_UNUSABLE = "BatchUnusable"


class StepFaults:
    """One step of one batch, guarded (a part of BatchDriver, batch_driver.py, whose state it
    uses)."""

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
                log.warning(DISK_FULL, job.job_id, full)  # not the batch's fault: no strike
                self._retry_at[batch.batch_id] = self.store.now() + self.poll_for(job)
                return failed
            log.exception(
                "job %s: batch %s: a step failed", job.job_id, batch.provider_id or batch.batch_id
            )
            self._report(job.job_id, batch.batch_id, exc)
            what = f"an internal error ({type(exc).__name__}); the details are in the worker's log"
        self._strike(job, batch, what)
        return failed

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


def _what(exc: ModelError) -> str:
    """What went wrong in a batch step, in our words: a Batch API answer that could not be
    used names itself; an HTTP error is its status (model.classify_status speaks of the
    endpoint or model, which a batch's missing file or unknown id is not)."""
    if isinstance(exc, (BatchAnswerInvalid, BatchFileUnreadable)) or exc.http_status is None:
        return str(exc)
    return f"the provider's Batch API answered HTTP {exc.http_status}"
