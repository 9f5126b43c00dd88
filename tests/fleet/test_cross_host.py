"""The fleet across hosts, without Docker: five network namespaces run what compose.yaml declares.

Redis on one host, a worker on each of two others, the CLI on a fourth, the dashboard on a fifth,
each with its own data directory (so nothing is shared but Redis), the provider on the bridge. The
commands and the environment come from docker/compose.yaml itself, so the stack and this test cannot
drift. A worker is killed with -9 and Redis is restarted mid-job; every item must complete exactly
once. Skipped, with the reason, where network namespaces are not permitted (CI runs as root)."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from hermes_bulk.testing.fake_provider import FakeProvider, expected_answer

from ..helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "compose.yaml"
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow

_VAR = re.compile(r"\$\$|\$\{(\w+)(?:(:?[-?])([^}]*))?\}")


def interpolate(value, env: dict[str, str]):
    """Compose's variable syntax: ${VAR}, ${VAR:-default}, ${VAR:?error}, $$."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m.group(1), m.group(2), m.group(3)
        got = env.get(name, "")
        if op and op.endswith("?") and not got:
            raise AssertionError(f"compose.yaml needs {name}: {arg}")
        return got if got or not op else arg

    return _VAR.sub(one, value)


def load_compose(env: dict[str, str]) -> dict:
    return interpolate(yaml.safe_load(COMPOSE.read_text()), env)


def executable(name: str) -> str:
    """A compose command's program, from this test's environment (the image installs the same)."""
    path = BIN / name
    return str(path) if path.exists() else shutil.which(name) or name


class Hosts:
    """A bridge on the test's own namespace and one network namespace per host."""

    SUBNET = "10.77.{}.{}"

    def __init__(self, names: list[str]) -> None:
        self.tag = secrets.token_hex(2)
        self.third = 100 + int(self.tag, 16) % 100
        self.bridge = f"hbbr{self.tag}"
        self.gateway = self.SUBNET.format(self.third, 1)
        self.ips = {name: self.SUBNET.format(self.third, i + 2) for i, name in enumerate(names)}
        self.ns = {name: f"hb{self.tag}-{name}" for name in names}
        self.procs: list[subprocess.Popen] = []

    @staticmethod
    def _ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, text=True)

    def __enter__(self) -> Hosts:
        self._ip("link", "add", self.bridge, "type", "bridge")
        self._ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        self._ip("link", "set", self.bridge, "up")
        hosts_file = (
            "\n".join(
                [
                    "127.0.0.1 localhost",
                    f"{self.gateway} provider",
                    *(f"{ip} {name}" for name, ip in self.ips.items()),
                ]
            )
            + "\n"
        )
        for i, (name, ns) in enumerate(self.ns.items()):
            veth = f"hbv{self.tag}{i}"
            self._ip("netns", "add", ns)
            self._ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self._ip("link", "set", veth, "master", self.bridge)
            self._ip("link", "set", veth, "up")
            self._ip(
                "netns", "exec", ns, "ip", "addr", "add", f"{self.ips[name]}/24", "dev", "eth0"
            )
            self._ip("netns", "exec", ns, "ip", "link", "set", "eth0", "up")
            self._ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
            # `ip netns exec` bind-mounts /etc/netns/<ns>/hosts over /etc/hosts: names resolve per
            # host.
            Path(f"/etc/netns/{ns}").mkdir(parents=True, exist_ok=True)
            Path(f"/etc/netns/{ns}/hosts").write_text(hosts_file)
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for ns in self.ns.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)

    def argv(self, host: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns[host], *argv]

    def spawn(self, host: str, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
        out = open(log, "ab")  # noqa: SIM115 - owned by the process
        proc = subprocess.Popen(
            self.argv(host, argv), env=env, stdout=out, stderr=subprocess.STDOUT
        )
        out.close()
        self.procs.append(proc)
        return proc

    def run(self, host: str, argv: list[str], env: dict[str, str], timeout: float = 120) -> str:
        proc = subprocess.run(
            self.argv(host, argv), env=env, capture_output=True, text=True, timeout=timeout
        )
        assert proc.returncode == 0, (
            f"{argv} on {host}: {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
        return proc.stdout


@pytest.fixture
def hosts():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2 (ip netns)")
    probe = f"hbprobe{secrets.token_hex(2)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"network namespaces are not permitted here: {made.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    with Hosts(["redis", "worker1", "worker2", "cli", "dashboard"]) as h:
        yield h


def wait_port(host: str, port: int, timeout: float = 15) -> None:
    def up():
        try:
            with socket.create_connection((host, port), timeout=0.3):
                return True
        except OSError:
            return False

    wait_for(up, timeout=timeout, message=f"{host}:{port}")


def test_a_fleet_on_four_hosts_loses_nothing_to_a_killed_worker_and_a_redis_restart(
    hosts, tmp_path
):
    provider = FakeProvider(host=hosts.gateway, latency_s=0.05).start()
    # The first 200 requests are answered, then the gate holds the rest: the kill below comes
    # mid-job however fast or slow this machine is.
    provider.hold(let_through=200)
    password, token = secrets.token_hex(12), secrets.token_urlsafe(24)
    compose = load_compose(
        {
            "REDIS_PASSWORD": password,
            "HERMES_BULK_BASE_URL": f"http://provider:{provider.port}/v1",
            "HERMES_BULK_MODEL": "fake-model",
            "HERMES_BULK_LEASE_SECONDS": "3",
            "HERMES_BULK_DASHBOARD_TOKEN": token,
        }
    )
    services = compose["services"]
    base_env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HERMES_BULK_", "OPENAI_", "HERMES_HOME"))
    }

    def env_for(host: str, service: str) -> dict[str, str]:
        data = tmp_path / host / "data"  # each host has its own disk: only Redis is shared
        data.mkdir(parents=True, exist_ok=True)
        env = {**base_env, **services[service]["environment"]}
        env["HERMES_BULK_HOME"] = str(data)
        return env

    # Redis, as compose runs it (its data dir is the container's /data volume).
    redis_dir = tmp_path / "redis" / "data"
    redis_dir.mkdir(parents=True)
    redis_argv = [
        executable(services["redis"]["command"][0]),
        *services["redis"]["command"][1:],
        "--dir",
        str(redis_dir),
        "--logfile",
        str(tmp_path / "redis" / "redis.log"),
    ]
    assert (
        "--appendonly" in redis_argv and redis_argv[redis_argv.index("--appendonly") + 1] == "yes"
    )
    redis_proc = hosts.spawn("redis", redis_argv, base_env, tmp_path / "redis" / "stdout.log")
    wait_port(hosts.ips["redis"], 6379)

    cli_env = env_for("cli", "cli")
    cli_argv = [executable(services["cli"]["entrypoint"][0]), *services["cli"]["entrypoint"][1:]]

    def cli(*args: str) -> str:
        return hosts.run("cli", [*cli_argv, *args], cli_env)

    inputs = tmp_path / "cli" / "in"
    inputs.mkdir(parents=True)
    source = inputs / "items.jsonl"
    source.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(1000)))
    job_id = json.loads(
        cli("create", "Process this record", "--over", str(source), "--concurrency", "16", "--json")
    )["job_id"]
    cli("run", job_id)
    source.unlink()  # the workers have no access to the creator's files: contents are in Redis

    worker_argv = [executable(services["worker"]["command"][0]), *services["worker"]["command"][1:]]
    w1 = hosts.spawn("worker1", worker_argv, env_for("worker1", "worker"), tmp_path / "worker1.log")
    w2 = hosts.spawn("worker2", worker_argv, env_for("worker2", "worker"), tmp_path / "worker2.log")

    def completed() -> int:
        return json.loads(cli("status", job_id, "--json"))["completed"]

    wait_for(lambda: completed() >= 150, timeout=90, message="the job under way")

    # The dashboard, as compose runs it, on a host of its own: it sees the job and both workers.
    dashboard_argv = [
        executable(services["dashboard"]["command"][0]),
        *services["dashboard"]["command"][1:],
    ]
    hosts.spawn(
        "dashboard", dashboard_argv, env_for("dashboard", "dashboard"), tmp_path / "dashboard.log"
    )
    dashboard_port = int(dashboard_argv[dashboard_argv.index("--port") + 1])
    wait_port(hosts.ips["dashboard"], dashboard_port)
    dashboard = f"http://{hosts.ips['dashboard']}:{dashboard_port}"

    def shown(path: str, token_given: str | None = token):
        request = urllib.request.Request(
            dashboard + path, headers={"Authorization": f"Bearer {token_given}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    row = next(j for j in shown("/api/jobs")["jobs"] if j["job_id"] == job_id)
    assert row["total"] == 1000 and row["completed"] >= 150 and row["state"] == "processing"
    workers = wait_for(
        lambda: len(found := shown("/api/workers")["workers"]) == 2 and found, message="2 workers"
    )
    assert [(w["threads"], w["answering"]) for w in workers] == [(16, True), (16, True)]
    with pytest.raises(urllib.error.HTTPError, match="403"):
        shown("/api/jobs", token_given="not-the-token")

    w1.send_signal(signal.SIGKILL)
    w1.wait(10)
    killed_at = time.time()
    assert completed() < 900, "the kill came mid-job"
    provider.release()
    provider.hold(let_through=450)  # then held again: the Redis restart comes mid-job too
    wait_for(lambda: completed() >= 600, timeout=90, message="progress after the kill")
    port = int(worker_argv[worker_argv.index("--metrics-port") + 1])

    def worker2_metrics() -> str:
        try:
            return (
                urllib.request.urlopen(f"http://{hosts.ips['worker2']}:{port}/metrics", timeout=5)
                .read()
                .decode()
            )
        except OSError:
            return ""  # its page is not up yet

    # Worker1 alone may have taken the 200 let through before worker2 started (a loaded machine):
    # after the kill worker2 does the rest, and its own page counts what it completed.
    completed_here = re.compile(r"hermes_bulk_items_completed_total\{worker=\"[^\"]+\"\} [1-9]")
    metrics = wait_for(
        lambda: (page := worker2_metrics()) and completed_here.search(page) and page,
        timeout=90,
        message="worker2's metrics page counts an item it completed",
    )
    assert "hermes_bulk_queue_depth" in metrics
    assert "worker" in cli("workers")
    provider.wait_held(1)

    # Redis restarts mid-job (a graceful shutdown writes the append-only file; then the same
    # command).
    before_restart = completed()
    worker2_log = tmp_path / "worker2.log"
    noticed = worker2_log.read_text().count("Redis at")  # what it said of Redis before the restart
    hosts.run(
        "redis",
        [executable("redis-cli"), "-a", password, "--no-auth-warning", "shutdown"],
        base_env,
    )
    redis_proc.wait(15)
    wait_for(
        lambda: worker2_log.read_text().count("Redis at") > noticed,
        timeout=60,
        message="the surviving worker to notice Redis is gone",
    )
    restarted_at = time.time()
    hosts.spawn("redis", redis_argv, base_env, tmp_path / "redis" / "stdout.log")
    wait_port(hosts.ips["redis"], 6379)
    provider.release()

    wait_for(
        lambda: json.loads(cli("status", job_id, "--json"))["state"] == "completed",
        timeout=180,
        interval=0.5,
        message="completion after the Redis restart",
    )
    assert before_restart < 1000, "the restart came mid-job"
    assert w2.poll() is None, "the surviving worker carried on through the Redis restart"
    assert "Redis" in (tmp_path / "worker2.log").read_text(), (
        "the worker saw Redis go away and backed off"
    )

    out = tmp_path / "cli" / "out" / "results.jsonl"
    out.parent.mkdir()  # an --output folder must exist
    assert cli("export", job_id, "--format", "jsonl", "--output", str(out)).strip() == str(out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 1000 and all(r["status"] == "completed" for r in rows)
    assert all(r["result"] == expected_answer(json.dumps({"n": i})) for i, r in enumerate(rows)), (
        "each exactly once"
    )
    assert (
        next(j for j in shown("/api/jobs")["jobs"] if j["job_id"] == job_id)["state"] == "completed"
    )
    by_item: dict[str, list[float]] = defaultdict(list)
    for r in provider.requests:
        by_item[r.item].append(r.at)
    resent = [times for times in by_item.values() if len(times) > 1]
    assert len(resent) <= 2 * 16, (
        f"{len(resent)} items sent again: only those in flight at the kill or restart"
    )
    assert all(
        any(t < e < times[-1] for e in (killed_at, restarted_at))
        for times in resent
        for t in times[:1]
    )
    provider.stop()
