"""A command run while a restarted Redis is still loading its data waits for it, and a wait too
long for a command ends in one line that says what is going on (not "Start it").

redis-server answers LOADING until its data is read back after a restart; `key-load-delay`
(a Redis setting its own tests use) stretches that to seconds, so the command surely arrives
while it lasts: the test sees LOADING itself before running the command.
"""

from __future__ import annotations

import socket
import time

import pytest
import redis

from hermes_bulk.errors import BackendUnavailable
from hermes_bulk.store.redis import connection

from .conftest import RedisServer
from .helpers import wait_for

FILLER_KEYS = 3000  # read back at 1 ms each (key-load-delay 1000 us): about 3 s of LOADING


def _answers_loading(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"-LOADING")
    except OSError:
        return False


@pytest.fixture
def loading_redis(tmp_path):
    """A redis-server of this test's own, with data that takes seconds to load after a restart."""
    server = RedisServer(tmp_path / "redis-loading")
    server.workdir.mkdir()
    server.start()
    yield server
    server.kill()


def _fill_and_restart_slowly(server: RedisServer) -> None:
    client = redis.Redis(port=server.port)
    client.eval(f"for i = 1, {FILLER_KEYS} do redis.call('SET', 'filler:' .. i, 'x') end", 0)
    client.bgrewriteaof()  # the data goes into the RDB base, whose loading key-load-delay slows
    wait_for(
        lambda: (
            client.info("persistence")["aof_rewrite_in_progress"] == 0
            and client.info("persistence")["aof_rewrite_scheduled"] == 0
        ),
        timeout=30,
        message="the AOF rewrite",
    )
    client.close()
    # Answering LOADING every kilobyte read (not every 2 MB): clients hear it while it lasts.
    server.extra_args = [
        "--key-load-delay",
        "1000",
        "--loading-process-events-interval-bytes",
        "1024",
    ]
    server.restart(graceful=True)
    wait_for(
        lambda: _answers_loading(server.port),
        timeout=10,
        interval=0.01,
        message="Redis loading its data",
    )


def test_a_command_during_loading_waits_for_the_data_and_answers(cli, loading_redis, tmp_path):
    env = {"HERMES_BULK_BACKEND": f"{loading_redis.url}?prefix=load"}
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(f'{{"n": {i}}}\n' for i in range(7)))
    job_id = cli.json("create", "Do", "--over", str(src), "--json", **env)["job_id"]
    _fill_and_restart_slowly(loading_redis)
    started = time.monotonic()
    status = cli.json("status", job_id, "--json", **env)
    assert status["total"] == 7 and status["state"] == "not_started"
    assert not _answers_loading(loading_redis.port), "the command answered once the data was back"
    assert time.monotonic() - started < connection.LOADING_WAIT_S


def test_loading_longer_than_a_command_waits_is_said_in_one_line(loading_redis, monkeypatch):
    _fill_and_restart_slowly(loading_redis)
    monkeypatch.setattr(connection, "LOADING_WAIT_S", 0.3)
    from hermes_bulk.config.backend_url import parse_backend_url

    with pytest.raises(BackendUnavailable) as caught:
        connection.connect_redis(parse_backend_url(loading_redis.url))
    message = str(caught.value)
    assert message == (
        f"Redis at 127.0.0.1:{loading_redis.port} is loading its data (it has just restarted); "
        "try again in a moment."
    ), message
