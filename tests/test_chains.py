"""A worker thread keeps claiming the next item of its job (a chain); it hands its turn back
through the queue only when another trigger is waiting for the threads.

Three things are held here, on both backends, with real workers, store and loopback provider:
- jobs that share the threads take turns: a job run while another one holds every thread
  starts within a slice, not after the first one ends;
- workers share a job: one that joins while another holds the job's whole concurrency gets
  its share within a few slices;
- with one worker and nothing else waiting, the steady state is one store operation an item:
  every item but the first of a chain is claimed by the completion of the one before it, and
  no trigger goes back through the queue, however many slices pass.
"""

from __future__ import annotations

import json

import pytest

from hermes_bulk.config.settings import load_settings
from hermes_bulk.fleet import broker
from hermes_bulk.jobs.request import JobRequest
from hermes_bulk.jobs.service import Jobs
from hermes_bulk.runtime import worker
from hermes_bulk.runtime.worker import WorkerRuntime
from hermes_bulk.store.protocol import Claim

from .helpers import wait_for


@pytest.fixture(params=["sqlite", "redis"])
def settings_on(request, env, monkeypatch):
    if request.param == "redis":
        monkeypatch.setenv("HERMES_BULK_BACKEND", request.getfixturevalue("redis_url"))
    yield load_settings()
    broker.close_all()


def _job(jobs: Jobs, tmp_path, name: str, n: int) -> str:
    src = tmp_path / f"{name}.jsonl"
    src.write_text("".join(json.dumps({"job": name, "n": i}) + "\n" for i in range(n)))
    return jobs.create(JobRequest(instruction="Answer", over=str(src), concurrency=1)).job.job_id


def _started(jobs: Jobs, threads: int) -> WorkerRuntime:
    runtime = WorkerRuntime(jobs.backend, jobs.settings, threads=threads)
    runtime.start()
    runtime.start_embedded_consumer()
    return runtime


def test_a_job_run_while_another_holds_the_only_thread_gets_its_turn_within_a_slice(
    settings_on, fake_provider, tmp_path, monkeypatch
):
    monkeypatch.setattr(worker, "CHAIN_SLICE_S", 0.2)
    fake_provider.configure(latency_s=0.02)
    jobs = Jobs(settings_on)
    first, second = _job(jobs, tmp_path, "first", 150), _job(jobs, tmp_path, "second", 3)
    jobs.run(first)
    runtime = _started(jobs, threads=1)
    try:
        wait_for(
            lambda: jobs.status(first).job.completed >= 5,
            timeout=30,
            message="the first job under way",
        )
        jobs.run(second)
        wait_for(
            lambda: jobs.status(second).state == "completed", timeout=30, message="the second job"
        )
        left = jobs.status(first).job
        assert left.pending > 0, (
            "the second job waited until the first had finished: no turns were taken"
        )
        wait_for(
            lambda: jobs.status(first).state == "completed", timeout=60, message="the first job"
        )
    finally:
        runtime.stop()


def test_a_worker_that_joins_a_running_job_gets_a_share_of_it(
    settings_on, fake_provider, tmp_path, monkeypatch
):
    """The first worker has threads for the job's whole concurrency; a second one started
    later must not sit idle until the job ends (a fleet scales out by adding workers)."""
    monkeypatch.setattr(worker, "CHAIN_SLICE_S", 0.2)
    fake_provider.configure(latency_s=0.02)
    jobs = Jobs(settings_on)
    src = tmp_path / "many.jsonl"
    src.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(400)))
    job_id = jobs.create(JobRequest(instruction="Answer", over=str(src), concurrency=2)).job.job_id
    jobs.run(job_id)
    first = _started(jobs, threads=2)
    second = None
    try:
        wait_for(
            lambda: jobs.status(job_id).job.completed >= 5,
            timeout=30,
            message="the first worker under way",
        )
        second = _started(jobs, threads=2)
        wait_for(
            lambda: second.processor.counters.snapshot()["items_completed"] >= 3,
            timeout=30,
            message="the second worker's share",
        )
        assert jobs.status(job_id).job.pending > 0, "it got its share while the job ran"
    finally:
        for runtime in (second, first):
            if runtime is not None:
                runtime.stop()


def test_with_nothing_else_waiting_a_chain_claims_every_next_item_with_the_completion(
    settings_on, fake_provider, tmp_path, monkeypatch
):
    monkeypatch.setattr(worker, "CHAIN_SLICE_S", 0.05)  # many slices pass in this job
    fake_provider.configure(latency_s=0.01)
    jobs = Jobs(settings_on)
    job_id = _job(jobs, tmp_path, "only", 40)
    store = jobs.backend.store
    calls = {"claim_item": 0, "complete_item": 0, "complete_and_claim": 0}
    for name in calls:
        real = getattr(store, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            out = _real(*args, **kwargs)
            took = out[1] if _name == "complete_and_claim" else out
            calls[_name] += _name != "claim_item" or isinstance(took, Claim)
            return out

        monkeypatch.setattr(store, name, counted)
    enqueued = []
    real_trigger = jobs.backend.trigger
    monkeypatch.setattr(
        jobs.backend, "trigger", lambda *a, **k: (enqueued.append(a), real_trigger(*a, **k))[1]
    )
    jobs.run(job_id)
    runtime = _started(jobs, threads=1)
    try:
        wait_for(lambda: jobs.status(job_id).state == "completed", timeout=60, message="the job")
    finally:
        runtime.stop()
    assert jobs.status(job_id).job.completed == 40
    assert calls["claim_item"] == 1, f"only the chain's first item is claimed on its own: {calls}"
    assert calls["complete_and_claim"] == 40 and calls["complete_item"] == 0, calls
    # The triggers sent are the starts (run's, and the pump's if it saw no claim yet); a chain
    # handing its thread back would send one with the next item's index.
    assert [hint for _job_id, hint, *_ in enqueued] == [0] * len(enqueued), enqueued


@pytest.mark.parametrize("items", [1, 2])
def test_a_worker_stopping_as_a_chain_completes_leaves_the_chain_queued_only_if_it_has_more(
    settings_on, fake_provider, tmp_path, monkeypatch, items
):
    """The stop arrives just as the chain's completion returns (its next claim made or refused):
    with an item claimed next, the chain goes back on the queue at that item; with nothing left
    to claim, the chain has ended and nothing is queued for it."""
    jobs = Jobs(settings_on)
    job_id = _job(jobs, tmp_path, f"stop{items}", items)
    jobs.run(job_id)
    runtime = WorkerRuntime(jobs.backend, jobs.settings, threads=1)
    real_handle = runtime.processor.handle

    def handle_then_stop(*args, **kwargs):
        outcome = real_handle(*args, **kwargs)
        runtime.stop()
        return outcome

    monkeypatch.setattr(runtime.processor, "handle", handle_then_stop)
    sent = []
    monkeypatch.setattr(jobs.backend, "trigger", lambda *args, **kwargs: sent.append(args))
    assert runtime.handle_trigger(job_id, 0) is None
    assert jobs.status(job_id).job.completed == 1
    chain_triggers = [args for args in sent if len(args) == 2]  # the chain's (job, next index)
    assert chain_triggers == ([(job_id, 1)] if items == 2 else []), sent
