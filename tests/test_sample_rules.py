"""run --sample in the jobs API (Jobs.run), in this process on a real SQLite file: the sample is
chosen and recorded, kept by every run that does not give --sample (after a pause, a resume, a
worker's death) until its items have settled, and refused where it cannot be. Beside each case
its neighbour: a sample of one and of several, a job with no sample, a running, paused, not
started and batch job, a job with nothing pending and one whose rest waits on running items.
tests/test_sample.py holds the same end to end through the CLI and workers (processes, both
backends); this file is what `scripts/mutate sample` runs per mutant."""

from __future__ import annotations

import time

import pytest

from hermes_bulk.config.settings import load_settings
from hermes_bulk.errors import InvalidTransition, UsageError
from hermes_bulk.fleet import broker
from hermes_bulk.jobs.service import Jobs
from hermes_bulk.store.protocol import (
    AWAITING_RECOVERY,
    NOT_STARTED,
    PAUSE_SAMPLE,
    PAUSE_USER,
    PAUSED,
    RUNNING,
    Claim,
    ClaimRefused,
    ItemError,
    Usage,
    WorkerInfo,
    sample_done,
)

from .contract.test_store_contract import claim, make_job


@pytest.fixture
def jobs(tmp_path, monkeypatch):
    """The jobs API on a SQLite file of its own (no fixture of tests/conftest.py)."""
    for key in ("HERMES_BULK_BACKEND", "HERMES_BULK_MAX_CONCURRENCY", "HERMES_HOME"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    service = Jobs(load_settings(home=str(tmp_path / "home")))
    yield service
    broker.close_all()


def _last_event(jobs, job_id):
    return jobs.store.list_events(job_id)[-1]


def _live_worker(jobs, worker_id="w1"):
    """A worker the registry counts live (on another host: no lock file here to look at), so
    the items it holds are not returned when `run` recovers dead workers'."""
    now = time.time()
    info = WorkerInfo(worker_id, "another-host", 1, now, now, 1, "http")
    jobs.store.heartbeat_worker(info, ttl_s=600)


def _answer(jobs, job_id, index):
    assert jobs.store.complete_item(job_id, index, "w1", "answer", Usage(1, 1))


def test_a_sample_is_chosen_spread_over_the_pending_items_and_recorded(jobs):
    job_id = make_job(jobs.store, 20, state=NOT_STARTED)
    started = jobs.run(job_id, sample=5)
    assert started.state == RUNNING, "the job as it is now, not as it was read"
    assert started.sample == (0, 5, 10, 14, 19)
    event = _last_event(jobs, job_id)
    assert (event.kind, event.message) == (
        "run",
        "sampling 5 items spread over the job, then pausing",
    )
    taken = [claim(jobs.store, job_id, hint=3).index for _ in range(5)]
    assert taken == [0, 5, 10, 14, 19] and claim(jobs.store, job_id) == ClaimRefused("no_pending")


def test_a_sample_of_one_and_of_more_than_is_pending(jobs):
    one = make_job(jobs.store, 4, state=NOT_STARTED)
    assert jobs.run(one, sample=1).sample == (0,)
    assert _last_event(jobs, one).message == "sampling 1 item spread over the job, then pausing"
    every = make_job(jobs.store, 3, state=NOT_STARTED)
    assert jobs.run(every, sample=4).sample == (0, 1, 2)
    assert "sampling 3 items" in _last_event(jobs, every).message


def test_a_run_without_a_sample_processes_every_pending_item(jobs):
    job_id = make_job(jobs.store, 3, state=NOT_STARTED)
    started = jobs.run(job_id)
    assert (started.state, started.sample) == (RUNNING, None)
    assert _last_event(jobs, job_id).message == "processing pending items"
    assert claim(jobs.store, job_id, hint=2).index == 2, "no sample: the hint is taken"


def test_a_sample_survives_a_pause_and_the_run_after_it_and_ends_with_its_last_item(jobs):
    """The bug once planted from outside: the run after a pause forgot the sample."""
    job_id = make_job(jobs.store, 20, state=NOT_STARTED)
    jobs.run(job_id, sample=5)
    for _ in range(2):
        _answer(jobs, job_id, claim(jobs.store, job_id).index)
    jobs.pause(job_id)
    paused = jobs.store.get_job(job_id)
    assert (paused.state, paused.pause_reason, paused.sample) == (
        PAUSED,
        PAUSE_USER,
        (0, 5, 10, 14, 19),
    )
    again = jobs.run(job_id)
    assert (again.state, again.sample) == (RUNNING, (0, 5, 10, 14, 19))
    assert _last_event(jobs, job_id).message == ("continuing its sample of 5 items, then pausing")
    rest = [claim(jobs.store, job_id, hint=1) for _ in range(3)]
    assert [c.index for c in rest] == [10, 14, 19], "the sample's items only"
    for c in rest:
        _answer(jobs, job_id, c.index)
    assert claim(jobs.store, job_id) == ClaimRefused("sample_done")
    done = jobs.store.get_job(job_id)
    assert (done.state, done.pause_reason, done.sample) == (PAUSED, PAUSE_SAMPLE, None)
    assert _last_event(jobs, job_id).message == sample_done(5)
    resumed = jobs.resume(job_id)
    assert resumed.sample is None and claim(jobs.store, job_id, hint=1).index == 1, "the rest"


def test_a_sample_survives_a_workers_death_and_the_run_that_recovers_it(jobs):
    job_id = make_job(jobs.store, 10, state=NOT_STARTED)
    jobs.run(job_id, sample=2)
    held = claim(jobs.store, job_id, lease_s=0.0)  # a lease that has run out: a dead worker
    assert isinstance(held, Claim) and held.index == 0
    assert jobs.store.set_state(job_id, AWAITING_RECOVERY, from_states=[RUNNING])
    again = jobs.run(job_id)
    assert (again.state, again.sample, again.running) == (RUNNING, (0, 9), 0)
    assert [claim(jobs.store, job_id, hint=4).index for _ in range(2)] == [0, 9]


def test_a_new_sample_replaces_the_one_not_yet_done(jobs):
    job_id = make_job(jobs.store, 10, state=NOT_STARTED)
    jobs.run(job_id, sample=2)
    _answer(jobs, job_id, claim(jobs.store, job_id).index)
    jobs.pause(job_id)
    assert jobs.run(job_id, sample=3).sample == (1, 5, 9), "spread over what is still pending"


def test_a_sample_is_taken_of_a_paused_or_not_started_job_and_refused_while_it_runs(jobs):
    job_id = make_job(jobs.store, 4, state=NOT_STARTED)
    jobs.run(job_id)
    with pytest.raises(InvalidTransition) as refused:
        jobs.run(job_id, sample=2)
    assert str(refused.value) == (
        f"Job {job_id} is running; pause it first (hermes-bulk pause {job_id}), then run a sample."
    )
    assert jobs.store.get_job(job_id).sample is None, "a refused sample changed nothing"
    jobs.pause(job_id)
    assert jobs.run(job_id, sample=2).sample == (0, 3)


def test_a_sample_of_a_batch_job_is_refused(jobs):
    job_id = make_job(jobs.store, 4, state=NOT_STARTED, mode="batch")
    with pytest.raises(UsageError, match=r"^--sample is for live jobs: a batch job's items go"):
        jobs.run(job_id, sample=2)
    job = jobs.store.get_job(job_id)
    assert (job.state, job.sample) == (NOT_STARTED, None)


def test_a_sample_with_nothing_pending_says_why(jobs):
    # The rest waits on a running item: two duplicates of item 0 (the same answer key).
    _live_worker(jobs)
    waiting = make_job(jobs.store, 3, state=RUNNING, contents=["same"] * 3, answer_keys=["k"] * 3)
    assert claim(jobs.store, waiting).index == 0
    jobs.pause(waiting)
    with pytest.raises(InvalidTransition) as refused:
        jobs.run(waiting, sample=1)
    assert str(refused.value) == (
        f"Job {waiting} has no pending item to sample (the rest wait on items running now)."
    )
    # Nothing pending at all, the last item still running.
    running = make_job(jobs.store, 1, state=RUNNING)
    assert claim(jobs.store, running).index == 0
    jobs.pause(running)
    with pytest.raises(InvalidTransition) as refused:
        jobs.run(running, sample=1)
    assert str(refused.value) == f"Job {running} has no pending item to sample."
    assert jobs.store.get_job(running).state == PAUSED


def test_a_finished_job_has_nothing_to_run_and_says_what_failed(jobs):
    done = make_job(jobs.store, 1, state=RUNNING)
    _answer(jobs, done, claim(jobs.store, done).index)
    with pytest.raises(InvalidTransition) as refused:
        jobs.run(done, sample=1)
    assert str(refused.value) == f"Job {done} has no pending items."
    failed = make_job(jobs.store, 2, state=RUNNING)
    for _ in range(2):
        c = claim(jobs.store, failed)
        assert jobs.store.fail_item(failed, c.index, "w1", ItemError("PermanentError", "no"))
    with pytest.raises(InvalidTransition) as refused:
        jobs.run(failed)
    assert str(refused.value) == (
        f"Job {failed} has no pending items; 2 failed: run hermes-bulk retry {failed}"
    )


def test_the_store_keeps_no_sample_for_a_job_still_being_created(jobs):
    job_id = make_job(jobs.store, 3, state=NOT_STARTED)
    assert jobs.store.set_sample(job_id, [2, 0]) and jobs.store.get_job(job_id).sample == (0, 2)
    assert jobs.store.set_sample(job_id, []) and jobs.store.get_job(job_id).sample is None
    from hermes_bulk.store.protocol import JobSpec

    spec = JobSpec(
        job_id="creating0001",
        instruction="x",
        source="/s",
        source_kind="file",
        concurrency=1,
        retries=0,
    )
    jobs.store.begin_job(spec)
    assert not jobs.store.set_sample("creating0001", [0])
