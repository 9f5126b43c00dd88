"""A worker's steady state on Redis is one script call an item: the completion, the next claim
and, while the provider key is unpaced, that item's turn (complete_and_claim's take_turn). Paced
keys (--rpm) still ask the limiter before each request, and a turn taken with a claim while the
key waits is waited out as acquire's own wait.

Real parts: a redis-server this test owns (its command counts are the measure), the loopback
provider, the HTTP client, the item pipeline as a worker's chain drives it.
"""

from __future__ import annotations

import time

import pytest
import redis

from hermes_bulk.fleet import broker
from hermes_bulk.providers.client import HttpModelClient
from hermes_bulk.providers.pacing import ProviderGate
from hermes_bulk.runtime.pipeline import ItemProcessor
from hermes_bulk.store.protocol import COMPLETED, Turn

from .conftest import RedisServer
from .helpers import running_job

ITEMS = 120


def _script_calls(server: RedisServer) -> int:
    stats = redis.Redis.from_url(server.url).info("commandstats")
    return stats.get("cmdstat_evalsha", {}).get("calls", 0)


@pytest.mark.parametrize(("rpm", "most", "least"), [(None, 1.1, 1.0), (600_000, 2.2, 1.9)])
def test_an_item_costs_one_script_call_while_its_provider_key_is_unpaced(
    tmp_path, fake_provider, own_redis, rpm, most, least
):
    backend = broker.build_backend(own_redis.url)
    client = HttpModelClient(
        base_url=fake_provider.base_url, api_key="k", model="fake-model", timeout_s=10
    )
    processor = ItemProcessor(
        store=backend.store,
        limits=backend.limits,
        worker_id="w1",
        client_for=lambda job: client,
        jobs_dir=tmp_path / "jobs",
        lease_s=60,
        concurrency_cap=4,
    )
    try:
        job_id = running_job(backend.store, "trips1", [f"item {i}" for i in range(ITEMS)], rpm=rpm)
        before = _script_calls(own_redis)
        taken, index = None, 0
        while True:  # one chain, as WorkerRuntime.handle_trigger drives it
            outcome = processor.handle(job_id, index, claim=taken, chain=lambda: True)
            if not outcome.claimed:
                break
            taken, index = outcome.next, (outcome.index or 0) + 1
        calls = _script_calls(own_redis) - before
        assert backend.store.get_job(job_id).completed == ITEMS
        assert all(i.status == COMPLETED for i in backend.store.iter_items(job_id))
        assert len(fake_provider.requests) == ITEMS
        # Unpaced: the first claim and acquire, then one call an item. Paced: acquire as well.
        assert least * ITEMS <= calls <= most * ITEMS + 3, calls
        # Each request counted once in the key's one-second windows (what a 429 measures the
        # rate from): a turn taken with the claim is not taken again.
        window = redis.Redis.from_url(own_redis.url).hmget(
            backend.limits.keys.limit(client.provider_key), ["window_count", "previous_count"]
        )
        assert sum(int(n or 0) for n in window) <= ITEMS
    finally:
        client.close()
        backend.close()


def test_a_turn_taken_with_a_claim_while_the_key_waits_is_waited_out(own_redis):
    backend = broker.build_backend(own_redis.url)
    slept: list[float] = []
    try:
        gate = ProviderGate(backend.limits, "p:gate", rpm=None, tpm=None, sleep=slept.append)
        gate.wait_for_turn(0, taken=Turn(2.5, 0))
        assert slept == [2.5], "the taken turn's wait, then a turn of its own"
        gate.wait_for_turn(0, taken=Turn(0.0, 0))
        assert slept == [2.5], "a turn taken with the claim is used as it is"

        def sleep(seconds: float) -> None:  # the limiter reads Redis' clock: time must pass
            slept.append(seconds)
            time.sleep(seconds)

        paced = ProviderGate(backend.limits, "p:paced", rpm=120, tpm=None, sleep=sleep)
        paced.wait_for_turn(0, taken=Turn(0.0, 0))
        paced.wait_for_turn(0, taken=Turn(0.0, 0))
        assert slept[1:] and 0 < slept[1] <= 0.5, "paced: the limiter is asked, and spaces them"
    finally:
        backend.close()
