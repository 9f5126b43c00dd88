"""Workers that say what they do, and rolling restarts.

Real `hermes-bulk worker` processes on SQLite and on Redis, the loopback provider. SIGINT and
SIGTERM are graceful stops (the worker hands back what it holds and records it on the job);
kill -9 is a crash. By default a job cut off by either waits for `run` (the seed's promise);
a worker started with --resume-interrupted (or HERMES_BULK_RESUME_INTERRUPTED) continues the
first kind, never the second.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import job_status, kill_worker_holding_an_item, local_jobs, wait_for, worker_passes

BACKENDS = ["sqlite", "redis"]


@pytest.fixture(params=BACKENDS)
def backend_env(request) -> dict[str, str]:
    if request.param == "sqlite":
        return {}
    return {"HERMES_BULK_BACKEND": request.getfixturevalue("redis_url")}


class Worker:
    """`hermes-bulk worker` with its stderr (the log) in a file."""

    def __init__(self, cli, path: Path, *flags: str, **env: str) -> None:
        self.path = path
        self._err = open(path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hermes_bulk", "worker", "-w", "2", *flags],
            env=cli.full_env(**env),
            stdout=subprocess.DEVNULL,
            stderr=self._err,
            stdin=subprocess.DEVNULL,
        )

    @property
    def log(self) -> str:
        return self.path.read_text()

    def stop(self, sig: int = signal.SIGINT, then=None) -> str:
        """Signal the worker (then call `then`, e.g. to let held requests go) and wait for its
        exit."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        if then is not None:
            then()
        try:
            assert self.proc.wait(60) == 0, self.log
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._err.close()
        return self.log


def _items(tmp_path: Path, n: int) -> Path:
    folder = tmp_path / "items"
    folder.mkdir()
    for i in range(n):
        (folder / f"{i:03d}.txt").write_text(f"item number {i}\n")
    return folder


def _create(cli, folder: Path, env, *flags: str) -> str:
    return cli.json("create", "Summarize", "--over", str(folder), *flags, "--json", **env)["job_id"]


def _status(cli, job_id, env):
    """What `status --json` says, read in this process (the command has tests of its own)."""
    with local_jobs(backend=env.get("HERMES_BULK_BACKEND")) as jobs:
        return job_status(jobs, job_id)


def _quiet(job_id, env) -> dict:
    """Once the worker has taken every trigger of the job and begun two maintenance passes since
    (nothing it could start is left to start), the job's status."""
    with local_jobs(backend=env.get("HERMES_BULK_BACKEND")) as jobs:
        worker_passes(jobs, job_id)
        return job_status(jobs, job_id)


#: A maintenance pass a second, for a worker whose passes a test waits for.
FAST_PASSES = {"HERMES_BULK_LEASE_SECONDS": "3"}


def _start_and_stop_mid_job(cli, fake_provider, tmp_path, env, sig, *flags):
    """A job of 24 items, 4 done by one worker and 2 in progress (held at the provider), when
    the worker is stopped with sig; the provider answers at once from then on."""
    job_id = _create(cli, _items(tmp_path, 24), env, "--concurrency", "2")
    cli("run", job_id, **env)
    fake_provider.hold(let_through=4)
    try:
        worker = Worker(cli, tmp_path / "first.stderr", *flags, **env)
        fake_provider.wait_held(2)  # the four answers are recorded: their chains claimed these two
        # SIGINT lets the two in progress finish: their answers are let through once it stops.
        # SIGTERM
        # stops at once: they stay held until it has exited, so they cannot complete meanwhile.
        graceful = sig == signal.SIGINT
        log = worker.stop(
            sig, then=(lambda: _release_once_stopping(worker, fake_provider)) if graceful else None
        )
    finally:
        fake_provider.release()
    return job_id, log


def _release_once_stopping(worker: Worker, fake_provider) -> None:
    """Once the worker says it is stopping (its chains claim nothing more), let the requests it
    holds at the provider be answered."""
    wait_for(
        lambda: "stopping: no new items start" in worker.log,
        timeout=30,
        message="the worker's stopping line",
    )
    fake_provider.release()


def _one(pattern: str, log: str) -> re.Match:
    found = list(re.finditer(pattern, log, re.M))
    assert len(found) == 1, f"{pattern!r} {len(found)} times in:\n{log}"
    return found[0]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_a_flagged_worker_continues_a_job_that_a_graceful_stop_cut_off(
    cli, fake_provider, tmp_path, backend_env, sig
):
    env = {**backend_env, "HERMES_BULK_LEASE_SECONDS": "60"}
    job_id, log = _start_and_stop_mid_job(
        cli, fake_provider, tmp_path, env, sig, "--resume-interrupted"
    )
    _one(
        r"INFO hermes_bulk: worker \S+: 2 threads on \S+; serves jobs created by hermes-bulk "
        r"create; "
        r"resumes jobs a graceful worker stop cut off \(--resume-interrupted\)$",
        log,
    )
    _one(rf"job {job_id} taken up: \d+ items left of 24, up to 2 at once$", log)
    stopped = _one(
        r"worker \S+ stopped: (no items|(\d+) items?) went back to the queue; unfinished: "
        rf"{job_id}$",
        log,
    )
    went_back = int(stopped.group(2) or 0)
    if sig == signal.SIGTERM:
        assert went_back >= 1, "SIGTERM stops at once: the items in progress go back"
    else:
        assert went_back == 0, "SIGINT lets the items in progress finish"
    assert "Hermes" not in log, (
        "a worker that never meets a job made in Hermes says nothing about Hermes"
    )
    st = _status(cli, job_id, env)
    assert (st["state"], st["interrupted"], st["running"]) == (
        "awaiting_recovery",
        "worker_stop",
        0,
    )
    assert "--resume-interrupted continues it" in cli("status", job_id, **env).stdout

    sent = len(fake_provider.requests)
    again = Worker(cli, tmp_path / "second.stderr", "--resume-interrupted", **env)
    try:
        wait_for(
            lambda: _status(cli, job_id, env)["state"] == "completed",
            timeout=60,
            message="the job continues",
        )
        wait_for(lambda: "finished" in again.log, timeout=15, message="the finish line")
    finally:
        log2 = again.stop(signal.SIGINT)
    _one(rf"job {job_id} continues: its workers stopped gracefully", log2)
    _one(rf"job {job_id} taken up: \d+ items? left of 24", log2)
    _one(rf"job {job_id} finished: 24 completed, 0 failed$", log2)
    _one(r"worker \S+ stopped: no items went back to the queue$", log2)
    assert len(fake_provider.requests) - sent == st["pending"], "each item left is sent once"
    events = cli("events", job_id, **env).stdout
    assert "worker_stopped" in events and "resumed" in events and "awaiting_recovery" not in events
    st = _status(cli, job_id, env)
    assert (st["completed"], st["failed"], st["interrupted"]) == (24, 0, None)


def test_a_sighup_restart_of_a_flagged_worker_continues_its_jobs(
    cli, fake_provider, tmp_path, backend_env
):
    """huey's own restart (SIGHUP: a graceful stop, then it execs itself with the same flags)."""
    env = {**backend_env, "HERMES_BULK_LEASE_SECONDS": "60"}
    job_id = _create(cli, _items(tmp_path, 16), env, "--concurrency", "2")
    cli("run", job_id, **env)
    fake_provider.hold(let_through=2)  # two done, two in progress at the SIGHUP
    worker = Worker(cli, tmp_path / "hup.stderr", "--resume-interrupted", **env)
    try:
        fake_provider.wait_held(2)
        worker.proc.send_signal(signal.SIGHUP)
        _release_once_stopping(
            worker, fake_provider
        )  # the graceful stop lets the two in progress finish
        wait_for(
            lambda: "continues" in worker.log,
            timeout=60,
            message="the restarted worker continues the job",
        )
        wait_for(
            lambda: _status(cli, job_id, env)["state"] == "completed",
            timeout=60,
            message="completion",
        )
    finally:
        log = worker.stop()
    assert len(re.findall(r"INFO hermes_bulk: worker \S+: 2 threads", log)) == 2, log
    _one(rf"worker \S+ stopped: no items went back to the queue; unfinished: {job_id}$", log)
    _one(rf"job {job_id} continues", log)
    assert _status(cli, job_id, env)["failed"] == 0


def test_by_default_a_restarted_worker_leaves_a_gracefully_stopped_job_for_run(
    cli, fake_provider, tmp_path, backend_env
):
    env = {**backend_env, "HERMES_BULK_LEASE_SECONDS": "60"}
    job_id, _ = _start_and_stop_mid_job(cli, fake_provider, tmp_path, env, signal.SIGTERM)
    sent = len(fake_provider.requests)
    again = Worker(cli, tmp_path / "second.stderr", **{**env, **FAST_PASSES})
    try:
        wait_for(
            lambda: "awaits recovery" in again.log, timeout=30, message="the worker's recovery line"
        )
        st = _quiet(job_id, env)
        assert (st["state"], st["interrupted"]) == ("awaiting_recovery", "worker_stop")
        assert len(fake_provider.requests) == sent, "nothing is sent until someone runs the job"
        cli("run", job_id, **env)
        wait_for(
            lambda: _status(cli, job_id, env)["state"] == "completed",
            timeout=60,
            message="run continues it",
        )
    finally:
        log = again.stop(signal.SIGINT)
    _one(rf"job {job_id} awaits recovery: its workers stopped gracefully before it finished", log)
    assert _status(cli, job_id, env)["interrupted"] is None


def test_a_flagged_worker_never_continues_a_job_cut_off_by_a_crash(
    cli, fake_provider, tmp_path, backend_env
):
    flagged = {**backend_env, "HERMES_BULK_RESUME_INTERRUPTED": "1"}  # the setting, not the flag
    job_id = _create(cli, _items(tmp_path, 6), backend_env)
    cli("run", job_id, **backend_env)
    kill_worker_holding_an_item(cli, fake_provider, **flagged)
    sent = len(fake_provider.requests)
    again = Worker(cli, tmp_path / "after-crash.stderr", **flagged, **FAST_PASSES)
    try:
        wait_for(
            lambda: "awaits recovery" in again.log, timeout=30, message="the worker's recovery line"
        )
        st = _quiet(job_id, backend_env)
    finally:
        log = again.stop(signal.SIGINT)
    assert (st["state"], st["interrupted"], st["running"]) == ("awaiting_recovery", "orphaned", 0)
    assert len(fake_provider.requests) == sent, (
        "a crash's job waits for run, even for a flagged worker"
    )
    assert "resumes jobs a graceful worker stop cut off" in log, "the setting turned it on"
    _one(rf"job {job_id} awaits recovery: its workers stopped without a graceful worker stop", log)
    assert "--resume-interrupted continues it" not in cli("status", job_id, **backend_env).stdout


def test_a_crash_after_a_resume_is_a_crash(cli, fake_provider, tmp_path, backend_env):
    """The job keeps its last interruption: a graceful stop, then a resumed worker killed with -9
    while it holds an item. The next flagged worker must not continue it."""
    env = {**backend_env, "HERMES_BULK_LEASE_SECONDS": "60"}
    job_id, _ = _start_and_stop_mid_job(cli, fake_provider, tmp_path, env, signal.SIGTERM)
    assert _status(cli, job_id, env)["interrupted"] == "worker_stop"
    fake_provider.reset_records()  # so the helper waits for the resumed worker's own request
    kill_worker_holding_an_item(
        cli, fake_provider, HERMES_BULK_RESUME_INTERRUPTED="1", **backend_env
    )
    sent = len(fake_provider.requests)
    again = Worker(cli, tmp_path / "after.stderr", "--resume-interrupted", **{**env, **FAST_PASSES})
    try:
        wait_for(
            lambda: "awaits recovery" in again.log, timeout=30, message="the worker's recovery line"
        )
        st = _quiet(job_id, env)
    finally:
        again.stop()
    assert (st["state"], st["interrupted"]) == ("awaiting_recovery", "orphaned")
    assert len(fake_provider.requests) == sent
    events = cli("events", job_id, **env).stdout
    assert events.index("resumed") < events.index("awaiting_recovery"), events


def test_the_aof_warning_is_said_once(cli, tmp_path):
    from .conftest import RedisServer

    (tmp_path / "volatile").mkdir()
    volatile = RedisServer(tmp_path / "volatile").start()
    try:
        import redis as redis_py

        r = redis_py.Redis.from_url(volatile.url)
        r.config_set("appendonly", "no")
        r.close()
        proc = subprocess.run(
            [sys.executable, "-m", "hermes_bulk", "worker", "--burst"],
            capture_output=True,
            text=True,
            timeout=60,
            env=cli.full_env(HERMES_BULK_BACKEND=volatile.url),
        )
    finally:
        volatile.kill()
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("does not persist with an append-only file") == 1, proc.stderr
    assert "Hermes" not in proc.stderr
