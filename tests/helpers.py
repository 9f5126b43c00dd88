"""Small helpers shared by tests."""

from __future__ import annotations

import os
import signal
import time


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.05, message: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")


def kill_worker_holding_an_item(cli, fake_provider, **extra_env: str) -> None:
    """Start a worker, let it send an item to a provider that holds it, then SIGKILL the worker:
    the item stays claimed by a dead worker (a crash mid-call). The provider answers at once after."""
    fake_provider.configure(latency_s=60)
    worker = cli.spawn_worker(HERMES_BULK_LEASE_SECONDS="60", **extra_env)
    try:
        wait_for(lambda: fake_provider.requests, timeout=60, message="an item reaches the provider")
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
    fake_provider.configure(latency_s=0)
