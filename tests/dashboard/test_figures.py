"""The dashboard's rates and chart come from samples of a job's counters, kept in memory."""

from __future__ import annotations

from hermes_bulk.frontends.dashboard.figures import MIN_RATE_SPAN_S, RATE_WINDOW_S, Samples
from hermes_bulk.store.protocol import JobRecord, JobSpec


def job(completed: int, failed: int = 0, job_id: str = "j1") -> JobRecord:
    spec = JobSpec(
        job_id=job_id, instruction="x", source="/s", source_kind="file", concurrency=1, retries=0
    )
    return JobRecord(
        spec=spec,
        created_at=0.0,
        state="running",
        pause_reason=None,
        total=1000,
        pending=1000 - completed - failed,
        running=0,
        completed=completed,
        failed=failed,
        tokens_in=0,
        tokens_out=0,
        tokens_charged=0,
        tokens_reserved=0,
        estimated_tokens=0,
        skipped=0,
        last_claim_at=None,
        run_at=None,
    )


def test_items_per_minute_is_the_settled_change_over_the_last_five_minutes():
    s = Samples()
    s.add(job(0), 1000.0)
    assert s.per_minute("j1", 1000.0) is None, "one sample: no rate"
    s.add(job(1), 1000.0 + MIN_RATE_SPAN_S / 2)
    assert s.per_minute("j1", 1002.0) is None, "samples too close together"
    s.add(job(8, 2), 1060.0)  # 10 settled in a minute, failures counted
    assert s.per_minute("j1", 1060.0) == 10.0
    s.add(
        job(8, 2), 1000.0 + RATE_WINDOW_S + 60
    )  # nothing settled since: the window drops the first samples
    assert s.per_minute("j1", 1000.0 + RATE_WINDOW_S + 60) == 0.0


def test_samples_within_a_second_are_one_and_old_ones_and_unseen_jobs_go():
    s = Samples(history_s=100.0)
    s.add(job(1), 10.0)
    s.add(job(2), 10.5)
    assert s.series("j1") == [(10.0, 2, 0)]
    s.add(job(3), 200.0)
    assert s.series("j1") == [(200.0, 3, 0)], "older than the history: dropped"
    s.add(job(1, job_id="j2"), 200.0)
    s.forget_except({"j2"})
    assert s.series("j1") == [] and s.series("j2") == [(200.0, 1, 0)]
