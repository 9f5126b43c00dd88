"""The store at scale, on both backends: complete_and_claim (one step), contents and results stored
compressed and read back from either form, a completed file item's content dropped."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from hermes_bulk.store.compression import MAGIC, MIN_PACKED, pack, unpack
from hermes_bulk.store.protocol import (
    COMPLETED,
    FAILED,
    LEARN_AFTER,
    NOT_STARTED,
    PAUSE_TOKEN_LIMIT,
    PAUSED,
    RUNNING,
    Claim,
    ClaimRefused,
    ItemError,
    JobSpec,
    NewItem,
    Turn,
    Usage,
)
from hermes_bulk.store.redis import codec
from hermes_bulk.store.sqlite.jobs import SqliteJobStore

from .conftest import prefix_of
from .test_store_contract import backend, backend_url, claim, make_job, store  # noqa: F401 (fixtures)

LONG = "The quick brown fox jumps over the lazy dog, and then it rests. " * 40 + "Fin — é ✓"


def _job(store, contents, *, kind="directory", keys=True, **spec_kw) -> str:
    """A running job whose items have answer keys (as create gives them): equal contents wait on the
    first."""
    job_id = f"cc{abs(hash((tuple(contents), kind, str(spec_kw)))) % 10**10:010d}"
    spec = JobSpec(
        job_id=job_id,
        instruction="do it",
        source="/nowhere",
        source_kind=kind,
        concurrency=1000,
        retries=2,
        provider_key="p:test",
        **spec_kw,
    )
    store.begin_job(spec)
    store.add_items(
        job_id,
        [
            NewItem(
                i,
                f"item-{i}",
                c,
                f"h:{c[:20]}:{len(c)}",
                f"f{i}.txt",
                -1,
                "1:1",
                10,
                answer_key=f"{job_id}:{c[:20]}:{len(c)}" if keys else "",
            )
            for i, c in enumerate(contents)
        ],
    )
    store.finish_job(job_id)
    store.set_state(job_id, RUNNING, from_states=[NOT_STARTED])
    return job_id


def _stored(store, raw, url, job_id, kind, field):
    """What the backend holds for a content (by hash) or a result (by index), as bytes or text."""
    if isinstance(store, SqliteJobStore):
        if kind == "contents":
            rows = store.db.read(
                "SELECT text FROM contents WHERE job_id = ? AND hash = ?", (job_id, field)
            )
        else:
            rows = store.db.read(
                "SELECT text FROM results WHERE job_id = ? AND idx = ?", (job_id, field)
            )
        return rows[0][0] if rows else None
    return raw.hget(_redis_key(store, job_id, kind, field), _redis_field(kind, field))


def _overwrite(store, raw, url, job_id, kind, field, text):
    """Write a value as hermes-bulk stored it before compression: the plain text."""
    if isinstance(store, SqliteJobStore):
        with store.db.write() as conn:
            if kind == "contents":
                conn.execute(
                    "UPDATE contents SET text = ? WHERE job_id = ? AND hash = ?",
                    (text, job_id, field),
                )
            else:
                conn.execute(
                    "UPDATE results SET text = ? WHERE job_id = ? AND idx = ?",
                    (text, job_id, field),
                )
    else:
        raw.hset(
            _redis_key(store, job_id, kind, field), _redis_field(kind, field), text.encode("utf-8")
        )


def _redis_key(store, job_id, kind, field) -> str:
    """Contents: the job's hash by content hash; results: the bucket of the item's index
    (keys.py)."""
    return (
        store.keys.bucket(job_id, kind, field)
        if kind == "results"
        else store.keys.job_key(job_id, kind)
    )


def _redis_field(kind, field):
    """A content's field is its hash as codec.content_field stores it; a result's its index."""
    return codec.content_field(field) if kind == "contents" else field


@pytest.fixture
def raw_client(backend_url):
    """A plain Redis client on the Redis backend (None on SQLite)."""
    if backend_url.startswith("sqlite"):
        yield None
        return
    import redis

    client = redis.Redis.from_url(backend_url.split("?")[0])
    yield client
    client.close()


# complete_and_claim ---------------------------------------------------------------------------


def test_complete_and_claim_completes_then_claims_the_hint(store):
    job_id = make_job(store, 4, estimate=[10, 20, 30, 40])
    first = claim(store, job_id, worker="w1", hint=0)
    done, nxt = store.complete_and_claim(
        job_id,
        first.index,
        "w1",
        "r0",
        Usage(3, 4),
        provider="p",
        model="m",
        index_hint=2,
        lease_s=30.0,
        max_running=1000,
    )
    assert done is True and isinstance(nxt, Claim)
    assert (nxt.index, nxt.content, nxt.name) == (2, "content 2", "item-2")
    item = next(i for i in store.iter_items(job_id) if i.index == 0)
    assert (item.status, item.result, item.tokens_in, item.tokens_out, item.provider) == (
        COMPLETED,
        "r0",
        3,
        4,
        "p",
    )
    job = store.get_job(job_id)
    assert (job.completed, job.running, job.pending, job.tokens_charged, job.tokens_reserved) == (
        1,
        1,
        2,
        7,
        30,
    )
    assert nxt.job.completed == 1, "the claim saw the job after the completion"
    assert store.item_owners() == {"w1": 1}


def test_complete_and_claim_takes_the_next_turn_where_acquire_is_a_round_trip(backend):
    """take_turn: on Redis the claimed item's turn of an unpaced provider key comes with the
    claim, as acquire would give it right after (a wait while the key waits); SQLite, whose
    unpaced acquire is a read without a round trip, leaves it to acquire."""
    store, limits = backend.store, backend.limits
    on_redis = not isinstance(store, SqliteJobStore)
    job_id = make_job(store, 3)
    first = claim(store, job_id, worker="w1", hint=0)

    def complete_and_claim(index: int, hint: int):
        return store.complete_and_claim(
            job_id,
            index,
            "w1",
            f"r{index}",
            Usage(1, 1),
            index_hint=hint,
            lease_s=30.0,
            max_running=1000,
            take_turn="p:turns",
        )

    done, second = complete_and_claim(first.index, 1)
    assert done and isinstance(second, Claim) and second.index == 1
    assert second.turn == (Turn(0.0, 0) if on_redis else None)
    until = limits.pause("p:turns", seconds=30.0, base_s=5.0, cap_s=120.0, epoch=-1)
    done, third = complete_and_claim(second.index, 2)
    assert done and isinstance(third, Claim) and third.index == 2
    if on_redis:
        wait, epoch = third.turn
        assert 29.0 < wait <= 30.0 and epoch == 0, "the key's wait, as acquire gives it"
        assert abs(limits.acquire("p:turns", rpm=None, tpm=None, tokens=0).wait - wait) < 1.0
    else:
        assert third.turn is None
    assert limits.pause_state("p:turns").until == until, "a turn taken while waiting takes nothing"
    done, none_left = complete_and_claim(third.index, 0)
    assert done and none_left == ClaimRefused("no_pending")
    assert store.get_job(job_id).completed == 3


def test_complete_and_claim_by_a_stranger_changes_nothing_and_claims_nothing(store):
    job_id = make_job(store, 3)
    c = claim(store, job_id, worker="owner")
    before = store.get_job(job_id)
    assert store.complete_and_claim(
        job_id, c.index, "stranger", "x", Usage(), index_hint=1, lease_s=30.0, max_running=1000
    ) == (False, None)
    assert store.get_job(job_id) == before and store.item_owners() == {"owner": 1}


def test_complete_and_claim_refuses_the_claim_as_claim_item_would(store):
    job_id = make_job(store, 2)
    a, b = claim(store, job_id, hint=0), claim(store, job_id, hint=1)
    done, nxt = store.complete_and_claim(
        job_id, a.index, "w1", "r", Usage(1, 1), index_hint=1, lease_s=30.0, max_running=1000
    )
    assert done and nxt == ClaimRefused("no_pending")
    store.set_state(job_id, PAUSED, from_states=[RUNNING])
    assert store.complete_and_claim(
        job_id, b.index, "w1", "r", Usage(1, 1), index_hint=0, lease_s=30.0, max_running=1000
    ) == (True, ClaimRefused("not_running"))
    assert store.get_job(job_id).completed == 2


def test_complete_and_claim_pauses_at_the_token_limit_in_the_same_step(store):
    job_id = make_job(store, 3, estimate=10, max_tokens=25)
    c = claim(store, job_id)
    done, nxt = store.complete_and_claim(
        job_id, c.index, "w1", "r", Usage(10, 10), index_hint=1, lease_s=30.0, max_running=1000
    )
    assert done and nxt == ClaimRefused("token_limit")
    job = store.get_job(job_id)
    assert (job.state, job.pause_reason, job.tokens_charged, job.running) == (
        PAUSED,
        PAUSE_TOKEN_LIMIT,
        20,
        0,
    )


@pytest.mark.parametrize(
    ("outputs", "learned"),
    [
        ((0, 0, 0), 512),  # no output reported: nothing learned, the configured estimate stays
        ((100, 100, 100), 200),  # twice the mean output
        ((100, 100, 102), 202),  # rounded up: 2 * 302 / 3 = 201.3
        ((0, 0, 1), 1),  # one token of output is output reported: 2 * 1 / 3 rounded up
        ((1000, 1000, 1000), 900),  # capped at max_output_tokens
    ],
)
def test_the_learned_allowance_is_twice_the_mean_output_rounded_up(store, outputs, learned):
    """What estimates expect of an answer; a claim still reserves the stored worst case."""
    assert len(outputs) == LEARN_AFTER
    job_id = make_job(
        store, LEARN_AFTER + 1, estimate=600, output_tokens_estimate=512, max_output_tokens=900
    )
    for output in outputs:
        c = claim(store, job_id)
        store.complete_item(job_id, c.index, "w1", "r", Usage(50, output))
    claim(store, job_id)
    job = store.get_job(job_id)
    assert (job.output_allowance, job.tokens_reserved) == (learned, 600)


def test_threads_draining_a_job_by_complete_and_claim_complete_each_item_once(store):
    n, threads = 60, 6
    job_id = make_job(store, n, estimate=5)
    barrier = threading.Barrier(threads)
    completed: Counter = Counter()
    lock = threading.Lock()

    def chain(name: str) -> None:
        barrier.wait()
        c = claim(store, job_id, worker=name, hint=0)
        while isinstance(c, Claim):
            done, c2 = store.complete_and_claim(
                job_id,
                c.index,
                name,
                f"r{c.index}",
                Usage(1, 1),
                index_hint=c.index + 1,
                lease_s=30.0,
                max_running=1000,
            )
            assert done
            with lock:
                completed[c.index] += 1
            c = c2

    workers = [threading.Thread(target=chain, args=(f"w{i}",)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert completed == Counter(range(n)), "every item completed exactly once"
    job = store.get_job(job_id)
    assert (job.completed, job.running, job.pending, job.tokens_reserved, job.tokens_charged) == (
        n,
        0,
        0,
        0,
        2 * n,
    )
    assert [i.result for i in store.iter_items(job_id)] == [f"r{i}" for i in range(n)]


# Stored compressed, read from either form
# -----------------------------------------------------------


def test_contents_and_results_are_stored_compressed_and_read_back_whole(
    store,
    raw_client,
    backend_url,
):
    job_id = _job(store, [LONG, "short"], kind="jsonl")
    c = claim(store, job_id, hint=0)
    assert c.content == LONG
    stored = _stored(store, raw_client, backend_url, job_id, "contents", c.content_hash)
    assert bytes(stored[:4]) == MAGIC and len(stored) < len(LONG.encode()) // 4
    assert store.complete_item(job_id, c.index, "w1", LONG + " answer", Usage(1, 1))
    result = _stored(store, raw_client, backend_url, job_id, "results", 0)
    assert bytes(result[:4]) == MAGIC
    assert next(store.iter_items(job_id)).result == LONG + " answer"
    assert store.get_item(job_id, 0).content == LONG, (
        "a CSV/JSON input is kept (export --with-input)"
    )
    assert next(store.iter_items(job_id, with_content=True)).content == LONG
    short = claim(store, job_id, hint=1)
    assert short.content == "short"
    assert _stored(store, raw_client, backend_url, job_id, "contents", short.content_hash) in (
        "short",
        b"short",
    )


def test_values_stored_before_compression_read_as_they_were(store, raw_client, backend_url):
    job_id = _job(store, [LONG, LONG + "2"], kind="jsonl")
    c = claim(store, job_id, hint=0)
    store.complete_item(job_id, c.index, "w1", "x" * 200, Usage(1, 1))
    _overwrite(store, raw_client, backend_url, job_id, "results", 0, "an old plain result ✓" * 10)
    other = store.get_item(job_id, 1).content_hash
    _overwrite(
        store, raw_client, backend_url, job_id, "contents", other, "an old plain content ✓" * 10
    )
    assert next(store.iter_items(job_id)).result == "an old plain result ✓" * 10
    assert store.get_item(job_id, 1).content == "an old plain content ✓" * 10
    assert claim(store, job_id, hint=1).content == "an old plain content ✓" * 10


@pytest.mark.parametrize(
    "text", ["", "a", "x" * (MIN_PACKED - 1), "(\u00b5 not a frame", LONG, "\x00" + LONG]
)
def test_pack_and_unpack_give_back_any_text(text):
    packed = pack(text)
    assert unpack(packed) == text
    assert unpack(text.encode("utf-8")) == text, "a value stored as plain UTF-8 reads as itself"
    assert isinstance(packed, str) or len(packed) < len(text.encode("utf-8"))


# A completed item's content is dropped --------------------------------------------------------


def test_a_completed_file_items_content_is_dropped_and_its_hash_kept(
    store,
    raw_client,
    backend_url,
):
    job_id = _job(store, [LONG, LONG, "third one"])  # item 1 waits on item 0 (same answer key)
    c = claim(store, job_id, hint=0)
    assert c.index == 0 and claim(store, job_id, hint=1).index == 2, (
        "the duplicate is never claimed"
    )
    assert store.complete_item(job_id, 0, "w1", "answer", Usage(1, 1))
    for index in (0, 1):
        detail = store.get_item(job_id, index)
        assert (detail.item.status, detail.item.result, detail.content) == (
            COMPLETED,
            "answer",
            None,
        )
        assert detail.content_hash == c.content_hash
    assert _stored(store, raw_client, backend_url, job_id, "contents", c.content_hash) is None


def test_an_items_duplicates_settle_with_it_counted_and_charged_nothing(store):
    job_id = _job(
        store, ["same", "same", "same", "once", "twice", "twice"]
    )  # 1, 2 wait on 0; 5 on 4
    done, failed = claim(store, job_id, hint=0), claim(store, job_id, hint=4)
    assert (done.index, failed.index) == (0, 4)
    assert store.complete_item(job_id, 0, "w1", "answer", Usage(3, 4), provider="prov", model="mod")
    assert store.fail_item(job_id, 4, "w1", ItemError("ModelError", "no", 400))
    job = store.get_job(job_id)
    assert (job.completed, job.failed, job.pending, job.running) == (3, 2, 1, 0)
    assert (job.tokens_charged, job.tokens_in, job.tokens_out) == (7, 3, 4), (
        "a duplicate is charged nothing"
    )
    for index in (1, 2):
        item = store.get_item(job_id, index).item
        assert (item.status, item.result, item.provider, item.model) == (
            COMPLETED,
            "answer",
            "prov",
            "mod",
        )
        assert (item.tokens_in, item.tokens_out) == (0, 0)
    assert store.get_item(job_id, 5).item.status == FAILED
    assert claim(store, job_id).index == 3, "only the item of its own content is left"
    assert claim(store, job_id) == ClaimRefused("no_pending")


def test_a_failed_items_content_is_kept_for_retry(store):
    job_id = _job(store, [LONG, "other"])
    c = claim(store, job_id, hint=0)
    assert store.fail_item(job_id, c.index, "w1", ItemError("PermanentError", "no"))
    assert store.get_item(job_id, 0).content == LONG
    assert store.retry_failed(job_id) == 1
    assert claim(store, job_id, hint=0).content == LONG


@pytest.mark.parametrize("kind, keys", [("jsonl", True), ("csv", True), ("directory", False)])
def test_content_is_kept_where_something_may_read_it_again(store, kind, keys):
    """A row or record (export --with-input writes it back); an item without an answer key (others
    may share its content)."""
    job_id = _job(store, [LONG, LONG], kind=kind, keys=keys)
    c = claim(store, job_id, hint=0)
    store.complete_item(job_id, c.index, "w1", "answer", Usage(1, 1))
    assert store.get_item(job_id, 0).content == LONG
    if not keys:
        assert claim(store, job_id, hint=1).content == LONG, (
            "the other item with that content still gets it"
        )


def test_complete_and_claim_drops_the_content_too(store):
    job_id = _job(store, [LONG, LONG + " b"])
    c = claim(store, job_id, hint=0)
    done, nxt = store.complete_and_claim(
        job_id, c.index, "w1", "a", Usage(1, 1), index_hint=1, lease_s=30.0, max_running=1000
    )
    assert done and nxt.content == LONG + " b"
    assert store.get_item(job_id, 0).content is None


def test_a_redis_job_begun_before_the_plain_output_fields_reserves_the_same(redis_url):
    """claim_item.lua reads output_tokens_estimate and max_output_tokens (the output bound that
    splits a reservation's cost) from META; a job begun before they were written there falls
    back to its spec, with the same reservation."""
    import redis

    from hermes_bulk.fleet import broker
    from hermes_bulk.store.protocol import reserved_cost

    price = {"input": 1.0, "output": 4.0, "cached_input": 0.5, "source": "test"}
    b = broker.build_backend(redis_url)
    raw = redis.Redis.from_url(redis_url.split("?")[0])
    try:
        jobs = [
            make_job(b.store, 1, estimate=600, max_output_tokens=150, max_cost=10**9, price=price)
            for _ in range(2)
        ]
        raw.hdel(
            f"{{{prefix_of(redis_url)}:job:{jobs[1]}}}:meta",
            "output_tokens_estimate",
            "max_output_tokens",
        )
        for job_id in jobs:
            claim(b.store, job_id)
            job = b.store.get_job(job_id)
            assert (job.tokens_reserved, job.cost_reserved) == (
                600,
                reserved_cost(600, 150, 1.0, 4.0),
            )
    finally:
        raw.close()
        b.close()
