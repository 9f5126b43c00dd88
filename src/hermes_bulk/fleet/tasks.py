"""The Huey side: the one task (a trigger), and consumers (the `worker` command, and embedded).

A task carries only (job id, index hint): the store holds the truth, because Huey dequeues
destructively and a killed worker loses the task it held (reference/huey-probe.md). The task
asks the handler serving its queue in this process (a WorkerRuntime, `serve`) to handle it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Protocol

from huey import Huey
from huey.api import TaskWrapper
from huey.consumer import Consumer
from huey.exceptions import RetryTask

log = logging.getLogger("hermes_bulk.fleet.tasks")

TASK_NAME = "hermes_bulk.process_item"

#: Polling of the SQLite queue, tuned for latency (reference/huey-probe.md §2: the defaults
#: reach a 10 s poll after a minute idle; these keep pick-up under 50 ms at ~0.2 % CPU).
POLL_INITIAL_DELAY_S = 0.01
POLL_MAX_DELAY_S = 0.5
POLL_BACKOFF = 1.15


class TriggerHandler(Protocol):
    def handle_trigger(self, job_id: str, index_hint: int) -> float | None:
        """Process one trigger; returns seconds after which to run it again, or None."""


# Which handler takes the triggers of each queue in this process: the runtime whose consumers
# read that queue. Keyed by the Huey instance (one per queue per backend per process).
_handlers: dict[Huey, TriggerHandler] = {}
_handlers_lock = threading.Lock()


def serve(queues: Iterable[Huey], handler: TriggerHandler) -> None:
    """From now on, triggers of these queues that run in this process go to handler."""
    with _handlers_lock:
        _handlers.update(dict.fromkeys(queues, handler))


def stop_serving(handler: TriggerHandler) -> None:
    """Triggers no longer go to handler (a trigger that still runs here is logged and dropped)."""
    with _handlers_lock:
        for huey in [huey for huey, serving in _handlers.items() if serving is handler]:
            del _handlers[huey]


def register_process_item(huey: Huey) -> TaskWrapper:
    """Register the trigger task on this Huey instance; its handler is looked up when it runs."""

    def process_item(job_id: str, index_hint: int) -> None:
        with _handlers_lock:
            handler = _handlers.get(huey)
        if (
            handler is None
        ):  # only a consumer executes tasks, and every consumer's runtime serves its queue
            log.error("trigger for job %s arrived in a process without a worker runtime", job_id)
            return
        delay_s = handler.handle_trigger(job_id, index_hint)
        if delay_s is not None:
            # RetryTask reschedules without using up Huey retries (we keep our own counts).
            raise RetryTask(delay=max(1.0, delay_s))

    return huey.task(name=TASK_NAME, retries=0)(process_item)


def consumer_options(workers: int, **overrides) -> dict:
    options = dict(
        workers=workers,
        worker_type="thread",
        periodic=False,
        initial_delay=POLL_INITIAL_DELAY_S,
        max_delay=POLL_MAX_DELAY_S,
        backoff=POLL_BACKOFF,
        check_worker_health=True,
        scheduler_interval=1,
    )
    options.update({k: v for k, v in overrides.items() if v is not None})
    return options


class EmbeddedConsumer(Consumer):
    """A consumer inside a host process (`run --wait`, the Hermes gateway).

    The host owns process signals: huey's Consumer.start() installs handlers, which fails off
    the main thread (after the threads have started). This override is a private huey method,
    so huey is pinned to 3.5.x and tests/test_tasks.py pins the behaviour.
    """

    def _set_signal_handlers(self) -> None:
        pass


class QueuesConsumer(Consumer):
    """The `worker` command's consumer: huey's own, in the foreground with its signal handling,
    on the first queue; the other queues (one per further kind of job the worker serves) get
    embedded consumers that start, stop and are health-checked with it.

    `on_stopping` runs first thing in a stop (chains claim no more), `on_stopped` once the
    threads are done: the runtime hands back what it holds there, before huey exits, or execs
    itself on SIGHUP (a restart), which would skip any code after run()."""

    def __init__(
        self,
        queues: list[Huey],
        *,
        threads: list[int] | None = None,
        on_stopping: Callable[[], None] | None = None,
        on_stopped: Callable[[bool], None] | None = None,
        **options,
    ) -> None:
        """threads: worker threads per queue (queues' order); by default options' `workers` each."""
        counts = threads or [options["workers"]] * len(queues)
        super().__init__(queues[0], **{**options, "workers": counts[0]})
        self.others = [
            EmbeddedConsumer(huey, **{**options, "workers": n})
            for huey, n in zip(queues[1:], counts[1:], strict=True)
        ]
        self.on_stopping, self.on_stopped = on_stopping, on_stopped

    def start(self) -> None:
        for other in self.others:
            other.start()
        super().start()

    def stop(self, graceful: bool = False) -> None:
        if self.on_stopping:
            self.on_stopping()
        super().stop(graceful=graceful)
        for other in self.others:
            other.stop(graceful=graceful)
        if self.on_stopped:
            self.on_stopped(graceful)

    def check_worker_health(self) -> bool:
        healthy = [other.check_worker_health() for other in self.others]
        return super().check_worker_health() and all(healthy)
