"""Small helpers shared by tests.

Waiting: `wait_for` polls a predicate with a deadline (the sleep only paces the loop). A test that
shows something does NOT happen waits with `worker_passes` for the event that proves the
opportunity passed: the job's triggers are all taken off its queue, then every live worker has
begun maintenance passes (each pass starts with a heartbeat in the store, and the pass before
it ended with the pump that restarts stalled jobs).

Status in-process: `local_jobs` opens the service API (`hermes_bulk.jobs.Jobs`) on a data
directory and backend, so a test polls the store instead of starting a `hermes-bulk status`
process per poll (the command itself has tests of its own).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from hermes_bulk import broker
from hermes_bulk.config import load_settings
from hermes_bulk.jobs import Jobs


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.05, message: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")


@contextlib.contextmanager
def local_jobs(home: str | Path | None = None, backend: str | None = None) -> Iterator[Jobs]:
    """The job service of a data directory (default: HERMES_BULK_HOME of this process) and
    backend (default: its SQLite file), in this process; its handles are closed at the end."""
    overrides = {"home": str(home)} if home is not None else {}
    if backend:
        overrides["backend"] = backend
    try:
        yield Jobs(load_settings(**overrides))
    finally:
        broker.close_all()


def job_status(jobs: Jobs, job_id: str) -> dict:
    """What `status JOB --json` prints, read in this process (tests/test_test_parts.py holds
    the two equal)."""
    return json.loads(json.dumps(jobs.status(job_id).as_dict()))


def worker_passes(jobs: Jobs, job_id: str, passes: int = 2, timeout: float = 60.0) -> None:
    """Block until every chance the live workers have to act on job_id has passed: its queue
    holds no trigger, and after that each live worker has begun `passes` maintenance passes
    (two: the pump of the first has run by the time the second begins)."""
    backend = jobs.backend
    route = backend.client_of(job_id)
    assert route is not None, f"no job {job_id}"
    wait_for(lambda: backend.queue_length([route]) == 0, timeout=timeout, interval=0.02,
             message=f"the triggers of job {job_id} to be taken off its queue")
    since = backend.store.now()
    beats: dict[str, set[float]] = {w.worker_id: set() for w in jobs.liveness.live_workers()}
    assert beats, "no live worker: nothing to wait for"

    def passed() -> bool:
        live = {w.worker_id: w for w in backend.store.live_workers(holding=False)}
        for worker_id in list(beats):
            if worker_id not in live:  # gone (a killed worker's entry ran out): no chance left to act
                del beats[worker_id]
            elif live[worker_id].heartbeat_at >= since:
                beats[worker_id].add(live[worker_id].heartbeat_at)
        return all(len(seen) >= passes for seen in beats.values())

    wait_for(passed, timeout=timeout, interval=0.02,
             message=f"{passes} maintenance passes of every live worker (heartbeats since {since}: {beats})")


def kill_worker_holding_an_item(cli, fake_provider, **extra_env: str) -> None:
    """Start a worker, let it send an item to a provider that holds it, then SIGKILL the worker:
    the item stays claimed by a dead worker (a crash mid-call). The provider answers at once after."""
    fake_provider.hold()
    worker = cli.spawn_worker(HERMES_BULK_LEASE_SECONDS="60", **extra_env)
    try:
        fake_provider.wait_held(1, timeout=60)
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        fake_provider.release()
