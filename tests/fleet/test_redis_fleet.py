"""The Redis backend through the real CLI and worker processes, on this host."""

from __future__ import annotations

import json
import re
import signal
import urllib.request
from pathlib import Path

import redis as redis_py
import yaml

from hermes_bulk.testing.fake_provider import expected_answer
from hermes_bulk.testing.sentinels import free_port

from ..conftest import RedisServer
from ..helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]


def test_a_job_created_here_is_processed_by_two_worker_processes_and_deleted_without_a_trace(
    cli, redis_url, redis_server, tmp_path, fake_provider
):
    src = tmp_path / "items.jsonl"
    src.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(200)))
    env = {"HERMES_BULK_BACKEND": redis_url}
    job_id = cli.json(
        "create", "Process", "--over", str(src), "--concurrency", "8", "--json", **env
    )["job_id"]
    cli("run", job_id, **env)
    port = free_port()
    # Both workers hold requests before any answer but the first comes back, so each does part
    # of the job whatever the machine's load (a process's first request goes alone).
    fake_provider.hold(let_through=1)
    workers = [cli.spawn_worker("-w", "4", "--metrics-port", str(port), **env)]
    try:
        fake_provider.wait_held(4)
        workers.append(cli.spawn_worker("-w", "4", **env))
        fake_provider.wait_held(5)
        fake_provider.release()
        wait_for(
            lambda: cli.status(job_id, **env)["state"] == "completed",
            timeout=120,
            message="completion",
        )
        page = wait_for(lambda: _metrics(port), message="the first worker's metrics")
    finally:
        fake_provider.release()
        for w in workers:
            w.send_signal(signal.SIGINT)
            w.wait(30)
    done = int(re.search(r"hermes_bulk_items_completed_total\{[^}]*\} (\d+)", page).group(1))
    assert 0 < done < 200, "the first worker did part of the job, the second the rest"
    assert "# TYPE hermes_bulk_queue_depth gauge" in page
    out = Path(cli("export", job_id, "--format", "jsonl", **env).stdout.strip())
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["result"] for r in rows] == [
        expected_answer(json.dumps({"n": i})) for i in range(200)
    ]
    assert "Deleted job" in cli("delete", job_id, **env).stdout
    prefix = redis_url.split("prefix=")[1]
    r = redis_py.Redis.from_url(redis_server.url)
    left = [
        k
        for k in r.scan_iter(match=f"*{prefix}*")
        if b"limit:" not in k
        and b"workers" not in k
        and k not in {f"{prefix}:layout".encode(), f"{prefix}:fingerprint_salt".encode()}
    ]  # no job's
    assert left == [], left
    r.close()


def _metrics(port: int) -> str | None:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:  # its server not up yet
        return None


def test_an_unreachable_redis_is_one_line_and_exit_status_3(cli, tmp_path):
    proc = cli("list", check=False, HERMES_BULK_BACKEND=f"redis://:pw@127.0.0.1:{free_port()}/0")
    assert proc.returncode == 3
    (line,) = proc.stderr.strip().splitlines()
    assert "Cannot reach Redis at 127.0.0.1" in line and "pw" not in line


def test_a_worker_warns_when_redis_would_lose_jobs_on_restart(cli, tmp_path):
    volatile = RedisServer(tmp_path / "volatile")
    (tmp_path / "volatile").mkdir()
    volatile.start()
    try:
        volatile_url = volatile.url
        r = redis_py.Redis.from_url(volatile_url)
        r.config_set("appendonly", "no")
        r.close()
        worker = cli.spawn_worker("--burst", HERMES_BULK_BACKEND=volatile_url)
        assert worker.wait(60) == 0
        log = next(cli.logs_dir.glob("worker-*.log")).read_text()
        assert "does not persist with an append-only file" in log
    finally:
        volatile.kill()


def test_the_compose_stack_declares_what_the_fleet_needs():
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    services = compose["services"]
    assert {"redis", "worker", "cli"} <= set(services)
    redis_cmd = services["redis"]["command"]
    assert redis_cmd[redis_cmd.index("--appendonly") + 1] == "yes" and "--requirepass" in redis_cmd
    assert "healthcheck" in services["redis"]
    assert services["worker"]["command"][:2] == ["hermes-bulk", "worker"]
    assert services["worker"]["depends_on"]["redis"]["condition"] == "service_healthy"
    assert "replicas" not in json.dumps(services["worker"]), "scaled with --scale, not pinned"
    assert services["cli"]["entrypoint"] == ["hermes-bulk"]
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    user = re.search(r"^USER (\S+)", dockerfile, re.M)
    assert user and user.group(1) not in ("root", "0"), "the image runs as an unprivileged user"
    assert re.search(r"^STOPSIGNAL SIGINT", dockerfile, re.M)
