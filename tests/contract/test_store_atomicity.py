"""What a process that dies in the middle of a store operation leaves (store/protocol.py).

Each method's docstring says whether it is one step on each backend or several, and what an
interruption between steps leaves and what repairs it. These tests interrupt operations at
those points and check the repair: counts add up, nothing is lost, nothing is stuck.

How a death is simulated:
- Redis, inside a round trip: `killed_while_sending` lets the next pipeline send only its
  first commands and then drops the connection, as a process killed mid-write does (Redis
  runs what arrived; a MULTI without its EXEC is discarded).
- Redis, between round trips: the second step raises. A real kill cannot be timed between
  two round trips, and a raising step leaves the same state: the first step done, no later.
- SQLite: the process is really killed (SIGKILL) between two statements of one transaction.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from contextlib import contextmanager, suppress

import pytest
import redis
from redis.connection import AbstractConnection

from hermes_bulk.errors import BackendUnavailable
from hermes_bulk.fleet import broker
from hermes_bulk.store.protocol import (
    COMPLETED,
    FAILED,
    NOT_STARTED,
    PAUSED,
    PENDING,
    RUNNING,
    Claim,
    ItemError,
    JobSpec,
    NewItem,
    Usage,
)
from hermes_bulk.store.redis import job_state as redis_job_state
from hermes_bulk.store.sqlite.database import SqliteDatabase

from .conftest import prefix_of
from .test_store_contract import claim, make_job

EXPIRED_S = -60.0  # a lease renewed to this has run out (as in test_store_stateful.py)


@pytest.fixture
def redis_backend(redis_url):
    b = broker.build_backend(redis_url)
    yield b
    b.close()


@pytest.fixture
def rstore(redis_backend):
    return redis_backend.store


def assert_counts_add_up(store, job_id: str) -> None:
    """The job's counters are what its items say (invariant 3: nothing lost, nothing twice)."""
    job = store.get_job(job_id)
    items = list(store.iter_items(job_id))
    by_status = {
        s: sum(i.status == s for i in items) for s in (PENDING, "running", COMPLETED, FAILED)
    }
    assert (job.pending, job.running, job.completed, job.failed) == (
        by_status[PENDING],
        by_status["running"],
        by_status[COMPLETED],
        by_status[FAILED],
    )
    assert job.pending + job.running + job.completed + job.failed == job.total == len(items)


@contextmanager
def killed_while_sending(monkeypatch, *, after: int, pipeline: int = 0):
    """Pipeline number `pipeline` (0 = the next) sends only its first `after` commands (MULTI
    counts as one), waits for Redis to take them, then its connection drops as if the process
    had been killed; the call raises BackendUnavailable."""
    original = AbstractConnection.pack_commands
    seen = [0]

    def pack_commands(self, commands):
        commands = list(commands)
        seen[0] += 1
        if seen[0] - 1 != pipeline:
            return original(self, commands)
        sent = commands[:after]
        if sent:
            self.send_packed_command(original(self, sent))
            for _ in sent:
                with suppress(redis.ResponseError):
                    self.read_response()
        self.disconnect()
        raise redis.ConnectionError("killed while sending")

    monkeypatch.setattr(AbstractConnection, "pack_commands", pack_commands)
    try:
        yield
    finally:
        monkeypatch.setattr(AbstractConnection, "pack_commands", original)


def new_spec(job_id: str) -> JobSpec:
    return JobSpec(
        job_id=job_id, instruction="x", source="/s", source_kind="file", concurrency=4, retries=1
    )


def job_keys_and_entries(raw, prefix: str, job_id: str) -> list[str]:
    keys = [k for k in raw.scan_iter(match=f"{{{prefix}:job:{job_id}}}*")]
    entries = [
        index
        for index in ("created", "ids", "active")
        if raw.zscore(f"{prefix}:jobs:{index}", job_id) is not None
    ]
    return sorted(keys) + entries


# Redis: operations made one step ---------------------------------------------------------------


@pytest.mark.parametrize(
    "after", [1, 2, 3, 4]
)  # MULTI, ZADD created, ZADD ids, EVALSHA; never EXEC
def test_a_begin_job_cut_off_while_sending_leaves_nothing(
    rstore, raw, redis_url, monkeypatch, after
):
    prefix = prefix_of(redis_url)
    with killed_while_sending(monkeypatch, after=after), pytest.raises(BackendUnavailable):
        rstore.begin_job(new_spec("cut-begin"))
    assert job_keys_and_entries(raw, prefix, "cut-begin") == [], "no index entry without its job"
    # The caller's retry starts from nothing.
    rstore.begin_job(new_spec("cut-begin"))
    assert rstore.delete_job("cut-begin") is True


@pytest.mark.parametrize("after", [1, 2, 3, 4, 5])  # MULTI, EVALSHA, three ZREMs; never EXEC
def test_a_delete_job_cut_off_while_sending_leaves_the_whole_job(
    rstore, raw, redis_url, monkeypatch, after
):
    prefix = prefix_of(redis_url)
    job_id = make_job(rstore, 3)
    before = job_keys_and_entries(raw, prefix, job_id)
    with killed_while_sending(monkeypatch, after=after), pytest.raises(BackendUnavailable):
        rstore.delete_job(job_id)
    assert job_keys_and_entries(raw, prefix, job_id) == before, "keys and index entries go together"
    assert rstore.get_job(job_id) is not None and rstore.active_job_ids() == [job_id]
    assert rstore.delete_job(job_id) is True
    assert job_keys_and_entries(raw, prefix, job_id) == []


@pytest.mark.parametrize("after", [1, 2, 3])  # MULTI, ZADD active NX, EVALSHA; never EXEC
def test_a_run_cut_off_while_sending_changes_nothing(rstore, raw, redis_url, monkeypatch, after):
    job_id = make_job(rstore, 2, state=NOT_STARTED)
    with killed_while_sending(monkeypatch, after=after), pytest.raises(BackendUnavailable):
        rstore.set_state(job_id, RUNNING, from_states=[NOT_STARTED])
    assert rstore.get_job(job_id).state == NOT_STARTED
    assert raw.zscore(f"{prefix_of(redis_url)}:jobs:active", job_id) is None


# Redis: set_state(RUNNING), two round trips ----------------------------------------------------


def test_a_run_whose_epoch_was_never_written_stays_listed_while_it_runs(
    rstore, raw, redis_url, monkeypatch
):
    # Given a job run, paused, pruned and run again by a process that dies after the move
    active = f"{prefix_of(redis_url)}:jobs:active"
    job_id = make_job(rstore, 2)
    rstore.set_state(job_id, PAUSED, from_states=[RUNNING], pause_reason="user")
    rstore.release_expired_leases()
    assert raw.zscore(active, job_id) is None
    monkeypatch.setattr(
        rstore,
        "_raise_active_epoch",
        lambda *a: (_ for _ in ()).throw(BackendUnavailable("killed")),
    )
    with pytest.raises(BackendUnavailable):
        rstore.set_state(job_id, RUNNING, from_states=[PAUSED])
    monkeypatch.undo()
    # Then the job is running and listed (score 0 from the move itself) ...
    assert rstore.get_job(job_id).state == RUNNING
    assert raw.zscore(active, job_id) == 0
    # ... and reaper passes keep it there, so workers keep looking after it
    rstore.release_expired_leases()
    rstore.release_expired_leases()
    assert rstore.active_job_ids() == [job_id]
    c = claim(rstore, job_id)
    assert isinstance(c, Claim)
    assert rstore.complete_item(job_id, c.index, "w1", "r", Usage(1, 1))


def test_a_prune_arriving_between_a_run_and_its_epoch_is_repaired_by_running_again(
    rstore, raw, redis_url, monkeypatch
):
    # Given a reaper that saw the paused job idle at its epoch ...
    active = f"{prefix_of(redis_url)}:jobs:active"
    job_id = make_job(rstore, 2)
    rstore.set_state(job_id, PAUSED, from_states=[RUNNING], pause_reason="user")
    seen_epoch = int(raw.zscore(active, job_id))
    # ... a run by a process that dies before writing the new epoch ...
    monkeypatch.setattr(
        rstore,
        "_raise_active_epoch",
        lambda *a: (_ for _ in ()).throw(BackendUnavailable("killed")),
    )
    with pytest.raises(BackendUnavailable):
        rstore.set_state(job_id, RUNNING, from_states=[PAUSED])
    monkeypatch.undo()
    # ... and that reaper's prune arriving just then (the documented window)
    assert rstore.lua.prune_active(keys=[active], args=[job_id, seen_epoch]) == 1
    assert rstore.active_job_ids() == []
    # When the user runs the job again (jobs.run accepts a running job)
    assert rstore.set_state(job_id, RUNNING, from_states=[NOT_STARTED, RUNNING, PAUSED]) is not None
    # Then it is listed again, past any prune decided before
    assert rstore.active_job_ids() == [job_id]
    assert rstore.lua.prune_active(keys=[active], args=[job_id, seen_epoch]) == 0


# Redis: retry_failed, one script per RETRY_BATCH_ITEMS -----------------------------------------


def fail_all(store, job_id: str, n: int) -> None:
    for _ in range(n):
        c = claim(store, job_id)
        assert store.fail_item(job_id, c.index, "w1", ItemError("PermanentError", "no", 400))


def test_a_retry_cut_off_between_batches_adds_up_and_the_next_retry_moves_the_rest(
    rstore, monkeypatch
):
    monkeypatch.setattr(redis_job_state, "RETRY_BATCH_ITEMS", 2)
    job_id = make_job(rstore, 5)
    fail_all(rstore, job_id, 5)
    real, calls = rstore.lua.retry_failed, []

    def dies_on_second_batch(**kw):
        calls.append(kw)
        if len(calls) == 2:
            raise BackendUnavailable("killed")
        return real(**kw)

    monkeypatch.setattr(rstore.lua, "retry_failed", dies_on_second_batch)
    with pytest.raises(BackendUnavailable):
        rstore.retry_failed(job_id)
    monkeypatch.setattr(rstore.lua, "retry_failed", real)
    job = rstore.get_job(job_id)
    assert (job.pending, job.failed) == (2, 3), "one batch moved, whole"
    assert_counts_add_up(rstore, job_id)
    assert rstore.retry_failed(job_id) == 3
    assert (rstore.get_job(job_id).pending, rstore.get_job(job_id).failed) == (5, 0)
    assert_counts_add_up(rstore, job_id)


# Redis: release operations, one script per job in one pipeline --------------------------------


def three_jobs_each_holding_an_expired_item(store) -> list[str]:
    jobs = [make_job(store, 2) for _ in range(3)]
    for job_id in jobs:
        c = claim(store, job_id, worker="dead")
        assert store.renew_leases("dead", [(job_id, c.index)], lease_s=EXPIRED_S) == 1
    return jobs


@pytest.mark.parametrize("operation", ["release_expired_leases", "release_worker_items"])
def test_a_release_cut_off_after_one_job_adds_up_and_the_next_pass_releases_the_rest(
    rstore, monkeypatch, operation
):
    jobs = three_jobs_each_holding_an_expired_item(rstore)
    release = (
        rstore.release_expired_leases
        if operation == "release_expired_leases"
        else lambda: rstore.release_worker_items("dead")
    )
    # The first pipeline's scripts ask for the expired items' buckets, the second releases.
    with (
        killed_while_sending(monkeypatch, after=1, pipeline=1),
        pytest.raises(BackendUnavailable),
    ):
        release()
    assert sorted(rstore.get_job(j).running for j in jobs) == [0, 1, 1], "one job released, whole"
    for job_id in jobs:
        assert_counts_add_up(rstore, job_id)
        assert rstore.get_job(job_id).tokens_reserved == 10 * rstore.get_job(job_id).running
    assert sum(release().values()) == 2
    for job_id in jobs:
        assert_counts_add_up(rstore, job_id)
        job = rstore.get_job(job_id)
        assert (job.pending, job.running, job.tokens_reserved) == (2, 0, 0)


def test_a_reaper_cut_off_before_its_prune_leaves_entries_the_next_pass_prunes(
    rstore, raw, redis_url, monkeypatch
):
    active = f"{prefix_of(redis_url)}:jobs:active"
    jobs = [make_job(rstore, 1) for _ in range(2)]
    for job_id in jobs:
        rstore.set_state(job_id, PAUSED, from_states=[RUNNING], pause_reason="user")
    # The second pipeline of the pass is the prune: it never arrives.
    with killed_while_sending(monkeypatch, after=0, pipeline=1), pytest.raises(BackendUnavailable):
        rstore.release_expired_leases()
    assert all(raw.zscore(active, j) is not None for j in jobs), (
        "stale entries: a superset, still safe"
    )
    assert rstore.active_job_ids() == []
    rstore.release_expired_leases()
    assert all(raw.zscore(active, j) is None for j in jobs)


# SQLite: every operation is one transaction; a process killed inside one leaves nothing --------


def _killed_at_statement(url: str, n: int, operation: str, job_id: str) -> None:
    """In a child: run the store operation and SIGKILL this process at its n-th statement."""
    b = broker.build_backend(url)
    original = SqliteDatabase.write

    class Killing:
        def __init__(self, conn):
            self.conn, self.count = conn, 0

        def execute(self, *args):
            self.count += 1
            if self.count == n:
                os.kill(os.getpid(), signal.SIGKILL)
            return self.conn.execute(*args)

        def __getattr__(self, name):
            return getattr(self.conn, name)

    @contextmanager
    def write(self):
        with original(self) as conn:
            yield Killing(conn)

    SqliteDatabase.write = write
    if operation == "release_worker_items":
        b.store.release_worker_items("dead")
    elif operation == "settle_failed_attempt":
        b.store.settle_failed_attempt(job_id, 0, "w1", ItemError("TransientError", "x"), retries=2)
    else:
        getattr(b.store, operation)(job_id)
    os._exit(0)  # not reached: the statement above kills the process


def _kill_in_child(url: str, n: int, operation: str, job_id: str = "") -> int:
    ctx = multiprocessing.get_context("fork")
    p = ctx.Process(target=_killed_at_statement, args=(url, n, operation, job_id))
    p.start()
    p.join(30)
    return p.exitcode


@pytest.fixture
def sqlite_backend(tmp_path):
    b = broker.build_backend(f"sqlite:///{tmp_path / 'bulk.db'}")
    yield b
    b.close()


def test_sqlite_retry_killed_between_its_statements_leaves_every_item_failed(sqlite_backend):
    store = sqlite_backend.store
    job_id = make_job(store, 4)
    fail_all(store, job_id, 4)
    # Statement 2 of retry_failed is the counters' UPDATE, after the items' UPDATE.
    assert _kill_in_child(sqlite_backend.url, 2, "retry_failed", job_id) == -signal.SIGKILL
    job = store.get_job(job_id)
    assert (job.pending, job.failed) == (0, 4)
    assert_counts_add_up(store, job_id)
    assert store.retry_failed(job_id) == 4
    assert_counts_add_up(store, job_id)


@pytest.mark.parametrize("n", [2, 3])  # after the items' UPDATE; after the counters' UPDATE
def test_sqlite_release_killed_between_its_statements_leaves_the_items_held(sqlite_backend, n):
    store = sqlite_backend.store
    jobs = three_jobs_each_holding_an_expired_item(store)
    assert _kill_in_child(sqlite_backend.url, n, "release_worker_items") == -signal.SIGKILL
    for job_id in jobs:
        assert store.get_job(job_id).running == 1
        assert_counts_add_up(store, job_id)
    assert store.release_worker_items("dead") == {j: 1 for j in jobs}
    for job_id in jobs:
        assert_counts_add_up(store, job_id)


def test_sqlite_settle_failed_attempt_killed_after_counting_counts_nothing(sqlite_backend):
    """Killed after the attempt's UPDATE, before the release: the transaction rolls back, so
    the attempt is counted once when the failure is settled again (a batch line)."""
    store = sqlite_backend.store
    job_id = make_job(store, 1)
    claim(store, job_id)
    # Statement 2 is the release's UPDATE (the attempt's UPDATE is 1; its event, an executemany).
    assert _kill_in_child(sqlite_backend.url, 2, "settle_failed_attempt", job_id) == -signal.SIGKILL
    item = store.get_item(job_id, 0).item
    assert (item.status, item.attempts) == ("running", 0)
    assert (
        store.settle_failed_attempt(job_id, 0, "w1", ItemError("TransientError", "x"), retries=2)
        == 1
    )
    assert store.get_item(job_id, 0).item.attempts == 1
    assert_counts_add_up(store, job_id)


def test_sqlite_delete_killed_between_its_statements_leaves_the_whole_job(sqlite_backend):
    store = sqlite_backend.store
    job_id = make_job(store, 3)
    assert _kill_in_child(sqlite_backend.url, 3, "delete_job", job_id) == -signal.SIGKILL
    assert store.get_job(job_id) is not None
    assert len(list(store.iter_items(job_id))) == 3
    assert_counts_add_up(store, job_id)
    assert store.delete_job(job_id) is True


# A create interrupted between calls ------------------------------------------------------------


@pytest.mark.parametrize("backend_name", ["sqlite", "redis"])
def test_a_create_interrupted_after_begin_leaves_an_invisible_job_that_delete_removes(
    backend_name, tmp_path, request
):
    url = (
        f"sqlite:///{tmp_path / 'bulk.db'}"
        if backend_name == "sqlite"
        else request.getfixturevalue("redis_url")
    )
    b = broker.build_backend(url)
    try:
        store = b.store
        store.begin_job(new_spec("half-made"))
        store.add_items("half-made", [NewItem(0, "a", "abc", "b2:1", "", -1, "1:1", 7)])
        # (the creating process dies here, before finish_job)
        assert (
            store.get_job("half-made") is None
            and store.list_jobs() == []
            and store.find_job_ids("half") == []
        )
        assert store.delete_job("half-made") is True
        assert list(store.iter_items("half-made")) == []
    finally:
        b.close()
