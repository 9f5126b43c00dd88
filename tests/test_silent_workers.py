"""A worker that stops answering stops counting within three heartbeats, not a whole lease.

A worker killed on another host leaves no lock file here to find free; only its heartbeats stop.
A frozen worker (SIGSTOP) is the same from here: its lock is still held, so only the heartbeat
rule can tell. With a 30 s lease (heartbeats every 5 s), `status` stops saying "processing" and
counts no live worker while the worker is still registered (`workers` says "not answering"),
well before its registry entry or its items' leases run out.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from .helpers import wait_for


@pytest.fixture(params=["sqlite", "redis"])
def backend_env(request) -> dict[str, str]:
    env = {"HERMES_BULK_LEASE_SECONDS": "30"}
    if request.param == "redis":
        env["HERMES_BULK_BACKEND"] = request.getfixturevalue("redis_url")
    return env


def test_a_frozen_worker_is_not_counted_after_three_heartbeats(
    cli, fake_provider, tmp_path, backend_env
):
    src = tmp_path / "items.jsonl"
    src.write_text("".join(f'"item {i}"\n' for i in range(4)))
    job = cli.json("create", "Do", "--over", str(src), "--json", **backend_env)["job_id"]
    fake_provider.configure(latency_s=120)
    worker = cli.spawn_worker("-w", "2", **backend_env)
    try:
        cli("run", job, "--no-check", **backend_env)
        wait_for(lambda: fake_provider.requests, timeout=60, message="an item reaches the provider")
        assert cli.status(job, **backend_env)["state"] == "processing"
        os.kill(worker.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        st = wait_for(
            lambda: (s := cli.status(job, **backend_env))["state"] != "processing" and s,
            timeout=60,
            interval=0.5,
            message="status to stop saying processing",
        )
        took = time.monotonic() - frozen_at
        assert st["live_workers"] == st["live_workers_total"] == 0 and st["state"] in (
            "awaiting_recovery",
            "waiting_for_worker",
        ), st
        assert "not answering" in cli("workers", **backend_env).stdout, (
            "still registered: its lease has not run out"
        )
        assert took < 30, f"{took:.0f} s: the lease, not the heartbeats, told"
    finally:
        os.kill(worker.pid, signal.SIGCONT)
        worker.kill()
        worker.wait(10)
        fake_provider.configure(latency_s=0)
