"""run JOB --sample N: N items spread over the job (the first, the last, evenly between) are
answered, then the job pauses (reason "sample"); export shows those answers, and resume runs
the rest without sending a sampled item again. Real CLI and workers against the loopback
provider, on both backends; /bulk's is in tests/plugin/test_bulk_sample.py; the store's rule is
in the stateful model (tests/contract/test_store_stateful.py)."""

from __future__ import annotations

import json

import pytest

from hermes_bulk.store.records import spread
from hermes_bulk.testing.fake_provider import digest

from .helpers import wait_for

ITEMS = 20


def _source(tmp_path, n: int = ITEMS):
    src = tmp_path / "items.jsonl"
    src.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(n)))
    return src


def _item(i: int) -> str:
    return json.dumps({"n": i})


def test_a_sample_is_the_first_the_last_and_evenly_between():
    assert spread(20, 5) == [0, 5, 10, 14, 19]
    assert spread(20, 2) == [0, 19]
    assert spread(20, 1) == [0]
    assert spread(3, 5) == [0, 1, 2]
    assert spread(0, 5) == []
    assert spread(1000, 1000) == list(range(1000))
    for count in range(1, 60):
        for n in range(1, count + 1):
            ranks = spread(count, n)
            assert len(set(ranks)) == n and ranks == sorted(ranks), (count, n)
            assert ranks[0] == 0 and (n == 1 or ranks[-1] == count - 1)


def test_a_sample_sends_exactly_its_items_then_pauses_and_resume_runs_the_rest(
    backend_cli, fake_provider, tmp_path
):
    cli = backend_cli
    job_id = cli.json("create", "Describe", "--over", str(_source(tmp_path)), "--json")["job_id"]
    started = cli("run", job_id, "--sample", "5", "--no-check", HERMES_BULK_BASE_URL="http://x")
    assert "a sample of 5 items spread over the job" in " ".join(started.stdout.split())
    status = cli.status(job_id)
    assert status["sample"] == [1, 6, 11, 15, 20], "numbered as the export numbers items"
    assert "Sample (run --sample): 5 items spread over the job" in cli("status", job_id).stdout
    cli("pause", job_id)
    ran = cli("run", job_id, "--sample", "5", "--wait")
    assert ran.returncode == 0
    sampled = [0, 5, 10, 14, 19]
    assert sorted(r.item for r in fake_provider.requests) == sorted(
        digest(_item(i)) for i in sampled
    ), "exactly the 5 sampled items were sent"
    status = cli.status(job_id)
    assert (status["state"], status["pause_reason"], status["completed"]) == ("paused", "sample", 5)
    assert "Paused after its sample (run --sample)" in cli("status", job_id).stdout
    lines = [
        json.loads(line)
        for line in cli("export", job_id, "--format", "jsonl", "--output", "-").stdout.splitlines()
    ]
    assert [line["item"] for line in lines if line["status"] == "completed"] == [
        f"line:{i + 1}" for i in sampled
    ]

    cli("resume", job_id)
    cli("run", job_id, "--wait")
    items = [r.item for r in fake_provider.requests]
    assert len(items) == ITEMS and len(set(items)) == ITEMS, "no sampled item was sent again"
    assert cli.status(job_id)["state"] == "completed"


def test_a_sample_takes_only_pending_items_and_a_second_sample_takes_others(
    backend_cli, fake_provider, tmp_path
):
    cli = backend_cli
    job_id = cli.json("create", "Describe", "--over", str(_source(tmp_path, 6)), "--json")["job_id"]
    cli("run", job_id, "--sample", "2", "--wait")
    cli("run", job_id, "--sample", "2", "--wait")  # of the 4 left: items 2 and 5
    assert sorted(r.item for r in fake_provider.requests) == sorted(
        digest(_item(i)) for i in (0, 5, 1, 4)
    )
    cli("run", job_id, "--sample", "99", "--wait")  # more than are left: all of them
    assert len(fake_provider.requests) == 6
    assert cli.status(job_id)["state"] == "completed"


def test_a_sample_is_refused_where_it_cannot_be(cli, tmp_path):
    src = _source(tmp_path, 3)
    batch = cli.json("create", "Describe", "--over", str(src), "--batch", "--json")["job_id"]
    proc = cli("run", batch, "--sample", "2", check=False)
    assert proc.returncode != 0 and "--sample is for live jobs" in proc.stderr
    live = cli.json("create", "Describe", "--over", str(src), "--json", "--fresh")["job_id"]
    for bad in ("0", "-1", "1001", "x"):
        proc = cli("run", live, "--sample", bad, check=False)
        assert proc.returncode == 2 and "--sample" in proc.stderr, (bad, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert cli.status(live)["state"] == "not_started", "a refused sample changed nothing"


@pytest.mark.parametrize("interruption", ["pause", "kill", "cost"])
def test_a_sample_survives_a_pause_and_a_workers_death_until_its_items_are_done(
    backend_cli, fake_provider, tmp_path, interruption
):
    """Two of five sampled items answered, then the sample is cut off: by the user's pause (the
    third, in flight, lands), by kill -9 of the worker (the job awaits recovery and `run`
    continues it), or by --max-cost (resume with a larger one). What continues it runs the rest
    of the sample and pauses again: a resume once ran all 20 items."""
    cli = backend_cli
    cli.env["HERMES_BULK_PRICE"] = "100,400"
    flags = ("--max-cost", "0.1", "--max-output-tokens", "100") if interruption == "cost" else ()
    job_id = cli.create("Describe", _source(tmp_path), "--concurrency", "1", *flags)
    cli("run", job_id, "--sample", "5", "--no-check")
    sampled = [0, 5, 10, 14, 19]
    if interruption == "cost":  # each may cost up to $0.08 and costs about $0.01
        worker = cli.spawn_worker("-w", "1")
        wait_for(lambda: cli.status(job_id)["state"] == "paused", timeout=60)
        worker.terminate()
        worker.wait(30)
        assert cli.status(job_id)["pause_reason"] == "cost limit reached"
    else:
        fake_provider.hold(let_through=2)
        worker = cli.spawn_worker("-w", "1")
        fake_provider.wait_held(1)
        if interruption == "pause":
            cli("pause", job_id)
            fake_provider.release()
            wait_for(lambda: cli.status(job_id)["running"] == 0, timeout=60)
            worker.terminate()
        else:
            worker.kill()
            fake_provider.release()
        worker.wait(30)
    done = cli.status(job_id)["completed"]
    if interruption == "cost":
        assert 0 < done < 5, done
    else:
        assert done == (3 if interruption == "pause" else 2), "a pause lets the one in flight land"
    assert cli.status(job_id)["sample"] == [i + 1 for i in sampled], "the sample is still there"
    assert "Sample (run --sample): 5 items" in cli("status", job_id).stdout
    if interruption == "pause":
        proc = cli("resume", job_id, "--wait")
    elif interruption == "kill":
        proc = cli("run", job_id, "--wait")
    else:
        proc = cli("resume", job_id, "--max-cost", "5", "--wait")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    status = cli.status(job_id)
    assert (status["state"], status["pause_reason"], status["completed"]) == ("paused", "sample", 5)
    answered = {r.item for r in fake_provider.requests if r.status == 200}
    assert answered == {digest(_item(i)) for i in sampled}, "the sample's items, and no other"
    assert status["sample"] is None, "done: the sample is cleared"
