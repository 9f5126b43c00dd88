"""Ctrl-C in `run --wait` (issue 46): the first stops claiming and saves the answers already on
their way, the second abandons them to the queue; nothing is asked twice that need not be, and
nothing is lost.

Real `hermes-bulk run --wait` processes and real SIGINTs against the loopback provider, whose
gate holds the requests that reach it (so "on their way" is a count, not a timing) and whose
request log proves what was asked: after one Ctrl-C the provider's count of requests equals the
items answered; after two the process exits while the provider still holds its requests, and a
later run asks those items again. On SQLite and on Redis (run --wait takes the configured one).
The waits before a request (pacing, a retry's backoff) that a stop cuts short are shown in
process, with the runtime's own calls.
"""

from __future__ import annotations

import collections
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hermes_bulk.config.settings import load_settings
from hermes_bulk.fleet import broker
from hermes_bulk.jobs.request import JobRequest
from hermes_bulk.jobs.service import Jobs
from hermes_bulk.runtime import sending
from hermes_bulk.runtime.worker import WorkerRuntime
from hermes_bulk.testing.fake_provider import digest

from .helpers import wait_for


@pytest.fixture(params=["sqlite", "redis"])
def backend_env(request) -> dict[str, str]:
    if request.param == "sqlite":
        return {}
    return {"HERMES_BULK_BACKEND": request.getfixturevalue("redis_url")}


def _items(tmp_path: Path, n: int) -> tuple[Path, list[str]]:
    folder = tmp_path / "items"
    folder.mkdir()
    texts = [f"item number {i}\n" for i in range(n)]
    for i, text in enumerate(texts):
        (folder / f"{i:02d}.txt").write_text(text)
    return folder, [digest(t) for t in texts]


class RunWait:
    """`hermes-bulk run JOB --wait` in a process of its own, its standard error read as it
    comes (a pipe, as in CI: plain lines)."""

    def __init__(self, cli, job: str, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hermes_bulk", "run", job, "--wait", "--no-check"],
            env=cli.full_env(**env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        cli.spawned.append(self.proc)  # killed at the test's end if it is still running
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def said(self, start: str) -> list[str]:
        """The lines from the first that starts with `start`, once it has come."""

        def found():
            at = [i for i, line in enumerate(self.lines) if line.startswith(start)]
            return self.lines[at[0] :] if at else None

        return wait_for(found, timeout=60, message=f"a line {start!r} (so far: {self.lines})")

    def interrupt(self) -> None:
        self.proc.send_signal(signal.SIGINT)

    def ended(self, timeout: float) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(10)
        self.proc.stdout.close()
        self.proc.stderr.close()
        return rc


def _counts(cli, job: str, env) -> tuple[int, int, int]:
    st = cli.status(job, **env)
    return st["completed"], st["pending"], st["running"]


def test_one_ctrl_c_saves_the_answers_on_their_way_and_asks_nothing_again(
    cli, fake_provider, tmp_path, backend_env
):
    folder, items = _items(tmp_path, 10)
    job = cli.json(
        "create", "Summarize", "--over", str(folder), "--concurrency", "4", "--json", **backend_env
    )["job_id"]
    # The first answer comes at once (a process's first request to a key goes alone), then
    # the gate holds every request: four answers on their way, none answered.
    fake_provider.hold(let_through=1)
    run = RunWait(cli, job, backend_env)
    try:
        fake_provider.wait_held(4)
        run.interrupt()
        assert run.said("Stopping:")[:2] == [
            "Stopping: no new item starts; the 4 answers on their way are saved first",
            "(up to 2 min). Ctrl-C again to abandon them: they will be asked again.",
        ]
    finally:
        fake_provider.release()  # the answers land now, after the stop began
    assert run.ended(timeout=60) == 130
    assert run.lines[-2:] == [
        "Stopped: all 4 answers were saved.",
        f"Continue with: hermes-bulk run {job} --wait",
    ], run.lines
    assert all(len(line) <= 80 for line in run.lines), run.lines
    # Saved, and nothing claimed after the stop: the provider was asked exactly what was kept.
    assert _counts(cli, job, backend_env) == (5, 5, 0)
    assert len(fake_provider.requests) == 5
    # The next run asks the other six, and none of the four again.
    cli("run", job, "--wait", "--no-check", **backend_env)
    assert _counts(cli, job, backend_env) == (10, 0, 0)
    asked = collections.Counter(r.item for r in fake_provider.requests)
    assert asked == collections.Counter(items), asked


def test_a_second_ctrl_c_abandons_them_to_the_queue_and_a_later_run_asks_them_again(
    cli, fake_provider, tmp_path, backend_env
):
    folder, items = _items(tmp_path, 10)
    job = cli.json(
        "create", "Summarize", "--over", str(folder), "--concurrency", "4", "--json", **backend_env
    )["job_id"]
    fake_provider.hold(let_through=1)
    run = RunWait(cli, job, backend_env)
    try:
        fake_provider.wait_held(4)
        run.interrupt()
        run.said("Stopping:")
        run.interrupt()
        # It ends while the provider still holds all four: it waited for none of them.
        assert run.ended(timeout=30) == 130
        assert fake_provider.held == 4
        assert run.lines[-2:] == [
            "Abandoned: their 4 items go back to the queue and will be asked again.",
            f"Continue with: hermes-bulk run {job} --wait",
        ], run.lines
        assert _counts(cli, job, backend_env) == (1, 9, 0)  # pending again, nothing lost
    finally:
        fake_provider.release()  # their answers go to a process that is gone
    cli("run", job, "--wait", "--no-check", **backend_env)
    assert _counts(cli, job, backend_env) == (10, 0, 0)
    asked = collections.Counter(r.item for r in fake_provider.requests)
    # The four abandoned were asked twice, as the second Ctrl-C said; the rest once.
    assert sorted(asked.values()) == [1] * 6 + [2] * 4 and set(asked) == set(items), asked
    assert len(fake_provider.requests) == 14


# In process: what a stop cuts short ------------------------------------------------------


@pytest.fixture
def jobs(env) -> Jobs:
    yield Jobs(load_settings())
    broker.close_all()


def _runtime(jobs: Jobs, threads: int) -> WorkerRuntime:
    runtime = WorkerRuntime(jobs.backend, jobs.settings, threads=threads)
    runtime.start()
    runtime.start_embedded_consumer()
    return runtime


def test_items_waiting_their_turn_go_back_at_once_and_are_never_sent(jobs, fake_provider, tmp_path):
    """--rpm 9: after the first answer, the four chains wait their turns (7 s, 13 s …, or give
    the item back past 15 s). The stop ends those waits at once: nothing is on its way, the
    drain ends, and no request is sent after the first."""
    folder, _ = _items(tmp_path, 8)
    job = jobs.create(
        JobRequest(instruction="Summarize", over=str(folder), concurrency=4, rpm=9)
    ).job.job_id
    jobs.run(job)
    runtime = _runtime(jobs, threads=4)
    try:
        wait_for(lambda: jobs.status(job).job.completed == 1, message="the first answer")
        wait_for(lambda: jobs.status(job).job.running >= 2, message="chains waiting their turn")
        assert runtime.stop_starting() == 0
        assert runtime.drain(5), "a wait before a request was not cut short"
    finally:
        runtime.stop(graceful=False)
    st = jobs.status(job).job
    assert (st.completed, st.pending, st.running) == (1, 7, 0)
    assert len(fake_provider.requests) == 1, "a waiting item was sent after the stop"


def test_a_retry_waiting_its_backoff_is_given_back_not_sent_again(
    jobs, fake_provider, tmp_path, monkeypatch
):
    """A 500, then the backoff before the second attempt: a stop during it gives the item back
    with its one attempt recorded, and no second request is sent. Its neighbour, the same 500
    with no stop, is asked again after the backoff."""
    monkeypatch.setattr(sending, "RETRY_WAIT", lambda state: 60.0)
    folder, _ = _items(tmp_path, 1)
    job = jobs.create(
        JobRequest(instruction="Summarize", over=str(folder), concurrency=1)
    ).job.job_id
    fake_provider.configure(script=["500"])
    jobs.run(job)
    runtime = _runtime(jobs, threads=1)
    try:
        wait_for(
            lambda: any(e.kind == "attempt_failed" for e in jobs.status(job, events=5).events),
            message="the failed attempt recorded: its backoff begins",
        )
        assert runtime.stop_starting() == 0  # in its backoff: nothing on its way
        assert runtime.drain(5), "the backoff was not cut short"
    finally:
        runtime.stop(graceful=False)
    st = jobs.status(job).job
    assert (st.completed, st.pending, st.running) == (0, 1, 0)
    assert len(fake_provider.requests) == 1
    monkeypatch.setattr(sending, "RETRY_WAIT", lambda state: 0.05)
    jobs.run(job)  # the neighbour: without a stop, the backoff ends in a second request
    runtime = _runtime(jobs, threads=1)
    try:
        wait_for(lambda: jobs.status(job).state == "completed", timeout=30, message="done")
    finally:
        runtime.stop(graceful=False)
    assert len(fake_provider.requests) == 2


def test_an_answer_that_never_comes_ends_the_wait_by_the_request_timeout(
    env, fake_provider, tmp_path, monkeypatch
):
    """What the first Ctrl-C promises ("up to" the request timeout) holds when the provider
    never answers: the request's own deadline ends it, its item goes back to the queue with the
    attempt recorded, and nothing is sent after it. A drain shorter than that reports it did
    not come to an end (the CLI then abandons what is left)."""
    monkeypatch.setenv("HERMES_BULK_REQUEST_TIMEOUT_SECONDS", "1")
    jobs = Jobs(load_settings())
    folder, _ = _items(tmp_path, 2)
    job = jobs.create(
        JobRequest(instruction="Summarize", over=str(folder), concurrency=1)
    ).job.job_id
    fake_provider.hold(let_through=1)
    jobs.run(job)
    runtime = _runtime(jobs, threads=1)
    try:
        fake_provider.wait_held(1)
        assert runtime.stop_starting() == 1
        assert not runtime.drain(0.1)
        assert runtime.drain(10), "the request's deadline did not end it"
    finally:
        fake_provider.release()
        runtime.stop(graceful=False)
        broker.close_all()
    st = jobs.status(job, events=10)
    assert (st.job.completed, st.job.pending, st.job.running) == (1, 1, 0)
    assert [e.kind for e in st.events].count("attempt_failed") == 1
    assert len(fake_provider.requests) == 2
