"""A Redis primary, its replica and three Sentinels on loopback, started by the test that uses
them (tests/conftest.RedisServer, extended): kill -9 the primary, and the Sentinels promote the
replica within a few seconds.

Timings are a test's, not production's: the Sentinels call a primary down after DOWN_AFTER_MS
of silence (production default: 30 s; docker/compose.sentinel.yaml: 5 s), so a failover takes
about 2-4 s here.
"""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis

from .conftest import IN_CI, RedisServer, free_port
from .helpers import wait_for

SERVICE = "hermes"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 4000


class SentinelServer:
    """One `redis-server --sentinel` with a config file of its own (Sentinel rewrites it)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir, self.port = workdir, free_port()
        self.myid = secrets.token_hex(20)
        workdir.mkdir(parents=True, exist_ok=True)
        self.config = workdir / "sentinel.conf"
        self.proc: subprocess.Popen | None = None

    def configure(self, primary_port: int, replica_port: int, others: list[SentinelServer]):
        """Its config: the primary to watch, and (so that it need not spend seconds finding
        them) the replica and the other Sentinels, by the ids they are given."""
        lines = [
            f"port {self.port}",
            "bind 127.0.0.1",
            f"dir {self.workdir}",
            f"logfile {self.workdir / 'sentinel.log'}",
            f"sentinel myid {self.myid}",
            f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 2",
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}",
            f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}",
            f"sentinel parallel-syncs {SERVICE} 1",
            f"sentinel known-replica {SERVICE} 127.0.0.1 {replica_port}",
            *(f"sentinel known-sentinel {SERVICE} 127.0.0.1 {o.port} {o.myid}" for o in others),
        ]
        self.config.write_text("\n".join(lines) + "\n")

    def start(self) -> SentinelServer:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed")
        self.proc = subprocess.Popen(
            [exe, str(self.config), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return self

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class SentinelCluster:
    """primary + replica + 3 Sentinels. `url` is the redis+sentinel:// URL of the service."""

    def __init__(self, workdir: Path) -> None:
        if shutil.which("redis-server") is None and not IN_CI:
            import pytest

            pytest.skip("redis-server is not installed")
        (workdir / "primary").mkdir(parents=True)
        (workdir / "replica").mkdir()
        self.primary = RedisServer(workdir / "primary")
        self.replica = RedisServer(workdir / "replica")
        self.sentinels = [SentinelServer(workdir / f"sentinel-{i}") for i in range(3)]
        for sentinel in self.sentinels:
            others = [o for o in self.sentinels if o is not sentinel]
            sentinel.configure(self.primary.port, self.replica.port, others)

    def start(self) -> SentinelCluster:
        # A replica's first sync waits repl-diskless-sync-delay (5 s) for more replicas to join.
        for server in (self.primary, self.replica):
            server.extra_args = ["--repl-diskless-sync-delay", "0"]
        self.primary.start()
        self.replica.extra_args += ["--replicaof", "127.0.0.1", str(self.primary.port)]
        self.replica.start()
        for sentinel in self.sentinels:
            sentinel.start()
        wait_for(self.ready, timeout=30, interval=0.1, message="sentinels, replica in sync")
        return self

    @property
    def hosts(self) -> str:
        return ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)

    def url(self, db: int = 0, query: str = "") -> str:
        return f"redis+sentinel://{self.hosts}/{SERVICE}/{db}" + (f"?{query}" if query else "")

    def sentinel_info(self, sentinel: SentinelServer) -> dict:
        client = redis.Redis(port=sentinel.port, socket_timeout=1)
        try:
            return client.sentinel_master(SERVICE)
        finally:
            client.close()

    def ready(self) -> bool:
        """Every Sentinel knows the other two and the replica, and the replica is in sync:
        only then can a failover be agreed on."""
        try:
            for sentinel in self.sentinels:
                state = self.sentinel_info(sentinel)
                if state["num-other-sentinels"] < 2 or state["num-slaves"] < 1:
                    return False
            info = redis.Redis(port=self.replica.port, socket_timeout=1).info("replication")
            return info.get("master_link_status") == "up"
        except (redis.RedisError, OSError):
            return False

    def primary_port(self) -> int | None:
        """The primary the Sentinels name now (by the first one that answers)."""
        for sentinel in self.sentinels:
            try:
                client = redis.Redis(port=sentinel.port, socket_timeout=1)
                host, port = client.sentinel_get_master_addr_by_name(SERVICE)
                client.close()
                return int(port)
            except (redis.RedisError, OSError, TypeError):
                continue
        return None

    def kill_primary(self) -> float:
        """kill -9 the primary; returns when (time.time()) it died."""
        self.primary.kill()
        return time.time()

    def wait_promoted(self, timeout: float = 30) -> float:
        """Seconds until the replica answers as the primary the Sentinels name."""
        started = time.monotonic()

        def promoted() -> bool:
            if self.primary_port() != self.replica.port:
                return False
            try:
                role = redis.Redis(port=self.replica.port, socket_timeout=1).info("replication")
            except redis.RedisError:
                return False
            return role.get("role") == "master"

        wait_for(promoted, timeout=timeout, interval=0.05, message="the replica promoted")
        return time.monotonic() - started

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.kill()
        self.replica.kill()
        self.primary.kill()


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False
