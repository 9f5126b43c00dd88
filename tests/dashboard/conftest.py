"""What the dashboard tests share: a real `hermes-bulk dashboard` process and a job to show.

`dashboard(**env)` starts the command on a free port (`--port 0`), reads the URL it prints and
stops it (SIGINT, as Ctrl-C) after the test. `job_with_a_failure` makes a job over a folder
whose one item fails for good and whose name and content hold `<script>` (untrusted data).
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from hermes_bulk.config.settings import load_settings
from hermes_bulk.fleet import broker
from hermes_bulk.jobs.service import Jobs

TOKEN = "a-dashboard-token-for-tests-0123456789"
#: An item whose path and content would run a script if a page built HTML from them.
HOSTILE_DIR = "<script>window.__pwned=1<"
HOSTILE_FILE = "script>.txt"
HOSTILE_NAME = f"{HOSTILE_DIR}/{HOSTILE_FILE}"
HOSTILE_CONTENT = (
    'PERMANENT-400 <script>window.__pwned=2</script><img src=x onerror="window.__pwned=3">'
)


@dataclass
class Dashboard:
    proc: subprocess.Popen
    url: str  # http://127.0.0.1:PORT/?token=…
    base: str  # http://127.0.0.1:PORT
    token: str
    lines: list[str]

    def client(self, *, token: bool = True) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token}"} if token else {}
        return httpx.Client(base_url=self.base, headers=headers, timeout=10)

    def stop(self, sig: int = signal.SIGINT) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout and not self.proc.stdout.closed:
            self.lines += self.proc.stdout.read().splitlines()
            self.proc.stdout.close()


def start_dashboard(cli, *args: str, **env: str) -> Dashboard:
    proc = subprocess.Popen(
        [sys.executable, "-m", "hermes_bulk", "dashboard", "--port", "0", *args],
        env=cli.full_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    lines: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        m = re.match(r"Open: (http://[^/]+)/\?token=(\S+)$", lines[-1])
        if m:
            return Dashboard(proc, f"{m[1]}/?token={m[2]}", m[1], m[2], lines)
    proc.kill()
    proc.wait()
    raise AssertionError("the dashboard printed no URL:\n" + "\n".join(lines))


@pytest.fixture
def dashboard(cli) -> Iterator:
    started: list[Dashboard] = []

    def start(*args: str, **env: str) -> Dashboard:
        d = start_dashboard(cli, *args, **env)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


@pytest.fixture(params=["sqlite", "redis"])
def backend_env(request, cli) -> str:
    """Both backends: the CLI's environment points at a test Redis for the redis case."""
    if request.param == "redis":
        cli.env["HERMES_BULK_BACKEND"] = request.getfixturevalue("redis_url")
    return request.param


def make_folder(root: Path, n: int) -> Path:
    """n plain items and the hostile one (which the provider refuses: it fails, with its error)."""
    (root / HOSTILE_DIR).mkdir(parents=True)
    (root / HOSTILE_NAME).write_text(HOSTILE_CONTENT)
    for i in range(n):
        (root / f"item-{i:03d}.txt").write_text(f"item number {i}\n")
    return root


@pytest.fixture
def job_with_a_failure(cli, fake_provider, tmp_path) -> str:
    """A finished job: 6 items completed and the hostile one failed (HTTP 400, no retries)."""
    fake_provider.configure(item_faults={"PERMANENT-400": "400"})
    job_id = cli.create(
        "Summarize <b>this</b>", make_folder(tmp_path / "items", 6), "--retries", "0"
    )
    cli("run", job_id, "--wait", check=False)
    return job_id


@pytest.fixture
def jobs(cli, env, backend_env) -> Iterator[Jobs]:
    """The jobs API on the backend the CLI processes use, to check what reached the store."""
    yield Jobs(load_settings(backend=cli.env.get("HERMES_BULK_BACKEND")))
    broker.close_all()
