"""A trigger whose item must wait for the job's token reservations to settle comes back later.

Under --max-tokens the store refuses such a claim with tokens_in_flight (the job keeps
running); the worker's chain must then be retried, not end as it does when nothing is left.
"""

from __future__ import annotations

from hermes_bulk.jobs.request import JobRequest
from hermes_bulk.jobs.service import Jobs
from hermes_bulk.runtime.pipeline import TOKENS_IN_FLIGHT_RETRY_S
from hermes_bulk.runtime.worker import WorkerRuntime
from hermes_bulk.store.protocol import RUNNING, Claim, Usage


def test_a_trigger_waiting_on_reservations_in_flight_is_retried_then_runs_its_item(
    settings, fake_provider, tmp_path
):
    src = tmp_path / "rows.jsonl"
    src.write_text('{"n": 1}\n{"n": 2}\n{"n": 3}\n')
    jobs = Jobs(settings)
    plan = jobs.create(
        JobRequest(instruction="Do", over=str(src), max_output_tokens=100), dry_run=True
    )
    per_item = plan.worst_tokens / 3  # what each claim reserves: its worst case
    limit = int(2.5 * per_item)
    job = jobs.create(
        JobRequest(
            instruction="Do", over=str(src), concurrency=3, max_tokens=limit, max_output_tokens=100
        )
    ).job
    assert 2 * per_item <= limit < 3 * per_item, "two reservations fit, a third does not"
    jobs.run(job.job_id)
    store = jobs.backend.store
    elsewhere = [
        store.claim_item(job.job_id, i, "elsewhere", lease_s=60, max_running=16) for i in (0, 1)
    ]
    assert all(isinstance(c, Claim) for c in elsewhere)

    runtime = WorkerRuntime(jobs.backend, settings, threads=1)
    try:
        assert runtime.handle_trigger(job.job_id, 2) == TOKENS_IN_FLIGHT_RETRY_S
        assert store.get_job(job.job_id).state == RUNNING and fake_provider.requests == []

        for c in elsewhere:  # they settle for far less than their worst cases
            assert store.complete_item(job.job_id, c.index, "elsewhere", "r", Usage(10, 10))
        assert runtime.handle_trigger(job.job_id, 2) is None  # ran item 3, then nothing was left
    finally:
        runtime.stop()
    done = store.get_job(job.job_id)
    assert (done.state, done.completed, done.tokens_reserved) == (RUNNING, 3, 0)
    assert len(fake_provider.requests) == 1
