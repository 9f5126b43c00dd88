"""The test suite's own real parts stop cleanly: a teardown that raises fails a green test.

A teardown can fail alone: the loopback provider's stop() once raced the end of its event loop
while a connection was still open. Every stop here happens with answers in flight.
"""

from __future__ import annotations

import gc
import http.client
import json
import logging
import os
import threading
import time

import pytest

from hermes_bulk.testing.fake_provider import FakeProvider


def _ask(port: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
            headers={"Content-Type": "application/json"},
        )
        conn.getresponse().read()
    except (OSError, http.client.HTTPException):
        pass  # the server is stopping under this request: that is the point
    finally:
        conn.close()


# A connection accepted in the very turn of stop() can be left for the garbage collector to close
# (Python 3.11 asyncio); that is a socket of a server that is gone, not a fault of this test's kind.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_the_loopback_provider_stops_cleanly_with_answers_in_flight(caplog):
    caplog.set_level(logging.ERROR, logger="asyncio")
    for round_ in range(40):
        provider = FakeProvider(latency_s=0.5).start()
        askers = [
            threading.Thread(target=_ask, args=(provider.port,), daemon=True) for _ in range(4)
        ]
        for asker in askers:
            asker.start()
        time.sleep(0.02 * (round_ % 4))  # stop before, during and after the requests arrive
        provider.stop()  # must not raise
        assert not provider._thread.is_alive(), f"round {round_}: the server thread outlived stop()"
        for asker in askers:
            asker.join(10)
    # Those left sockets are collected here, under this test's filters: left to the collector's
    # own time they warn in whichever test runs next (CI of 2026-12-02 failed the next one so).
    gc.collect()
    assert [r.getMessage() for r in caplog.records] == []


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_the_in_process_status_reads_what_the_status_command_prints(
    cli, tmp_path, redis_url, backend
):
    """Cli.status stands in for `hermes-bulk status JOB --json` in polls: it must print the same."""
    extra = {"HERMES_BULK_BACKEND": redis_url} if backend == "redis" else {}
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(3)))
    job_id = cli.json("create", "Do", "--over", str(src), "--json", **extra)["job_id"]
    cli("run", job_id, "--wait", **extra)
    printed = cli.json("status", job_id, "--json", **extra)
    assert printed["completed"] == 3
    assert cli.status(job_id, **extra) == printed


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_create_and_run_in_process_answer_as_their_processes_do_and_leave_nothing_behind(
    cli, tmp_path, redis_url, backend
):
    """Cli runs `create` and `run` in the test's process (tests/helpers.run_in_process): the same
    output and exit status as the command's own process, for a job and for each kind of error,
    and this process as it was (its environment, its loggers, no backend left open)."""
    from hermes_bulk.fleet import broker

    extra = {"HERMES_BULK_BACKEND": redis_url} if backend == "redis" else {}
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(3)))
    environ = dict(os.environ)
    loggers = {
        name: (list(lg.handlers), lg.level, lg.propagate)
        for name in ("hermes_bulk", "huey")
        for lg in [logging.getLogger(name)]
    }
    for args in (
        ["create", "Do", "--over", str(tmp_path / "missing.jsonl")],  # a bad input
        ["create", "Do", "--over", str(src), "--concurrency", "0"],  # a bad value
        ["create", "Do", "--over", str(src), "--no-such-flag"],  # a bad flag
        ["run", "nosuchjob"],
    ):
        here, there = (
            cli(*args, check=False, **extra),
            cli(*args, check=False, process=True, **extra),
        )
        assert (here.returncode, here.stdout, here.stderr) == (
            there.returncode,
            there.stdout,
            there.stderr,
        ), args
        assert here.returncode != 0 and here.stderr.startswith("hermes-bulk: "), args
    made = {}
    for how in ("here", "there"):
        made[how] = cli("create", "Do", "--over", str(src), process=how == "there", **extra)
    ids = [made[how].stdout.split()[2] for how in ("here", "there")]  # "Created job ID with ..."
    assert made["here"].stdout.replace(ids[0], "ID") == made["there"].stdout.replace(ids[1], "ID")
    assert "Created job ID with 3 items." in made["here"].stdout.replace(ids[0], "ID")
    ran_here, ran_there = cli("run", ids[0], **extra), cli("run", ids[1], process=True, **extra)
    assert ran_here.stdout.replace(ids[0], "ID") == ran_there.stdout.replace(ids[1], "ID")
    assert (
        cli.status(ids[0], **extra)["state"]
        == cli.status(ids[1], **extra)["state"]
        == "waiting_for_worker"
    )
    # The other commands run here, each beside its own process, on the same job.
    for args in (
        ["status", ids[0]],
        ["status", ids[0], "--json"],
        ["show", ids[0], "2"],
        ["export", ids[0], "--format", "jsonl", "--output", "-"],
        ["list"],
        ["status", "nosuchjob"],
        ["pause", ids[0]],
        ["pause", ids[0]],  # a wrong state: the same error either way
    ):
        here = cli(*args, check=False, **extra)
        if args[0] == "pause" and here.returncode == 0:
            cli("resume", ids[0], **extra)  # the same job paused again in its own process
        there = cli(*args, check=False, process=True, **extra)
        assert (here.returncode, here.stdout, here.stderr) == (
            there.returncode,
            there.stdout,
            there.stderr,
        ), args
    assert dict(os.environ) == environ
    assert {
        name: (list(lg.handlers), lg.level, lg.propagate)
        for name in ("hermes_bulk", "huey")
        for lg in [logging.getLogger(name)]
    } == loggers
    broker.close_all()  # what cli.status opened
