"""Fixtures: tests own their infrastructure.

- `redis_server`: a real redis-server on a free port in a temp dir (AOF on), with kill and
  restart, shared by the session; each test gets its own key prefix via `redis_url`.
- `fake_provider`: the loopback OpenAI-compatible server (hermes_bulk.testing.fake_provider).
- `env` / `settings`: HERMES_BULK_* pointing at a temp data dir and the fake provider.
- `cli`: runs `hermes-bulk` in a subprocess with that environment.
In CI (CI set) a skip is a failure: redis-server, hermes-agent and network namespaces are all
present on a CI machine, so a skip there means a test silently did not run. A non-strict xfail
is refused in CI for the same reason (an xpass of it would pass unnoticed).
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_bulk.config.settings import Settings, load_settings
from hermes_bulk.credentials import COST_ENV
from hermes_bulk.fleet import broker
from hermes_bulk.jobs.service import Jobs
from hermes_bulk.store.redis.scripts import CHECK_KEYS_ENV
from hermes_bulk.testing.fake_provider import FakeProvider
from hermes_bulk.testing.sentinels import Server

from .helpers import environment, job_status, run_in_process, wait_for

ROOT = Path(__file__).resolve().parent.parent
IN_CI = bool(os.environ.get("CI"))
# Every Redis script of the suite refuses a key it was not passed in KEYS (scripts.py), in this
# process and in the workers it starts.
os.environ[CHECK_KEYS_ENV] = "1"
# Stores the suite makes fingerprint credentials with scrypt's N = 2**10 (credentials.py):
# ~1 ms a store, not ~0.1 s; the cost a store uses is recorded with its salt.
os.environ[COST_ENV] = "10"


def _ci_refusal(report) -> str | None:
    """Why a skipped or xfail report must count as a failure in CI, or None."""
    if not IN_CI:
        return None
    if hasattr(report, "wasxfail"):
        return (
            None
            if getattr(report, "_strict_xfail", False)
            else f"non-strict xfail under CI=1: {report.wasxfail}"
        )
    if report.skipped:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        return f"skipped under CI=1 (a skip is a failure in CI): {reason}"
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    marker = item.get_closest_marker("xfail")
    report._strict_xfail = bool(
        marker and marker.kwargs.get("strict", item.config.getini("xfail_strict"))
    )
    refusal = _ci_refusal(report)
    if refusal:
        report.outcome, report.longrepr = "failed", refusal


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A module that skips itself at import (pytest.importorskip) fails too in CI."""
    outcome = yield
    report = outcome.get_result()
    refusal = _ci_refusal(report)
    if refusal:
        report.outcome, report.longrepr = "failed", refusal


def pytest_collection_modifyitems(config, items):
    """Tests marked slow start first: on parallel workers the run then ends on short tests, not
    with three workers idle while one finishes a fault round (a stable sort: order is kept
    otherwise, and every xdist worker collects the same order)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


class RedisServer(Server):
    """A redis-server the tests own: kill it, restart it, point clients at it. The one the
    benchmarks and the Sentinel tests start (hermes_bulk.testing.sentinels.Server), with a
    password and the arguments of its next start."""

    def __init__(self, workdir: Path, password: str | None = None) -> None:
        super().__init__(workdir)
        self.password = password
        self.extra_args: list[str] = []  # for the next start(), e.g. ["--key-load-delay", "1000"]

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        if shutil.which("redis-server") is None:
            if IN_CI:
                raise RuntimeError("redis-server is not installed; .ci/run installs it")
            pytest.skip("redis-server is not installed")
        self.args = ["--requirepass", self.password] if self.password else []
        self.args += self.extra_args
        super().start()
        return self


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.kill()


@pytest.fixture
def own_redis(tmp_path) -> Iterator[RedisServer]:
    """A redis-server of this test alone: to stop, restart, or count its commands."""
    (tmp_path / "own-redis").mkdir()
    server = RedisServer(tmp_path / "own-redis").start()
    yield server
    server.kill()


@pytest.fixture
def redis_url(redis_server) -> str:
    """The session server, with a key prefix of this test's own (nothing is flushed)."""
    return f"{redis_server.url}?prefix=t{uuid.uuid4().hex[:8]}"


@pytest.fixture
def fake_provider() -> Iterator[FakeProvider]:
    server = FakeProvider().start()
    yield server
    server.stop()


@pytest.fixture
def home(tmp_path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def env(home, fake_provider, monkeypatch) -> dict[str, str]:
    """The environment a user would set, applied to this process and handed to subprocesses."""
    values = {
        "HERMES_BULK_HOME": str(home),
        "HERMES_BULK_BASE_URL": fake_provider.base_url,
        "HERMES_BULK_MODEL": "fake-model",
        "HERMES_BULK_API_KEY": "sk-test-not-a-secret",
        CHECK_KEYS_ENV: "1",
        COST_ENV: "10",
    }
    for key in list(os.environ):
        if key.startswith(("HERMES_BULK_", "OPENAI_", "ANTHROPIC_")) or key == "HERMES_HOME":
            monkeypatch.delenv(key, raising=False)
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    # HOME too: nothing may find (or write) the real ~/.hermes of whoever runs the tests.
    user_home = home.parent / "user-home"
    user_home.mkdir(exist_ok=True)
    monkeypatch.setenv("HOME", str(user_home))
    values["HOME"] = str(user_home)
    return values


@pytest.fixture
def settings(env) -> Iterator[Settings]:
    yield load_settings()
    broker.close_all()


class Cli:
    def __init__(self, env: dict[str, str], logs_dir: Path) -> None:
        self.env, self.logs_dir = env, logs_dir
        self._workers = 0
        self.spawned: list[subprocess.Popen] = []

    def full_env(self, **extra: str) -> dict[str, str]:
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("HERMES_BULK_", "OPENAI_")) and k != "HERMES_HOME"
        }
        return {**base, **self.env, **extra}

    #: Commands run in this process (tests/helpers.run_in_process): the same cli.main, without
    #: a process start each (about 1,000 of them in the suite, half a second of CPU each);
    #: tests/test_harness.py holds each one's output and exit status equal to its process's.
    IN_PROCESS = frozenset({"create", "run", "status", "list", "show", "pause", "export"})

    def __call__(
        self,
        *args: str,
        check: bool = True,
        timeout: float | None = None,
        process: bool = False,
        **extra_env: str,
    ):
        """`hermes-bulk ARGS`; `create` and `run` (not `--wait`, which serves the job) in this
        process unless `process` is true or a `timeout` is given: a test about the process itself
        (its exit on a signal, a hang) asks for one."""
        if (
            args
            and args[0] in self.IN_PROCESS
            and "--wait" not in args
            and not process
            and timeout is None
        ):
            proc = run_in_process(list(args), self.full_env(**extra_env))
        else:
            # No terminal on stdin, as in CI: run from one, `delete` would wait for an answer.
            proc = subprocess.run(
                [sys.executable, "-m", "hermes_bulk", *args],
                capture_output=True,
                text=True,
                env=self.full_env(**extra_env),
                timeout=timeout or 120,
                stdin=subprocess.DEVNULL,
            )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"hermes-bulk {' '.join(args)} exited "
                f"{proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def json(self, *args: str, **extra_env: str):
        return json.loads(self(*args, **extra_env).stdout)

    def status(self, job_id: str, **extra_env: str) -> dict:
        """What `hermes-bulk status JOB --json` prints, read in this process: a poll that is not
        itself the command under test need not start a Python interpreter each time."""
        with environment(self.full_env(**extra_env)):
            return job_status(Jobs(load_settings()), job_id)

    def create(self, instruction: str, over: str | Path, *flags: str) -> str:
        return self.json("create", instruction, "--over", str(over), *flags, "--json")["job_id"]

    def spawn_worker(self, *flags: str, **extra_env: str) -> subprocess.Popen:
        """A `hermes-bulk worker` subprocess; its log is in logs_dir (worker-N.log)."""
        self._workers += 1
        log = self.logs_dir / f"worker-{self._workers}.log"
        worker = subprocess.Popen(
            [sys.executable, "-m", "hermes_bulk", "worker", "-l", str(log), *flags],
            env=self.full_env(**extra_env),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.spawned.append(worker)
        return worker

    def run_batch_job(self, job_id: str, **extra_env: str) -> None:
        """Run a --batch job to its end: `run`, then a worker of two threads until the job has
        completed (its batches are submitted, polled and ingested by a worker)."""
        self("run", job_id, **extra_env)
        worker = self.spawn_worker("-w", "2", **extra_env)
        try:
            wait_for(
                lambda: self.status(job_id, **extra_env)["state"] == "completed",
                timeout=60,
                interval=0.2,
                message="the batch job to complete",
            )
        finally:
            worker.terminate()
            worker.wait(30)

    def kill_spawned(self) -> None:
        """Workers a test left running (it failed before stopping them): a worker retries a
        vanished backend forever, and one such outlived its test by 35 minutes of a CI run."""
        for worker in self.spawned:
            if worker.poll() is None:
                worker.kill()
                worker.wait(10)


@pytest.fixture(params=["sqlite", "redis"])
def backend_cli(request, cli):
    """The CLI on each backend: the embedded SQLite default, then a Redis of its own."""
    if request.param == "redis":
        cli.env["HERMES_BULK_BACKEND"] = request.getfixturevalue("redis_url")
    return cli


@pytest.fixture
def cli(env, tmp_path) -> Iterator[Cli]:
    logs = tmp_path / "worker-logs"
    logs.mkdir()
    runner = Cli(env, logs)
    yield runner
    runner.kill_spawned()
    broker.close_all()  # backends Cli.status opened in this process


@pytest.fixture(autouse=True)
def _first_answers_of_a_fresh_process(monkeypatch):
    """Each test runs its in-process workers as a fresh process would: their first request to a
    key goes alone (pacing.FIRST_ANSWERS), whatever tests before it in this process sent."""
    from hermes_bulk.providers import pacing

    monkeypatch.setattr(pacing, "FIRST_ANSWERS", pacing.FirstAnswers())


@pytest.fixture(autouse=True)
def _no_secret_registered(monkeypatch):
    """Each test starts with no secret registered for masking by value: in-process CLI runs and
    Hypothesis-drawn settings register keys ("limit", "1234") that would mask words in a later
    test's text, as one did in CI."""
    from hermes_bulk import redact

    monkeypatch.setattr(redact, "_values", frozenset())
    monkeypatch.setattr(redact, "_by_value", None)


@pytest.fixture(autouse=True)
def _collect_after_each_test():
    """HERMES_BULK_TEST_GC=1: collect garbage at the end of every test, so an object it left
    unclosed (a socket, a file) warns in that test rather than in whichever test the collector
    happens to run in later: how a leak seen once in CI is found. What was alive before the
    test is frozen first (gc.freeze), so the collection looks only at what the test made: a
    full collection of a worker's heap after each of 2,000 tests cost minutes of CI."""
    collect = os.environ.get("HERMES_BULK_TEST_GC") == "1"
    if collect:
        gc.freeze()
    yield
    if collect:
        gc.collect()
