"""The plugin's process-side machinery, without Hermes: the handler on an event loop, the
embedded workers' lifetime, and the request-budget seam."""

from __future__ import annotations

import asyncio
import threading

import pytest

from hermes_bulk.budget.gate import BudgetGate
from hermes_bulk.budget.settings import SettingsFile, budget_dir
from hermes_bulk.jobs.request import JobRequest
from hermes_bulk.jobs.service import Jobs
from hermes_bulk.plugin import background, bulk
from hermes_bulk.providers.client import HttpModelClient
from hermes_bulk.providers.pacing import OpenGate

from ..helpers import wait_for


def test_the_handler_leaves_the_event_loop_free_while_a_command_runs(monkeypatch):
    loop_turned = threading.Event()  # set by a task on the event loop, while the command runs
    seen: list[bool] = []

    def command_that_waits_for_the_loop(raw, on_progress=None, sessions=None):
        seen.append(loop_turned.wait(10))  # a handler that held the loop would never let it be set
        return f"done: {raw}"

    monkeypatch.setattr(bulk, "answer", command_that_waits_for_the_loop)

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0)
                ticks += 1
                if ticks == 20:
                    loop_turned.set()

        task = asyncio.create_task(ticker())
        reply = await bulk.handle("status")
        task.cancel()
        return reply

    assert asyncio.run(main()) == "done: status"
    assert seen == [True], "Hermes' event loop went on while the command ran on its thread"


def test_a_slow_command_answers_with_the_next_one(monkeypatch):
    monkeypatch.setattr(bulk, "REPLY_WAIT_S", 0.2)
    release = threading.Event()

    def slow_answer(raw, on_progress=None, sessions=None):
        if raw.startswith('"Summarize"'):
            on_progress(1200)
            release.wait(5)
            return "Created job abc with 5000 items."
        return f"answer to {raw}"

    monkeypatch.setattr(bulk, "answer", slow_answer)
    first = asyncio.run(bulk.handle('"Summarize" --over big'))
    assert first == (
        "Still working on it (1,200 items found so far). It goes on in the\n"
        "  background; the answer comes with your next /bulk command."
    )  # 72 columns
    release.set()
    wait_for(
        lambda: any(bulk.late_answers.values()), timeout=10, message="the late answer to be kept"
    )
    assert asyncio.run(bulk.handle("status")) == (
        'Earlier /bulk "Summarize" --over big:\nCreated job abc with '
        "5000 items.\n\nanswer to status"
    )
    assert asyncio.run(bulk.handle("status")) == "answer to status", "delivered once"


def test_the_budget_seam_is_open_without_a_budget_and_the_ledgers_gate_with_one(
    settings, monkeypatch, tmp_path
):
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "hermes-root"))
    monkeypatch.delenv("HERMES_BULK_BUDGET_LEDGER", raising=False)
    monkeypatch.setattr(background, "_gates", {})
    gate = background.request_gate(settings)
    assert isinstance(gate, BudgetGate) and not gate.configured(), (
        "no budget configured: every request goes"
    )
    SettingsFile(budget_dir()).set("mode", "enforce")
    assert gate.configured(), "the gate follows a budget set after it was made"
    assert background.request_gate(settings) is gate, "one gate per backend"


class CountingGate(OpenGate):
    def __init__(self) -> None:
        self.admitted: list[str] = []

    def admit(self, job):
        self.admitted.append(job.job_id)
        return 0.0


@pytest.fixture
def hermes_job(settings, tmp_path):
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(f'{{"n": {i}}}\n' for i in range(6)))
    jobs = Jobs(settings)
    job_id = jobs.create(
        JobRequest(
            instruction="Do",
            over=str(src),
            client="hermes",
            provider="hermes:default:custom:fake-model",
            model="fake-model",
            concurrency=2,
        )
    ).job.job_id
    return jobs, job_id


def test_embedded_workers_start_once_charge_every_call_and_stop_when_idle(
    settings, fake_provider, hermes_job, monkeypatch
):
    monkeypatch.setattr(background, "IDLE_STOP_S", 0.5)
    monkeypatch.setattr(background, "SUPERVISE_EVERY_S", 0.1)
    jobs, job_id = hermes_job
    model = HttpModelClient(
        base_url=fake_provider.base_url, api_key=None, model="fake-model", timeout_s=10
    )
    gate = CountingGate()
    clients = {"hermes": lambda job: model}
    try:
        jobs.run(job_id)
        runtime = background.ensure_running(settings, jobs.backend, clients=clients, gate=gate)
        assert (
            background.ensure_running(settings, jobs.backend, clients=clients, gate=gate) is runtime
        )
        assert all(
            t.daemon
            for t in threading.enumerate()
            if t.name.startswith(("hermes-bulk", "Worker", "Scheduler"))
        )
        wait_for(lambda: jobs.status(job_id).state == "completed", timeout=30, message="completion")
        assert gate.admitted == [job_id] * 6, "every model call went through the request gate first"

        wait_for(
            lambda: (
                background.running(jobs.backend.url) is None and not jobs.liveness.live_worker_ids()
            ),
            timeout=10,
            message="the idle stop",
        )
        assert runtime.consumers == []
        again = background.ensure_running(settings, jobs.backend, clients=clients, gate=gate)
        assert again is not runtime, "the next run starts workers again"
    finally:
        background.stop_all()
        model.close()
    assert background.running(jobs.backend.url) is None


def test_when_hermes_exits_items_in_progress_go_back_to_the_queue(
    settings, fake_provider, hermes_job
):
    jobs, job_id = hermes_job
    fake_provider.configure(latency_s=2.0)
    model = HttpModelClient(
        base_url=fake_provider.base_url, api_key=None, model="fake-model", timeout_s=10
    )
    try:
        jobs.run(job_id)
        background.ensure_running(
            settings, jobs.backend, clients={"hermes": lambda job: model}, gate=OpenGate()
        )
        wait_for(
            lambda: jobs.status(job_id).job.running == 2, timeout=10, message="items in progress"
        )
        background.stop_all()  # what the atexit hook does
        st = jobs.status(job_id)
        assert (st.job.running, st.job.pending) == (0, 6) and st.state == "awaiting_recovery"
    finally:
        background.stop_all()
        model.close()
