"""A worker's maintenance: at start and every lease/3 seconds its heartbeat and leases, the
items of dead workers and of expired leases back to the queue, and stalled chains restarted."""

from __future__ import annotations

import logging
import os
import time

from ..errors import HermesBulkError
from ..fleet.liveness import recover_interrupted, this_host
from ..full_disk import disk_full_at
from ..store.protocol import RUNNING, WorkerInfo
from .batch_driver import runs_live

log = logging.getLogger("hermes_bulk.runtime.worker")

#: How often expired leases are looked for (the rest of the maintenance runs every lease/3, 5 s at
#: most).
REAP_EVERY_S = 1.0


class Maintenance:
    """A worker's maintenance (a part of WorkerRuntime, worker.py, whose state it uses)."""

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
