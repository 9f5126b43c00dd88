"""Small helpers shared by tests."""

from __future__ import annotations

import time


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.05, message: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")
