"""Small helpers shared by tests.

Waiting: `wait_for` polls a predicate with a deadline (the sleep only paces the loop). A test that
shows something does NOT happen waits with `worker_passes` for the event that proves the
opportunity passed: the job's triggers are all taken off its queue, then every live worker has
begun maintenance passes (each pass starts with a heartbeat in the store, and the pass before
it ended with the pump that restarts stalled jobs).

Status in-process: `local_jobs` opens the service API (`hermes_bulk.jobs.service.Jobs`) on a data
directory and backend, so a test polls the store instead of starting a `hermes-bulk status`
process per poll (the command itself has tests of its own).

Commands in-process: `run_in_process` runs `hermes-bulk ARGS` through the same `cli.main` in this
process, as a fresh process would find it (its environment and argv) and leaving nothing behind
(log handlers, the request gate, backends it opened). A process start costs 0.3-0.6 CPU-seconds
here, and the suite starts about 800 `create` and `run` commands that are a test's set-up.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from hermes_bulk.config.settings import load_settings
from hermes_bulk.fleet import broker
from hermes_bulk.jobs.service import Jobs
from hermes_bulk.store.protocol import NOT_STARTED, RUNNING, JobSpec, NewItem


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


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """os.environ is exactly env inside the block, and as it was after it."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _logging_restored() -> Iterator[None]:
    """The command's loggers (`hermes_bulk`, `huey`) and the filters it adds to the handlers of
    the root logger put back as they were; the handlers it installed are closed."""
    loggers = [logging.getLogger(name) for name in ("hermes_bulk", "huey")]
    saved = [(lg, list(lg.handlers), lg.level, lg.propagate) for lg in loggers]
    handlers = [h for h in [*logging.getLogger().handlers, logging.lastResort] if h is not None]
    filters = [(h, list(h.filters)) for h in handlers]
    try:
        yield
    finally:
        for lg, before, level, propagate in saved:
            for handler in lg.handlers:
                if handler not in before:
                    handler.close()
            lg.handlers[:] = before
            lg.setLevel(level)
            lg.propagate = propagate
        for handler, before in filters:
            handler.filters[:] = before


def run_in_process(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """`hermes-bulk ARGS` run by cli.main in this process, with env as its whole environment;
    its output and exit status as subprocess.run gives them."""
    from hermes_bulk.frontends import cli

    out, err = io.StringIO(), io.StringIO()
    saved_argv = sys.argv
    sys.argv = ["hermes-bulk", *args]
    _forget_request_gate(cli)
    try:
        with (
            environment(env),
            _logging_restored(),
            broker.closing_new(),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            try:
                code = cli.main(list(args))
            except SystemExit as exc:  # as the interpreter would end it
                code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = saved_argv
        _forget_request_gate(cli)
    return subprocess.CompletedProcess(["hermes-bulk", *args], code, out.getvalue(), err.getvalue())


def _forget_request_gate(cli) -> None:
    """A process finds its budget from its own HERMES_HOME: the gate a command found (and the
    ledger it opened) is closed and forgotten."""
    if cli.request_gate.cache_info().currsize:
        cli.request_gate().close()
    cli.request_gate.cache_clear()


def job_status(jobs: Jobs, job_id: str) -> dict:
    """What `status JOB --json` prints, read in this process (tests/test_harness.py holds
    the two equal)."""
    return json.loads(json.dumps(jobs.status(job_id).as_dict()))


def worker_passes(jobs: Jobs, job_id: str, passes: int = 2, timeout: float = 60.0) -> None:
    """Block until every chance the live workers have to act on job_id has passed: its queue
    holds no trigger, and after that each live worker has begun `passes` maintenance passes
    (two: the pump of the first has run by the time the second begins)."""
    backend = jobs.backend
    route = backend.client_of(job_id)
    assert route is not None, f"no job {job_id}"
    wait_for(
        lambda: backend.queue_length([route]) == 0,
        timeout=timeout,
        interval=0.02,
        message=f"the triggers of job {job_id} to be taken off its queue",
    )
    since = backend.store.now()
    beats: dict[str, set[float]] = {w.worker_id: set() for w in jobs.liveness.live_workers()}
    assert beats, "no live worker: nothing to wait for"

    def passed() -> bool:
        live = {w.worker_id: w for w in backend.store.live_workers(holding=False)}
        for worker_id in list(beats):
            if (
                worker_id not in live
            ):  # gone (a killed worker's entry ran out): no chance left to act
                del beats[worker_id]
            elif live[worker_id].heartbeat_at >= since:
                beats[worker_id].add(live[worker_id].heartbeat_at)
        return all(len(seen) >= passes for seen in beats.values())

    wait_for(
        passed,
        timeout=timeout,
        interval=0.02,
        message=f"{passes} maintenance passes of every live worker (heartbeats since {since}: "
        f"{beats})",
    )


def kill_worker_holding_an_item(cli, fake_provider, **extra_env: str) -> None:
    """Start a worker, let it send an item to a provider that holds it, then SIGKILL the worker: the
    item stays claimed by a dead worker (a crash mid-call). The provider answers at once after.
    One thread: a second thread's request could still be on its way when the first is held, and
    reach the provider after the kill (a test counting requests from then on would count it)."""
    fake_provider.hold()
    worker = cli.spawn_worker("-w", "1", HERMES_BULK_LEASE_SECONDS="60", **extra_env)
    try:
        fake_provider.wait_held(1, timeout=60)
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        fake_provider.release()


def running_job(store, job_id: str, contents: list[str], **spec_kw) -> str:
    """A running JSONL job of the given item contents, straight in the store (no source file,
    so no change check fails it)."""
    spec = {"instruction": "Echo", "source": "/in", "source_kind": "jsonl", "concurrency": 4}
    store.begin_job(JobSpec(job_id=job_id, retries=2, provider_key="p:x", **{**spec, **spec_kw}))
    store.add_items(
        job_id,
        [
            NewItem(i, f"item-{i}", text, f"b2:{job_id}{i}", "", -1, "", 10)
            for i, text in enumerate(contents)
        ],
    )
    store.finish_job(job_id)
    store.set_state(job_id, RUNNING, from_states=[NOT_STARTED])
    return job_id


def without_proxies(monkeypatch) -> None:
    """No proxy variable of the runner's reaches a client of the test: loopback is spoken to
    directly, as a user without a proxy would."""
    for scheme in ("http", "https", "all"):
        for name in (f"{scheme}_proxy", f"{scheme.upper()}_PROXY"):
            monkeypatch.delenv(name, raising=False)
