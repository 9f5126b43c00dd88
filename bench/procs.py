"""The processes a benchmark owns: the loopback provider, redis-server, hermes-bulk commands.

Every measured side runs in a process of its own, so no two of them share a GIL: the fake
provider, the bare-pool baseline (`bench.drive pool`), hermes-bulk (`bench.drive run` for the
embedded consumer, `hermes-bulk worker` for fleets) and redis-server.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 15.0, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port} after {timeout} s")


def base_env() -> dict[str, str]:
    """This environment without any hermes-bulk or OpenAI settings (each run sets its own)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HERMES_BULK_", "OPENAI_")) and k != "HERMES_HOME"
    }
    # bench/ is not installed: child processes find it from the repository root.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


class FakeProviderProc:
    """hermes_bulk.testing.fake_provider in its own process; control and stats over HTTP."""

    def __init__(
        self, *, latency_s: float = 0.0, rate_per_s: float | None = None, host: str = "127.0.0.1"
    ) -> None:
        self.port, self.host = free_port(), host
        args = [
            PY,
            "-m",
            "hermes_bulk.testing.fake_provider",
            "--port",
            str(self.port),
            "--latency",
            str(latency_s),
            "--host",
            host,
        ]
        if rate_per_s:
            args += ["--rate", str(rate_per_s)]
        self.proc = subprocess.Popen(
            args, env=base_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_port(self.port, host=host)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def _call(self, method: str, path: str, payload: dict | None = None):
        data = json.dumps(payload).encode() if payload is not None else None
        req = urllib.request.Request(
            f"http://{self.host}:{self.port}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())

    def configure(self, **changes) -> None:
        """Settings as FakeConfig names them (latency_s, rate_per_s, …); always clears the
        records."""
        self._call("POST", "/_control", {"reset_records": True, **changes})

    def stats(self) -> dict:
        return self._call("GET", "/_stats")

    def cpu_seconds(self) -> float:
        return proc_cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        stop_process(self.proc)


class RedisProc:
    """A redis-server of our own on a free port in a temp dir (persistence off: it is a bench)."""

    def __init__(self, workdir: Path) -> None:
        exe = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not Path(exe).exists():
            raise RuntimeError("redis-server is not installed")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(workdir),
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--logfile",
                str(workdir / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_port(self.port)
        self.version = subprocess.run(
            [exe, "--version"], capture_output=True, text=True
        ).stdout.split()[2]

    def url(self, prefix: str) -> str:
        return f"redis://127.0.0.1:{self.port}/0?prefix={prefix}"

    def stop(self) -> None:
        stop_process(self.proc)


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU of a live process (from /proc), 0.0 when it cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


@dataclass
class Measured:
    """A finished child process: its exit code, output, wall time and peak RSS."""

    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    max_rss_mb: float
    cpu_s: float


def run_measured(args: list[str], env: dict[str, str], timeout: float = 3600) -> Measured:
    """Run a child to the end; peak RSS and CPU come from wait4's rusage of that child alone."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=err, text=True)
        deadline = started + timeout
        while True:
            pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                raise RuntimeError(f"{' '.join(args[:4])}… did not finish within {timeout} s")
            time.sleep(0.01)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return Measured(
            proc.returncode,
            out.read(),
            err.read(),
            wall,
            rusage.ru_maxrss / 1024,
            rusage.ru_utime + rusage.ru_stime,
        )


_FIXED = {
    "HERMES_BULK_HOME",
    "HERMES_BULK_BASE_URL",
    "HERMES_BULK_MODEL",
    "HERMES_BULK_API_KEY",
    "HERMES_BULK_BACKEND",
}


class HermesEnv:
    """The environment of one hermes-bulk deployment: a data dir, a backend, a provider."""

    def __init__(
        self, home: Path, *, backend: str | None, base_url: str, **settings: str | int | float
    ) -> None:
        self.home, self.backend, self.base_url = home, backend, base_url
        self.vars = {
            "HERMES_BULK_HOME": str(home),
            "HERMES_BULK_BASE_URL": base_url,
            "HERMES_BULK_MODEL": "fake-model",
            "HERMES_BULK_API_KEY": "sk-bench-not-a-secret",
        }
        if backend:
            self.vars["HERMES_BULK_BACKEND"] = backend
        for key, value in settings.items():
            self.vars[f"HERMES_BULK_{key.upper()}"] = str(value)

    def settings(self):
        """The same settings in this process (to watch the store; bench rows do no work here)."""
        from hermes_bulk.config.settings import load_settings

        return load_settings(
            home=self.home,
            backend=self.backend or "",
            base_url=self.base_url,
            model="fake-model",
            **{
                k[len("HERMES_BULK_") :].lower(): v for k, v in self.vars.items() if k not in _FIXED
            },
        )

    def env(self, **extra: str) -> dict[str, str]:
        return {**base_env(), **self.vars, **extra}

    def cli(self, *args: str, timeout: float = 3600, **extra: str) -> Measured:
        """`hermes-bulk ARGS` in a child process; raises when it fails."""
        m = run_measured([PY, "-m", "hermes_bulk", *args], self.env(**extra), timeout=timeout)
        if m.returncode != 0:
            raise RuntimeError(
                f"hermes-bulk {' '.join(args)} exited {m.returncode}: {m.stderr.strip()[-2000:]}"
            )
        return m

    def create(self, over: Path, *flags: str) -> str:
        m = self.cli(
            "create", "Summarize this item in one line", "--over", str(over), *flags, "--json"
        )
        return json.loads(m.stdout)["job_id"]

    def run_job(self, over: Path, threads: int) -> dict:
        """A job over `over` at --concurrency `threads`, run by `bench.drive run` with as many
        threads (the embedded consumer): its JSON answer."""
        job = self.create(over, "--concurrency", str(threads))
        return self.drive("run", job, "--threads", str(threads))

    def spawn_worker(self, threads: int, logfile: Path, **extra: str) -> subprocess.Popen:
        return subprocess.Popen(
            [PY, "-m", "hermes_bulk", "worker", "-w", str(threads), "-q", "-l", str(logfile)],
            env=self.env(**extra),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def drive_pool(self, base_url: str, source: Path, threads: int, client: str = "hermes") -> dict:
        """The bare thread pool (bench.drive pool) making the calls a job's items would."""
        return self.drive(
            "pool",
            "--base-url",
            base_url,
            "--source",
            str(source),
            "--threads",
            str(threads),
            "--client",
            client,
        )

    def drive(self, *args: str, timeout: float = 3600) -> dict:
        """`python -m bench.drive ARGS` in this environment; its JSON answer."""
        m = run_measured([PY, "-m", "bench.drive", *args], self.env(), timeout=timeout)
        if m.returncode != 0:
            raise RuntimeError(
                f"bench.drive {' '.join(args)} exited {m.returncode}: {m.stderr.strip()[-3000:]}"
            )
        return json.loads(m.stdout.strip().splitlines()[-1])
