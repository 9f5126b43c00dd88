"""A fleet on Redis Sentinel outlives its primary: kill -9 of the primary is a pause of seconds.

Real parts: a primary, its replica and three Sentinels on loopback (tests/sentinels.py), worker
processes, the loopback provider, `hermes-bulk` commands; the backend is the redis+sentinel://
URL alone. Each test proves itself by the export (every item answered, with its own answer, once)
and by the provider's own count of requests (no more than the items plus those in flight when
the primary died).
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from hermes_bulk.budget.ledger import CallRecord
from hermes_bulk.budget.policy import ALLOWED, FAILED_OPEN
from hermes_bulk.budget.service import Budget
from hermes_bulk.budget.settings import LEDGER_ENV
from hermes_bulk.testing.fake_provider import digest, expected_answer
from hermes_bulk.testing.sentinels import SentinelCluster

from ..conftest import IN_CI
from ..helpers import wait_for

pytestmark = pytest.mark.slow

CONCURRENCY = 8
THREADS = 4  #: callers of the ledger test


@pytest.fixture
def cluster(tmp_path):
    if shutil.which("redis-server") is None and not IN_CI:
        pytest.skip("redis-server is not installed")
    cluster = SentinelCluster(tmp_path / "sentinel").start()
    yield cluster
    cluster.stop()


def jsonl(path: Path, n: int, key: str) -> Path:
    path.write_text("".join(json.dumps({key: i}) + "\n" for i in range(n)))
    return path


def exported(cli, job_id: str) -> list[dict]:
    path = cli("export", job_id, "--format", "jsonl").stdout.strip()
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def assert_answered_once(cli, job_id: str, n: int, key: str) -> None:
    """The export holds every item once, each with the answer to its own content."""
    rows = exported(cli, job_id)
    assert [r["item"] for r in rows] == [f"line:{i + 1}" for i in range(n)]
    assert [r["status"] for r in rows] == ["completed"] * n
    assert [r["result"] for r in rows] == [
        expected_answer(json.dumps({key: i})) for i in range(n)
    ], "each item has its own answer"


def requests_of(fake_provider, n: int, key: str) -> Counter:
    """How many times the provider was asked each item of a job (by the items' own digests)."""
    mine = {digest(json.dumps({key: i})) for i in range(n)}
    return Counter(r.item for r in fake_provider.requests if r.item in mine)


def test_a_600_item_job_on_two_workers_and_a_job_created_just_before_kill_9_of_the_primary_complete(
    cli, cluster, tmp_path, fake_provider
):
    cli.env["HERMES_BULK_BACKEND"] = cluster.url(0)
    fake_provider.configure(latency_s=0.02)
    big = cli.create(
        "Process", jsonl(tmp_path / "big.jsonl", 600, "a"), "--concurrency", str(CONCURRENCY)
    )
    cli("run", big)
    workers = [cli.spawn_worker("-w", "8", HERMES_BULK_LEASE_SECONDS="10") for _ in range(2)]
    wait_for(lambda: cli.status(big)["completed"] >= 150, timeout=60, message="the job under way")
    late = cli.create(
        "Process", jsonl(tmp_path / "late.jsonl", 40, "b"), "--concurrency", str(CONCURRENCY)
    )
    cli("run", late)
    killed_at = cluster.kill_primary()
    old, new = cluster.primary.port, cluster.replica.port
    before = cli.status(big)["completed"]  # rides out the failover: read on the new primary
    assert before < 600, "the primary died mid-job"
    wait_for(
        lambda: (
            cli.status(big)["state"] == "completed" and cli.status(late)["state"] == "completed"
        ),
        timeout=90,
        interval=0.2,
        message="both jobs completed on the new primary",
    )
    assert cluster.primary_port() == new
    assert all(w.poll() is None for w in workers), "the workers outlived the primary"
    # Where writes go, as the workers said at start and doctor says now.
    first_lines = (cli.logs_dir / "worker-1.log").read_text()
    assert f"writes go to Redis primary 127.0.0.1:{old} (Sentinel service hermes), 1 replica\n" in (
        first_lines
    )
    doctor = cli("doctor").stdout
    assert f"store    Redis primary 127.0.0.1:{new} (Sentinel service hermes), 0 replicas" in doctor

    assert_answered_once(cli, big, 600, "a")
    assert_answered_once(cli, late, 40, "b")
    for n, key in ((600, "a"), (40, "b")):
        asked = requests_of(fake_provider, n, key)
        assert len(asked) == n, "every item was asked"
        again = [item for item, times in asked.items() if times > 1]
        # Asked again: only what was in flight when the primary died (the job's concurrency).
        assert sum(asked.values()) <= n + CONCURRENCY, (sum(asked.values()), n)
        for item in again:
            first = min(r.at for r in fake_provider.requests if r.item == item)
            assert first <= killed_at + 0.5, "an item was asked again without the kill"


def _ask(base_url: str, text: str) -> None:
    """One chat request to the loopback provider (it counts them)."""
    body = json.dumps({"model": "fake-model", "messages": [{"role": "user", "content": text}]})
    request = urllib.request.Request(
        f"{base_url}/chat/completions",
        data=body.encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer k"},
    )
    urllib.request.urlopen(request, timeout=10).read()


def test_a_ledger_counting_through_kill_9_of_the_primary_misses_no_more_than_it_says(
    cluster, tmp_path, fake_provider, monkeypatch
):
    """Calls go through while the Sentinels elect a new primary (the ledger fails open and notes
    each such call); afterwards it counts on the new primary. Counted plus noted is what the
    provider was asked, less at most one admission a thread acknowledged just before the kill
    that no replica had yet (the at-risk window)."""
    monkeypatch.delenv(LEDGER_ENV, raising=False)
    budget = Budget(tmp_path / "cron-budget")
    budget.settings_file.set("ledger", cluster.url(0, "prefix=budget"))
    stop, decisions, lock = threading.Event(), Counter(), threading.Lock()

    def caller(n: int) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            call = CallRecord("cron", profile="p", job_id=f"job{n}", run_id=f"r{n}-{i}", model="m")
            outcome = budget.admit(call)
            _ask(fake_provider.base_url, f"thread {n} call {i}")
            with lock:
                decisions[outcome.decision] += 1
            time.sleep(0.01)

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: decisions[ALLOWED] >= 40, message="the ledger counting")
        cluster.kill_primary()
        cluster.wait_promoted()
        counted_before = decisions[ALLOWED]
        wait_for(
            lambda: decisions[ALLOWED] > counted_before + 40,
            timeout=30,
            message="counting again on the new primary",
        )
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    report = budget.report()
    budget.close()
    asked = len(fake_provider.requests)
    assert sum(decisions.values()) == asked
    assert decisions[FAILED_OPEN] > 0, "calls went through while there was no primary"
    assert set(decisions) <= {ALLOWED, FAILED_OPEN}, decisions
    assert report.failopen is not None and report.failopen.calls == decisions[FAILED_OPEN]
    counted = report.counts.total
    assert counted <= decisions[ALLOWED], "never more counted than admitted"
    assert decisions[ALLOWED] - counted <= THREADS, "lost: only what was in flight at the kill"
