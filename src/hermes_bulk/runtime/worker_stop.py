"""A worker's stop: no new request sent, the answers on their way saved (drain), then the
consumers stopped, what it holds given back and the jobs it leaves recorded (Ctrl-C and
signals)."""

from __future__ import annotations

import logging
import os
import time

from ..errors import HermesBulkError
from ..fleet.tasks import stop_serving
from ..store.protocol import INTERRUPTED_WORKER_STOP, RUNNING, Event
from ..words import count

log = logging.getLogger("hermes_bulk.runtime.worker")

#: How often drain() looks whether the answers on their way have landed.
DRAIN_POLL_S = 0.05


class Stopping:
    """A worker's stop (a part of WorkerRuntime, worker.py, whose state it uses)."""

    def stopping(self) -> int:
        """From now on chains claim nothing more and no request is sent: an item whose request
        has not gone out goes back to the queue, the answers on their way are saved as they
        land; stop() follows. Said in one line. Returns how many answers are on their way."""
        on_their_way = self.processor.stop_sending()
        if not self._stopping.is_set():
            self._stopping.set()
            log.info(
                "worker %s stopping: no new items start; %s on %s way",
                self.worker_id,
                count(on_their_way, "answer"),
                "its" if on_their_way == 1 else "their",
            )
        return on_their_way

    def stop_starting(self) -> int:
        """The first Ctrl-C of `run --wait`: stopping(), and its consumers take no more
        triggers (those on the queue stay there). Returns the answers on their way."""
        for consumer in self.consumers:
            consumer.stop_flag.set()
        return self.stopping()

    def drain(self, timeout_s: float) -> bool:
        """Wait, at most timeout_s, until this worker holds no item: the answers on their way
        saved (or ended), the rest given back. Whether it came to that. In the caller's thread,
        so a KeyboardInterrupt (a second Ctrl-C) ends it."""
        ends = time.monotonic() + timeout_s
        while self.processor.held_items():
            left = ends - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(DRAIN_POLL_S, left))
        return True

    def stop(self, *, graceful: bool = True) -> None:
        """Stop consuming, return what this worker still holds to the queue, deregister (once)."""
        self.processor.stop_sending()
        self._stopping.set()
        if self._stopped:
            return
        self._stopped = True
        consumers, self.consumers = self.consumers, []
        for consumer in consumers:
            consumer.stop(graceful=graceful)
        self._stop.set()
        if self._maintenance is not None:
            self._maintenance.join(5)
        if self._batch_thread is not None:
            # a pass ends at a step's end: a batch is never left half-recorded
            self._batch_thread.join(30)
        # a job paused while this process ran it: its batches cancelled
        if self.batch_driver is not None:
            try:
                self.batch_driver.cancel_paused()
            except HermesBulkError as exc:
                log.warning("batches of paused jobs could not be cancelled: %s", exc)
        released: dict[str, int] = {}
        left: list[str] = []
        try:
            released = self.backend.store.release_worker_items(self.worker_id)
            for job_id, n in released.items():
                self.backend.trigger(job_id, 0, n)
            left = self._record_stop(released)
            self.backend.store.remove_worker(self.worker_id)
        except HermesBulkError as exc:
            log.warning("could not deregister worker %s: %s", self.worker_id, exc)
        went_back = sum(released.values())
        log.info(
            "worker %s stopped: %s went back to the queue%s%s",
            self.worker_id,
            "no items" if not went_back else count(went_back, "item"),
            "".join(f"; job {j}: {n}" for j, n in sorted(released.items()))
            if len(released) > 1
            else "",
            f"; unfinished: {', '.join(left)}" if left else "",
        )
        stop_serving(self)
        for client in self._clients.values():
            client.close()
        for api in self._batch_apis.values():
            api.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self.liveness.lock_path(self.worker_id).unlink(missing_ok=True)
            self._lock_fd = None

    def _record_stop(self, released: dict[str, int]) -> list[str]:
        """The running, unfinished jobs this worker leaves; a `hermes-bulk worker` records on each
        that it stopped gracefully (what --resume-interrupted continues)."""
        with self._taken_lock:
            worked = sorted(self._worked | set(released))
        left = []
        for job_id in worked:
            job = self.backend.store.get_job(job_id)
            if job is None or job.finished or job.state != RUNNING:
                continue
            left.append(job_id)
            if self.stops_gracefully:
                n = released.get(job_id, 0)
                self.backend.store.mark_interrupted(
                    job_id,
                    INTERRUPTED_WORKER_STOP,
                    event=Event(
                        "worker_stopped",
                        f"worker {self.worker_id} stopped gracefully"
                        + (f"; {count(n, 'item')} it held went back to the queue" if n else ""),
                    ),
                )
        return left
