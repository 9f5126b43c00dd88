"""BudgetGate: a bulk job charges each model request as class bulk and waits, not fails, at the
cap."""

from __future__ import annotations

import pytest

from hermes_bulk.budget.gate import (
    gate_from_environment,
    mark_precharged,
    take_precharged,
)
from hermes_bulk.budget.service import Budget
from hermes_bulk.budget.settings import LEDGER_ENV, budget_dir
from hermes_bulk.config.settings import load_settings
from hermes_bulk.fleet import broker
from hermes_bulk.fleet.broker import open_backend
from hermes_bulk.jobs.request import JobRequest
from hermes_bulk.jobs.service import Jobs
from hermes_bulk.runtime.worker import WorkerRuntime

from ..helpers import wait_for


@pytest.fixture
def root(env, tmp_path, monkeypatch):
    """A root Hermes home for the budget (HERMES_HOME), apart from the bulk data dir (after `env`,
    which clears HERMES_HOME)."""
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "hermes"))
    monkeypatch.delenv(LEDGER_ENV, raising=False)
    return tmp_path / "hermes"


def test_no_budget_is_configured_until_there_are_settings_a_ledger_or_the_environment(
    root, monkeypatch
):
    gate = gate_from_environment()
    assert not gate.configured()
    Budget(budget_dir()).settings_file.set("mode", "observe")
    assert gate.configured(), "the same gate follows the budget set after it was made"


def test_closing_a_gate_closes_the_budget_it_opened_and_the_next_ask_opens_a_new_one(root):
    unused = gate_from_environment()
    unused.close()  # nothing opened: nothing to close
    assert not budget_dir().exists(), "closing a gate that never asked opens nothing"
    gate = gate_from_environment()
    Budget(budget_dir()).settings_file.set("mode", "observe")
    first = gate.budget
    assert first.report().counts.total == 0  # the ledger is open now
    gate.close()
    assert gate.budget is not first


def test_a_ledger_url_in_the_environment_configures_the_budget(root, monkeypatch, redis_url):
    monkeypatch.setenv(LEDGER_ENV, redis_url)
    gate = gate_from_environment(profile="host-a")
    assert gate.configured() and gate.profile == "host-a"


def test_a_precharge_mark_is_taken_once_and_only_on_its_own_thread():
    import threading

    mark_precharged()
    seen = []
    t = threading.Thread(target=lambda: seen.append(take_precharged()))
    t.start()
    t.join()
    assert seen == [False]
    assert take_precharged() is True
    assert take_precharged() is False


def test_a_bulk_job_at_the_cap_waits_for_the_window_instead_of_failing_items(
    root, tmp_path, fake_provider
):
    settings = load_settings(
        lease_seconds=1.5
    )  # a quick maintenance loop: the pump restarts held jobs sooner
    budget = Budget(budget_dir())
    f = budget.settings_file
    f.set("chat_reserve", "1")
    f.set("daily_limit", "4")  # cron and bulk stop at 3
    f.set("mode", "enforce")
    gate = gate_from_environment(profile="worker-1")
    src = tmp_path / "items.jsonl"
    src.write_text("".join(f'{{"n": {i}}}\n' for i in range(5)))
    backend = open_backend(settings)
    jobs = Jobs(settings, backend, request_gate=gate)
    job = jobs.create(JobRequest(instruction="Describe", over=str(src), concurrency=2)).job
    runtime = WorkerRuntime(backend, settings, threads=2, request_gate=gate)
    runtime.start()
    runtime.start_embedded_consumer()
    try:
        jobs.run(job.job_id)
        st = wait_for(
            lambda: (s := jobs.status(job.job_id)).budget_held_until and s.job.running == 0 and s,
            message="the job to be held by the budget",
        )
        window = budget.window(budget.settings())
        assert st.budget_held_until == window.end_s
        assert (st.job.completed, st.job.failed, st.job.pending) == (3, 0, 2)
        assert st.state == "processing"
        assert len(fake_provider.requests) == 3  # nothing past the cap reached the provider
        report = budget.report()
        assert report.counts.by_class()["bulk"] == 3 and report.counts.decisions("held") >= 1
        assert {j.job_id: j.requests for j in report.counts.jobs()} == {job.job_id: 3}
        assert report.counts.by_profile() == {"worker-1": 3}
        # More room in the window: the job picks up again by itself (the pump restarts it).
        f.set("daily_limit", "10")
        wait_for(
            lambda: jobs.status(job.job_id).job.completed == 5,
            timeout=30,
            message="the job to finish",
        )
        assert jobs.status(job.job_id).budget_held_until is None
    finally:
        runtime.stop(graceful=True)
        budget.close()
        broker.close_all()
