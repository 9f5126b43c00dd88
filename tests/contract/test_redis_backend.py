"""What only the Redis backend has: credentials in the URL, its key schema, its own limits.

The shared contract is in test_store_contract.py; these tests look at Redis itself (keys,
TTLs, the server going away), on servers this file starts where a test needs its own.
"""

from __future__ import annotations

import inspect
import time
import uuid

import pytest
import redis

from hermes_bulk.errors import BackendUnavailable
from hermes_bulk.fleet import broker
from hermes_bulk.sources import content_hash
from hermes_bulk.store.protocol import (
    NOT_STARTED,
    PAUSED,
    RUNNING,
    Event,
    ItemError,
    JobSpec,
    NewItem,
    Usage,
    WorkerInfo,
)
from hermes_bulk.store.redis.job_state import RETRY_BATCH_ITEMS
from hermes_bulk.store.redis.jobs import RedisJobStore
from hermes_bulk.store.redis.keys import EVENTS_KEPT, LIMIT_IDLE_KEEP_MS
from hermes_bulk.store.redis.limits import RedisLimits
from hermes_bulk.store.redis.scripts import call_job_script
from hermes_bulk.testing.sentinels import free_port
from tests.conftest import RedisServer

from ..helpers import wait_for
from .conftest import prefix_of
from .test_store_contract import ONE_ITEM, begun_job, claim, make_job


@pytest.fixture
def backend(redis_url):
    b = broker.build_backend(redis_url)
    yield b
    b.close()


@pytest.fixture
def store(backend):
    return backend.store


def keys_of(raw: redis.Redis, prefix: str) -> list[str]:
    """The prefix's keys but its layout mark and fingerprint salt (P:layout, set when a store
    opens, P:fingerprint_salt, by the first create: no job's or worker's). Job keys start with
    their hash tag ({prefix:job:…}), Huey's with "huey.": match anywhere."""
    store_wide = {f"{prefix}:layout", f"{prefix}:fingerprint_salt"}
    return sorted(k for k in raw.scan_iter(match=f"*{prefix}*", count=1000) if k not in store_wide)


@pytest.fixture
def secured(tmp_path) -> RedisServer:
    server = RedisServer(tmp_path, password=f"pw-{uuid.uuid4().hex}").start()
    yield server
    server.kill()


# Connecting ------------------------------------------------------------------------------------


def test_a_password_in_the_url_opens_a_protected_redis(secured):
    b = broker.build_backend(f"{secured.url}?prefix=auth")
    try:
        assert b.store.list_jobs() == []
    finally:
        b.close()


@pytest.mark.parametrize("credentials", ["", ":wrong-password@", "someone:wrong-password@"])
def test_wrong_or_missing_credentials_are_refused_without_echoing_them(secured, credentials):
    url = f"redis://{credentials}127.0.0.1:{secured.port}/0"
    with pytest.raises(BackendUnavailable) as info:
        broker.build_backend(url)
    message = str(info.value)
    assert f"127.0.0.1:{secured.port}" in message and "password" in message
    assert "wrong-password" not in message and secured.password not in message
    assert "\n" not in message


def test_an_unreachable_redis_names_host_and_port_and_what_to_do():
    port = free_port()  # nothing listens there
    with pytest.raises(BackendUnavailable) as info:
        broker.build_backend(f"redis://:not-shown@127.0.0.1:{port}/0")
    message = str(info.value)
    assert f"127.0.0.1:{port}" in message
    assert "Start it, or use the sqlite:// backend for a single machine" in message
    assert "not-shown" not in message and "\n" not in message


def test_a_redis_lost_mid_run_raises_backend_unavailable(tmp_path):
    server = RedisServer(tmp_path).start()
    b = broker.build_backend(f"{server.url}?prefix=lost")
    try:
        job_id = make_job(b.store, 3)
        server.kill()
        with pytest.raises(BackendUnavailable, match=f"127.0.0.1:{server.port}"):
            claim(b.store, job_id)
        with pytest.raises(BackendUnavailable):
            list(b.store.iter_items(job_id))  # a generator: raised while iterating
        with pytest.raises(BackendUnavailable):
            b.limits.acquire("k", rpm=60, tpm=None, tokens=1)
        with pytest.raises(BackendUnavailable):
            b.store.list_batches(job_id)  # a method of a part the store is built from
    finally:
        b.close()
        server.kill()


@pytest.mark.parametrize("cls", [RedisJobStore, RedisLimits], ids=["store", "limiter"])
def test_every_public_method_of_every_part_maps_a_lost_redis(cls):
    """A store built from parts (creation, claims, batches...): a part without the decorator
    would let a lost Redis escape as redis.ConnectionError, a traceback to the user."""
    public = {
        name
        for klass in cls.__mro__[:-1]
        for name, fn in vars(klass).items()
        if not name.startswith("_") and inspect.isfunction(fn)
    }
    assert len(public) > (20 if cls is RedisJobStore else 2)
    unmapped = sorted(
        name for name in public if not getattr(getattr(cls, name), "maps_connection_errors", False)
    )
    assert unmapped == []


# Keys ------------------------------------------------------------------------------------------


def test_delete_job_leaves_no_key_of_the_job_behind(store, raw, redis_url):
    prefix = prefix_of(redis_url)
    job_id = make_job(store, 6, contents=["same", "same", "a", "b", "c", "d"])
    store.add_events(job_id, [Event("note", "hello")])
    done, failed, _running = (claim(store, job_id) for _ in range(3))
    store.complete_item(job_id, done.index, "w1", "result", Usage(1, 2))
    store.fail_item(job_id, failed.index, "w1", ItemError("PermanentError", "no", 400))
    assert any(f"{{{prefix}:job:{job_id}}}" in k for k in keys_of(raw, prefix))

    assert store.delete_job(job_id) is True
    assert keys_of(raw, prefix) == [], "the job's keys and its index entries are all gone"


def test_finished_workers_and_their_index_expire(store, raw, redis_url):
    prefix = prefix_of(redis_url)
    store.heartbeat_worker(WorkerInfo("w-short", "h", 1, time.time(), 0.0, 2), ttl_s=0.1)
    assert keys_of(raw, prefix)
    wait_for(
        lambda: not raw.exists(f"{{{prefix}:workers}}:w-short"),
        timeout=10,
        interval=0.01,
        message="the worker's entry to expire in Redis",
    )
    assert store.live_workers() == []
    wait_for(
        lambda: keys_of(raw, prefix) == [],
        timeout=10,
        interval=0.01,
        message="nothing of the dead worker left behind (its index expires with it)",
    )


def test_a_limit_key_lives_a_day_past_its_last_use_and_a_success_on_no_key_makes_none(backend, raw):
    limits = backend.limits
    limits.acquire("paced", rpm=60, tpm=None, tokens=1)  # busy for the next second
    assert 0 < raw.pttl(limits.keys.limit("paced")) <= 1000 + LIMIT_IDLE_KEEP_MS
    limits.clear_backoff("never-limited")  # nothing to reset: no key without an expiry is left
    assert raw.exists(limits.keys.limit("never-limited")) == 0


def test_huey_queue_keys_are_namespaced_by_the_prefix(redis_server, raw):
    a, b = (
        broker.build_backend(f"{redis_server.url}?prefix=q{uuid.uuid4().hex[:8]}") for _ in range(2)
    )
    try:
        a.trigger("job-a", 0, 3, client="http")
        prefix_a, prefix_b = prefix_of(a.url), prefix_of(b.url)
        assert keys_of(raw, prefix_a) == [f"huey.redis.{prefix_a}.{broker.QUEUE_NAME}"]
        assert raw.llen(f"huey.redis.{prefix_a}.{broker.QUEUE_NAME}") == 3
        assert (a.queue_length(), b.queue_length()) == (3, 0), "another prefix is another queue"
        assert keys_of(raw, prefix_b) == []
    finally:
        a.close()
        b.close()


# Bounds ----------------------------------------------------------------------------------------


def test_events_keep_only_the_newest(store):
    job_id = make_job(store, 1)
    store.add_events(job_id, [Event("e", f"m{i}") for i in range(EVENTS_KEPT + 5)])
    events = store.list_events(job_id, EVENTS_KEPT + 100)
    assert len(events) == EVENTS_KEPT
    assert (events[0].message, events[-1].message) == ("m5", f"m{EVENTS_KEPT + 4}")


def test_retry_returns_more_failed_items_than_one_script_call_moves(store):
    n = RETRY_BATCH_ITEMS + 3
    job_id = make_job(store, n)
    for _ in range(n):
        c = claim(store, job_id)
        store.fail_item(job_id, c.index, "w1", ItemError("TransientError", "x"))
    assert store.retry_failed(job_id) == n
    job = store.get_job(job_id)
    assert (job.failed, job.pending) == (0, n)


def test_a_job_leaves_the_active_index_only_when_idle_and_returns_when_run(store, raw, redis_url):
    active = f"{prefix_of(redis_url)}:jobs:active"
    job_id = make_job(store, 2)
    c = claim(store, job_id)
    store.set_state(job_id, PAUSED, from_states=[RUNNING], pause_reason="user")
    store.release_expired_leases()
    assert raw.zscore(active, job_id) is not None, "a paused job still holding a lease stays"
    store.release_item(job_id, c.index, "w1")
    store.release_expired_leases()
    assert raw.zscore(active, job_id) is None, "paused and holding nothing: pruned"
    store.set_state(job_id, RUNNING, from_states=[PAUSED])
    assert store.active_job_ids() == [job_id]
    store.release_expired_leases()
    assert raw.zscore(active, job_id) is not None, "a running job is never pruned"


def test_a_job_being_created_is_indexed_but_never_listed(store, raw, redis_url):
    spec = JobSpec(
        job_id="creating-redis",
        instruction="x",
        source="/s",
        source_kind="file",
        concurrency=1,
        retries=0,
    )
    store.begin_job(spec)
    # Indexed before its keys exist, so an interrupted create can always be found and deleted.
    assert raw.zscore(f"{prefix_of(redis_url)}:jobs:created", spec.job_id) is not None
    assert store.find_job_ids("creating-") == []
    assert store.list_jobs() == []
    assert store.delete_job(spec.job_id) is True
    assert keys_of(raw, prefix_of(redis_url)) == []


def test_a_job_run_again_survives_a_prune_from_before(store, raw, redis_url):
    # Given a reaper that saw the paused job idle at its current run epoch
    active = f"{prefix_of(redis_url)}:jobs:active"
    job_id = make_job(store, 1)
    store.set_state(job_id, PAUSED, from_states=[RUNNING], pause_reason="user")
    seen_epoch = int(raw.zscore(active, job_id))
    # When someone runs the job before the reaper's prune arrives
    store.set_state(job_id, RUNNING, from_states=[PAUSED])
    assert store.lua.prune_active(keys=[active], args=[job_id, seen_epoch]) == 0
    # Then the job stays where the workers' maintenance looks
    assert store.active_job_ids() == [job_id]


def test_a_refused_run_leaves_no_lasting_index_entry(store, raw, redis_url):
    # Given a job that ran, was paused and left the index
    active = f"{prefix_of(redis_url)}:jobs:active"
    job_id = make_job(store, 1)
    store.set_state(job_id, PAUSED, from_states=[RUNNING], pause_reason="user")
    store.release_expired_leases()
    assert raw.zscore(active, job_id) is None
    # When a run is refused (the job is not in the states it may move from)
    assert store.set_state(job_id, RUNNING, from_states=[NOT_STARTED]) is None
    assert raw.zscore(active, job_id) == 0, "listed ahead of the run that was refused"
    # Then the next reaper pass removes that entry
    assert store.active_job_ids() == []
    store.release_expired_leases()
    assert raw.zscore(active, job_id) is None


# Per-item records in buckets (keys.py) ----------------------------------------------------------


def _bucketed_job(store, n: int, duplicates: dict[int, int] | None = None) -> str:
    """A running job of n items with real content hashes and answer keys (as create makes them);
    item d of `duplicates` has the answer key of item duplicates[d] (it waits on it)."""
    same = duplicates or {}
    job_id = f"bk{uuid.uuid4().hex[:10]}"
    store.begin_job(
        JobSpec(
            job_id=job_id,
            instruction="do it",
            source="/nowhere",
            source_kind="directory",
            concurrency=1000,
            retries=2,
            provider_key="p:test",
        )
    )
    store.add_items(
        job_id,
        [
            NewItem(
                i,
                f"doc-{i:06d}.txt",
                f"content {i}",
                content_hash(f"content {i}"),
                f"doc-{i:06d}.txt",
                -1,
                f"{i}:1796186286745940982",
                3000,
                answer_key=f"{same.get(i, i):032x}",
            )
            for i in range(n)
        ],
    )
    store.finish_job(job_id)
    store.set_state(job_id, RUNNING, from_states=[NOT_STARTED])
    return job_id


def test_a_jobs_records_are_listpack_buckets_of_128_items_and_read_back_whole(
    store, raw, redis_url
):
    n = 300
    job_id = _bucketed_job(store, n)
    for _ in range(n):
        c = claim(store, job_id, hint=0)
        if c.index == 7:
            assert (c.name, c.origin, c.offset, c.stat_sig) == (
                "doc-000007.txt",
                "doc-000007.txt",
                -1,
                "7:1796186286745940982",
            )
            assert c.content_hash == content_hash("content 7")
            store.fail_item(job_id, c.index, "w1", ItemError("PermanentError", "no", 400))
        else:
            store.complete_item(
                job_id,
                c.index,
                "w1",
                f"result {c.index}",
                Usage(2545, 8),
                provider="https://api.example.com/v1",
                model="model-2026-01-01",
            )
    keys = store.keys
    for family in ("items", "names", "states", "results", "keys"):
        buckets = [keys.bucket(job_id, family, b * 128) for b in range(3)]
        assert [raw.object("encoding", k) for k in buckets] == ["listpack"] * 3, family
        assert not raw.exists(keys.job_key(job_id, family)) or family == "keys"
    # Sources go when an item completes; the failed item keeps its own (retry processes it again).
    assert raw.hgetall(keys.bucket(job_id, "sources", 0)) == {
        "7": '["doc-000007.txt",-1,"7:1796186286745940982"]'
    }
    assert not raw.exists(keys.bucket(job_id, "sources", 128))
    answers = redis.Redis(port=raw.connection_pool.connection_kwargs["port"])  # binary fields
    try:
        fields = answers.hkeys(keys.answers)
        assert len(fields) == n - 1 and all(len(k) == 16 for k in fields), (
            "answer keys as their 16 bytes"
        )
    finally:
        answers.close()

    items = list(store.iter_items(job_id, batch=100))
    assert [i.index for i in items] == list(range(n))
    assert (
        items[299].name,
        items[299].result,
        items[299].provider,
        items[299].model,
        items[299].tokens_in,
    ) == ("doc-000299.txt", "result 299", "https://api.example.com/v1", "model-2026-01-01", 2545)
    assert (items[7].status, items[7].error_type, items[7].http_status) == (
        "failed",
        "PermanentError",
        400,
    )
    assert (
        store.find_item(job_id, "doc-000250.txt") == 250 and store.find_item(job_id, "nope") is None
    )
    assert store.item_names(job_id, [5, 200, 299, 300]) == {
        5: "doc-000005.txt",
        200: "doc-000200.txt",
        299: "doc-000299.txt",
    }
    detail = store.get_item(job_id, 130)
    assert (detail.item.result, detail.content_hash) == ("result 130", content_hash("content 130"))
    assert store.retry_failed(job_id) == 1 and claim(store, job_id).index == 7


def test_a_long_value_turns_only_its_own_bucket_into_a_hashtable(store, raw):
    job_id = _bucketed_job(store, 200)
    c = claim(store, job_id, hint=0)
    store.fail_item(
        job_id,
        c.index,
        "w1",
        ItemError("PermanentError", "a message longer than 64 bytes " * 3, 400),
    )
    assert raw.object("encoding", store.keys.bucket(job_id, "states", 0)) == "hashtable"
    c = claim(store, job_id, hint=150)
    store.complete_item(job_id, c.index, "w1", "ok", Usage(1, 1))
    assert raw.object("encoding", store.keys.bucket(job_id, "states", 150)) == "listpack"
    assert store.get_item(job_id, 0).item.error_message.startswith("a message longer")


# Every key a script touches is in its KEYS (keys.py) --------------------------------------------


def test_a_claim_that_falls_back_to_another_bucket_asks_for_it_before_writing(
    store, raw, redis_url
):
    prefix = prefix_of(redis_url)
    job_id = _bucketed_job(store, 300)  # buckets 0, 1 and 2
    assert claim(store, job_id, hint=299).index == 299
    real, calls = store.lua.claim_item, []

    def recorded(*, keys, args):
        calls.append((len(keys), store.get_job(job_id).running))
        return real(keys=keys, args=args)

    store.lua.claim_item = recorded
    try:
        # The hint is taken: the lowest pending (0) is in bucket 0, which the first call lacks.
        assert claim(store, job_id, hint=299).index == 0
    finally:
        store.lua.claim_item = real
    assert calls == [(13 + 6, 1), (13 + 12, 1)], "asked for bucket 0 first, having changed nothing"
    # A delete is given every bucket (here 3): none is left behind.
    assert store.delete_job(job_id) is True
    assert keys_of(raw, prefix) == []


def test_the_suites_key_check_refuses_a_key_a_script_was_not_given(store):
    job_id = _bucketed_job(store, 3)
    c = claim(store, job_id)
    keys = store.keys
    lacking_results = [k for k in keys.bucket_keys(job_id, 0) if ":results:" not in k]
    with pytest.raises(redis.ResponseError, match="touched a key not in KEYS: .*:results:0"):
        store.lua.complete_item(
            keys=[*keys.job(job_id), *lacking_results],
            args=[c.index, "w1", "result", 1, 1, "", "", job_id, "", 0, 0],
        )


def test_an_items_duplicates_in_other_buckets_complete_and_fail_with_it(store):
    # 200 and 260 wait on 5 (bucket 0); 201 on 6; 202 on 7.
    job_id = _bucketed_job(store, 300, duplicates={200: 5, 260: 5, 201: 6, 202: 7})
    for _ in range(5):
        claim(store, job_id, hint=0)  # 0..4 held
    first = claim(store, job_id, hint=5)
    # The claim's hint (299) is in bucket 2, which neither the completion nor its duplicates'
    # buckets give: it is asked for before anything is written.
    done, taken = store.complete_and_claim(
        job_id, 5, "w1", "five", Usage(1, 1), index_hint=299, lease_s=30, max_running=99
    )
    assert first.index == 5 and done and taken.index == 299
    assert [store.get_item(job_id, i).item.result for i in (5, 200, 260)] == ["five"] * 3
    assert claim(store, job_id, hint=6).index == 6
    assert store.fail_item(job_id, 6, "w1", ItemError("PermanentError", "no", 400))
    assert store.get_item(job_id, 201).item.status == "failed"
    assert claim(store, job_id, hint=7).index == 7
    error = ItemError("TransientError", "again", 503)
    assert store.settle_failed_attempt(job_id, 7, "w1", error, retries=0) == 1
    assert store.get_item(job_id, 202).item.status == "failed"
    job = store.get_job(job_id)
    assert (job.completed, job.failed, job.running) == (3, 4, 6)
    # The claim after a completion falls to the lowest pending (8, bucket 0) when its hint (299)
    # is taken: the call gives bucket 2 only (the completion's and the hint's).
    done, taken = store.complete_and_claim(
        job_id, 299, "w1", "last", Usage(1, 1), index_hint=299, lease_s=30, max_running=99
    )
    assert done and taken.index == 8


def test_a_retry_whose_failed_items_changed_after_it_read_them_asks_for_their_buckets(store):
    job_id = _bucketed_job(store, 300)
    for hint in (3, 250):
        c = claim(store, job_id, hint=hint)
        assert store.fail_item(job_id, c.index, "w1", ItemError("PermanentError", "no", 400))
    # What retry_failed does after reading the failed items, given an older read (none).
    assert call_job_script(store.lua.retry_failed, store.keys, job_id, [1000]) == 2
    assert [store.get_item(job_id, i).item.status for i in (3, 250)] == ["pending"] * 2


def test_a_job_lost_in_a_failover_while_it_is_created_is_one_line_about_redis(store, redis_url):
    """A failover promotes a replica the job's first write had not reached (replication is
    asynchronous): adding its items finds no job. Said as the backend's error, naming Redis and
    what to do, never an internal error."""
    job_id = begun_job(store, "jobgone0001")
    raw = redis.Redis.from_url(redis_url.split("?")[0])
    gone = list(raw.scan_iter(match=f"*{job_id}*", count=1000))  # what the replica never had
    assert gone and raw.delete(*gone) == len(gone)
    raw.close()
    with pytest.raises(BackendUnavailable) as caught:
        store.add_items(job_id, [ONE_ITEM])
    message = str(caught.value)
    assert "Redis at 127.0.0.1:" in message and "no longer has the job being created" in message
    assert "run create again" in message and "\n" not in message
