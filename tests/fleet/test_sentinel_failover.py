"""A fleet on Redis Sentinel outlives its primary: kill -9 of the primary is a pause of seconds.

Real parts: a primary, its replica and three Sentinels on loopback (tests/sentinels.py), worker
processes, the loopback provider, `hermes-bulk` commands; the backend is the redis+sentinel://
URL alone. Each test proves itself by the export (every item answered, with its own answer, once)
and by the provider's own count of requests (no more than the items plus those in flight when
the primary died).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from hermes_bulk.testing.fake_provider import digest, expected_answer

from ..helpers import wait_for
from ..sentinels import SentinelCluster

pytestmark = pytest.mark.slow

CONCURRENCY = 8


@pytest.fixture
def cluster(tmp_path):
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
    assert cluster.primary_port() == cluster.replica.port
    assert all(w.poll() is None for w in workers), "the workers outlived the primary"

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
