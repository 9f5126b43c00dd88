"""A Redis primary, its replica and three Sentinels on loopback, for the tests and benchmarks
that kill the primary (tests/fleet/test_sentinel_failover.py, bench row 15).

Timings are a test's, not production's: the Sentinels call a primary down after DOWN_AFTER_MS
of silence (Sentinel's default: 30 s; docker/compose.sentinel.yaml: 5 s), so a failover takes
about 2-4 s here. Each Sentinel is told the replica and the other two at start (their ids are
set in their config files), and the primary syncs its replica at once (repl-diskless-sync-delay
0), so the cluster is ready in a fraction of a second.
"""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis

SERVICE = "hermes"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 4000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout} s waiting for {what}")


def redis_server() -> str:
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not installed")
    return exe


class Server:
    """One redis-server (a data node, AOF on) in a folder of its own."""

    def __init__(self, workdir: Path, *args: str) -> None:
        self.workdir, self.port, self.args = workdir, free_port(), list(args)
        self.proc: subprocess.Popen | None = None

    def start(self) -> Server:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                redis_server(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.workdir),
                "--appendonly",
                "yes",
                "--save",
                "",
                "--logfile",
                str(self.workdir / "redis.log"),
                # A replica's first sync would wait 5 s for more replicas to join.
                "--repl-diskless-sync-delay",
                "0",
                *self.args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(lambda: _port_open(self.port), 10, "redis-server to listen")
        return self

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        """A clean shutdown (SIGTERM), as a service restart does: Redis first writes its
        append-only file, so nothing acknowledged is lost (a kill can lose the last second)."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)

    def restart(self, *, graceful: bool = False) -> None:
        self.stop() if graceful else self.kill()
        self.start()


class SentinelServer:
    """One `redis-server --sentinel` with a config file of its own (Sentinel rewrites it)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir, self.port = workdir, free_port()
        self.myid = secrets.token_hex(20)
        workdir.mkdir(parents=True, exist_ok=True)
        self.config = workdir / "sentinel.conf"
        self.proc: subprocess.Popen | None = None

    def configure(self, primary: int, replica: int, others: list[SentinelServer]) -> None:
        lines = [
            f"port {self.port}",
            "bind 127.0.0.1",
            f"dir {self.workdir}",
            f"logfile {self.workdir / 'sentinel.log'}",
            f"sentinel myid {self.myid}",
            f"sentinel monitor {SERVICE} 127.0.0.1 {primary} 2",
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}",
            f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}",
            f"sentinel parallel-syncs {SERVICE} 1",
            f"sentinel known-replica {SERVICE} 127.0.0.1 {replica}",
            *(f"sentinel known-sentinel {SERVICE} 127.0.0.1 {o.port} {o.myid}" for o in others),
        ]
        self.config.write_text("\n".join(lines) + "\n")

    def start(self) -> SentinelServer:
        self.proc = subprocess.Popen(
            [redis_server(), str(self.config), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return self

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class SentinelCluster:
    """primary + replica + 3 Sentinels; `url()` is the redis+sentinel:// URL of the service."""

    def __init__(self, workdir: Path) -> None:
        self.primary = Server(workdir / "primary")
        self.replica = Server(workdir / "replica")
        self.replica.args += ["--replicaof", "127.0.0.1", str(self.primary.port)]
        self.sentinels = [SentinelServer(workdir / f"sentinel-{i}") for i in range(3)]
        for sentinel in self.sentinels:
            others = [o for o in self.sentinels if o is not sentinel]
            sentinel.configure(self.primary.port, self.replica.port, others)

    def start(self) -> SentinelCluster:
        self.primary.start()
        self.replica.start()
        for sentinel in self.sentinels:
            sentinel.start()
        wait_until(self.ready, 30, "the Sentinels and an in-sync replica", interval=0.1)
        return self

    def url(self, db: int = 0, query: str = "") -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/{db}" + (f"?{query}" if query else "")

    def _sentinel(self, sentinel: SentinelServer, call):
        client = redis.Redis(port=sentinel.port, socket_timeout=1)
        try:
            return call(client)
        finally:
            client.close()

    def ready(self) -> bool:
        """Every Sentinel knows the other two and the replica, and the replica is in sync:
        only then can a failover be agreed on."""
        try:
            for sentinel in self.sentinels:
                state = self._sentinel(sentinel, lambda c: c.sentinel_master(SERVICE))
                if state["num-other-sentinels"] < 2 or state["num-slaves"] < 1:
                    return False
            return self.info(self.replica).get("master_link_status") == "up"
        except (redis.RedisError, OSError):
            return False

    def info(self, server: Server) -> dict:
        client = redis.Redis(port=server.port, socket_timeout=1)
        try:
            return client.info("replication")
        finally:
            client.close()

    def primary_port(self) -> int | None:
        """The primary the Sentinels name now (by the first one that answers)."""
        for sentinel in self.sentinels:
            try:
                _, port = self._sentinel(
                    sentinel, lambda c: c.sentinel_get_master_addr_by_name(SERVICE)
                )
                return int(port)
            except (redis.RedisError, OSError, TypeError):
                continue
        return None

    def kill_primary(self) -> float:
        """kill -9 of the primary; returns when it died (time.time())."""
        self.primary.kill()
        return time.time()

    def wait_promoted(self, timeout: float = 30) -> float:
        """Seconds until the replica answers as the primary the Sentinels name."""
        started = time.monotonic()

        def promoted() -> bool:
            if self.primary_port() != self.replica.port:
                return False
            try:
                return self.info(self.replica).get("role") == "master"
            except redis.RedisError:
                return False

        wait_until(promoted, timeout, "the replica promoted")
        return time.monotonic() - started

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.kill()
        self.replica.kill()
        self.primary.kill()


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False
