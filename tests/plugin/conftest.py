"""Fixtures for the plugin tests: real hermes-agent 0.19.0 from this venv, driven from outside.

- `hermes_provider`: one loopback OpenAI-compatible server for the session; each test gets it
  with its faults and records reset.
- `hermes_home`: a temporary HERMES_HOME whose model is that server (`hermes config set …`)
  and with the plugin enabled (`hermes plugins enable bulk`). Made once per session with the
  real `hermes` command, then copied for each test.
- `gateway()`: starts `python -m tui_gateway.entry` (Hermes' TUI gateway, JSON-RPC on stdio)
  and sends `command.dispatch` requests to it, as the TUI does for a slash command; the
  process lives until the test ends (or is killed), so background work can be watched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_bulk.testing.fake_provider import FakeConfig, FakeProvider

from ..conftest import IN_CI
from ..helpers import wait_for

BIN = Path(sys.executable).parent
HERMES = BIN / "hermes"
MODEL_CONFIG = {
    "model.provider": "custom",
    "model.default": "fake-model",
    "model.api_key": "sk-local-fake",
}


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a Hermes process: this one's, minus anything that could pick a model,
    a backend or a data directory, with HERMES_HOME set."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HERMES_", "OPENAI_", "PYTEST_")) and not k.endswith("_API_KEY")
    }
    env.update(HERMES_HOME=str(home), **extra)
    return env


def hermes(home: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(HERMES), *args],
        env=clean_env(home),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"hermes {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def config_set(home: Path, key: str, value: str) -> None:
    hermes(home, "config", "set", key, value, "--force")


@pytest.fixture(scope="session", autouse=True)
def _hermes_installed() -> None:
    if not HERMES.exists():
        if IN_CI:
            raise RuntimeError(
                "hermes-agent is not installed; scripts/test installs hermes-agent==0.19.0"
            )
        pytest.skip("hermes-agent is not installed in this venv")


@pytest.fixture(scope="session")
def _session_provider() -> Iterator[FakeProvider]:
    server = FakeProvider().start()
    yield server
    server.stop()


@pytest.fixture
def hermes_provider(_session_provider) -> FakeProvider:
    # Every setting back to its default: one a test set (usage, fail_once, …) must not reach
    # the next test this session's provider serves.
    _session_provider.configure(**dataclasses.asdict(FakeConfig()))
    _session_provider.reset_records()
    _session_provider.release()  # a test that failed with the gate closed leaves it open
    return _session_provider


@pytest.fixture(scope="session")
def _template_home(tmp_path_factory, _session_provider) -> Path:
    home = tmp_path_factory.mktemp("hermes-template") / "home"
    home.mkdir()
    config_set(home, "model.base_url", _session_provider.base_url)
    for key, value in MODEL_CONFIG.items():
        config_set(home, key, value)
    hermes(home, "plugins", "enable", "bulk", "--no-allow-tool-override")
    return home


@pytest.fixture
def hermes_home(tmp_path, _template_home, hermes_provider) -> Path:
    home = tmp_path / "hermes-home"
    shutil.copytree(_template_home, home)
    return home


class Gateway:
    """One `python -m tui_gateway.entry` process: a long-lived Hermes handling slash commands."""

    def __init__(
        self, home: Path, cwd: Path, env: dict[str, str], log: Path, argv: list[str] | None = None
    ) -> None:
        self.home, self.log = home, log
        self._ids = 0
        self._lines: queue.Queue[str] = queue.Queue()
        self._stderr = open(log, "w")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            [sys.executable, *(argv or ["-m", "tui_gateway.entry"])],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            bufsize=1,
        )
        threading.Thread(target=self._read, daemon=True).start()
        ready = self._next(lambda m: m.get("params", {}).get("type") == "gateway.ready", timeout=60)
        assert ready, "the gateway did not start"

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line)

    def _next(self, match, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(
                    f"no answer from the gateway in {timeout}s; its stderr: "
                    f"{self.log.read_text()[-2000:]}"
                )
            try:
                line = self._lines.get(timeout=remaining)
            except queue.Empty:
                continue
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if match(message):
                return message

    def slash(self, name: str, arg: str = "", timeout: float = 60) -> str:
        """Send `/name arg` as command.dispatch; returns the command's output."""
        self._ids += 1
        rid = self._ids
        request = {
            "jsonrpc": "2.0",
            "id": rid,
            "method": "command.dispatch",
            "params": {"name": name, "arg": arg},
        }
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        response = self._next(lambda m: m.get("id") == rid, timeout)
        assert "result" in response, response
        return response["result"]["output"]

    def bulk(self, arg: str = "", timeout: float = 60) -> str:
        return self.slash("bulk", arg, timeout)

    def close(self) -> None:
        """Stdin closed: the gateway exits, as when the TUI quits."""
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._release()

    def kill(self) -> None:
        """SIGKILL: Hermes dies mid-job, nothing of it gets to clean up."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._release()

    def _release(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout, self._stderr):
            with contextlib.suppress(
                OSError, ValueError
            ):  # a pipe already closed, or broken by the kill
                stream.close()


@pytest.fixture(params=["sqlite", "redis"])
def bulk_backend(request, hermes_home) -> str | None:
    """Bulk's store in Hermes, each in turn: the embedded SQLite default (None), then a Redis of
    its own (its URL, set in the plugin's settings)."""
    if request.param == "sqlite":
        return None
    url = request.getfixturevalue("redis_url")
    config_set(hermes_home, "plugins.entries.bulk.settings.backend", url)
    return url


@pytest.fixture
def gateway(hermes_home, tmp_path):
    """gateway(cwd=, argv=, **env) starts a Hermes TUI gateway on hermes_home; all stop at the
    end."""
    started: list[Gateway] = []

    def start(cwd: Path | None = None, argv: list[str] | None = None, **extra_env: str) -> Gateway:
        log = tmp_path / f"gateway-{len(started) + 1}.stderr"
        gw = Gateway(hermes_home, cwd or tmp_path, clean_env(hermes_home, **extra_env), log, argv)
        started.append(gw)
        return gw

    yield start
    for gw in started:
        gw.kill()


def job_id_of(created: str) -> str:
    """The id in "Created job <id> with N items."."""
    first = created.splitlines()[0]
    assert first.startswith("Created job "), created
    return first.split()[2]


def run_until_completed(gw: Gateway, job: str, what: str = "the job") -> None:
    """`/bulk run JOB` in this gateway, then its status read until the job has completed."""
    gw.bulk(f"run {job}")
    wait_for(
        lambda: "State: completed" in gw.bulk(f"status {job}"),
        timeout=90,
        interval=0.3,
        message=f"{what} completes",
    )
