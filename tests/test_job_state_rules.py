"""A job's displayed state as pure functions (jobs/service.derive_state, fleet/liveness
interruption and stopped_gracefully): every branch with its neighbours, each time compared at
equality and one step over."""

from __future__ import annotations

import dataclasses

import pytest

from hermes_bulk.fleet.liveness import interruption, stopped_gracefully
from hermes_bulk.jobs.service import derive_state, next_poll, shown_batches
from hermes_bulk.store.records import (
    BATCH_DONE,
    INTERRUPTED_ORPHANED,
    INTERRUPTED_WORKER_STOP,
    BatchRecord,
    JobRecord,
    JobSpec,
)

SPEC = JobSpec(
    job_id="job1", instruction="i", source="/s", source_kind="csv", concurrency=1, retries=0
)


def job(**fields) -> JobRecord:
    base = {f.name: None for f in dataclasses.fields(JobRecord) if f.name != "spec"}
    base.update(created_at=0.0, state="running", total=4, pending=4)
    for name in ("running", "completed", "failed", "skipped"):
        base[name] = 0
    base.update(fields)
    return JobRecord(spec=SPEC, **base)


@pytest.mark.parametrize(
    ("completed", "failed", "shown"),
    [
        (4, 0, "completed"),
        (0, 4, "failed"),
        (3, 1, "completed_with_errors"),
        (1, 3, "completed_with_errors"),
        (3, 0, "processing"),  # one short of the total: not finished
        (0, 3, "processing"),
        (2, 1, "processing"),
    ],
)
def test_a_finished_job_shows_how_it_ended_and_one_item_short_is_not_finished(
    completed, failed, shown
):
    record = job(completed=completed, failed=failed, pending=4 - completed - failed)
    assert derive_state(record, live_workers=1) == shown
    assert derive_state(dataclasses.replace(record, state="paused"), 0) == (
        shown if shown != "processing" else "paused"
    ), "a finished job shows its end whatever its run state"


def test_a_job_of_no_items_is_never_finished():
    assert derive_state(job(total=0, pending=0, state="not_started"), 0) == "not_started"
    assert derive_state(job(total=0, pending=0), 1) == "processing"


@pytest.mark.parametrize("state", ["not_started", "paused", "awaiting_recovery"])
def test_a_job_not_running_shows_its_run_state_with_or_without_workers(state):
    for live in (0, 1):
        assert derive_state(job(state=state), live) == state


@pytest.mark.parametrize(
    ("run_at", "last_claim_at", "shown"),
    [
        (100.0, None, "waiting_for_worker"),  # never picked up
        (100.0, 99.999, "waiting_for_worker"),  # claimed before this run only
        (100.0, 100.0, "awaiting_recovery"),  # claimed at the moment it was run
        (100.0, 100.001, "awaiting_recovery"),
        (None, 5.0, "awaiting_recovery"),
    ],
)
def test_a_running_job_without_a_worker_waits_or_awaits_recovery(run_at, last_claim_at, shown):
    record = job(run_at=run_at, last_claim_at=last_claim_at)
    assert derive_state(record, live_workers=0) == shown
    assert derive_state(record, live_workers=1) == "processing"


@pytest.mark.parametrize(
    ("interrupted", "interrupted_at", "graceful"),
    [
        (INTERRUPTED_WORKER_STOP, 200.0, True),  # stopped at the moment of its last claim
        (INTERRUPTED_WORKER_STOP, 200.001, True),
        (INTERRUPTED_WORKER_STOP, 199.999, False),  # claimed again after the stop
        (INTERRUPTED_WORKER_STOP, None, False),
        (INTERRUPTED_ORPHANED, 300.0, False),
        (None, None, False),
    ],
)
def test_a_graceful_stop_counts_only_when_nothing_was_claimed_after_it(
    interrupted, interrupted_at, graceful
):
    record = job(
        run_at=100.0, last_claim_at=200.0, interrupted=interrupted, interrupted_at=interrupted_at
    )
    assert stopped_gracefully(record) is graceful
    assert interruption(record) == (INTERRUPTED_WORKER_STOP if graceful else INTERRUPTED_ORPHANED)


def test_why_a_job_awaits_recovery():
    assert interruption(job(state="awaiting_recovery")) == INTERRUPTED_ORPHANED
    stopped = job(state="awaiting_recovery", interrupted=INTERRUPTED_WORKER_STOP)
    assert interruption(stopped) == INTERRUPTED_WORKER_STOP
    assert interruption(job(state="awaiting_recovery", completed=4, pending=0)) is None
    assert interruption(job(state="paused", run_at=1.0, last_claim_at=2.0)) is None
    assert interruption(job(run_at=2.0, last_claim_at=1.0)) is None


def test_states_read_from_a_store_are_compared_by_value():
    # Strings a store returns are not the module's constants: the same text, another object.
    def read(text: str) -> str:
        return "".join(list(text))

    stopped = job(
        state=read("awaiting_recovery"), interrupted=read(INTERRUPTED_WORKER_STOP), run_at=1.0
    )
    assert interruption(stopped) == INTERRUPTED_WORKER_STOP
    claimed = job(state=read("running"), run_at=1.0, last_claim_at=2.0)
    assert interruption(claimed) == INTERRUPTED_ORPHANED
    assert stopped_gracefully(
        job(interrupted=read(INTERRUPTED_WORKER_STOP), interrupted_at=3.0, last_claim_at=2.0)
    )


def test_no_time_recorded_counts_as_the_start_of_the_clock():
    never_claimed = job(interrupted=INTERRUPTED_WORKER_STOP, interrupted_at=0.0)
    assert stopped_gracefully(never_claimed), "a stop with no claim at all is graceful"
    assert interruption(job(run_at=None, last_claim_at=0.5)) == INTERRUPTED_ORPHANED


@pytest.mark.parametrize(("completed", "closed"), [(4, True), (3, False)])
def test_a_finished_job_shows_no_batch_open_and_one_item_short_keeps_it_open(completed, closed):
    """Between a worker saving a batch's answers and closing the batch, the job is finished
    beside a batch recorded open: status shows it ended, with no next poll."""
    record = job(completed=completed, pending=4 - completed)
    still_open = BatchRecord(
        batch_id="b1", job_id="job1", status="completed", items=4, created_at=0.0, polled_at=9.0
    )
    done = BatchRecord(
        batch_id="b0",
        job_id="job1",
        status=BATCH_DONE,
        items=1,
        created_at=0.0,
        final_status="expired",
    )
    shown = shown_batches(record, [still_open, done])
    assert shown[1] == done
    assert (not shown[0].open) is closed
    assert (next_poll(shown[0], poll_s=1.0) is None) is closed
    if closed:
        assert shown[0].final_status == "completed", "the provider's last word is kept"
