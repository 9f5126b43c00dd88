"""What run, resume and retry answer says what will happen (issue 46, point 11): who serves the
job (live workers that serve it by fleet/endpoints' rule, or none), whether the request budget
holds it and until when, and for a batch job the next step. Never "running" for a job no worker
serves, nor for one the budget holds.

In-process: the jobs API on a SQLite store, a real BudgetGate at its cap, and workers registered
in the store as a live worker of another machine registers itself.
"""

from __future__ import annotations

import time

import pytest

from hermes_bulk.budget.gate import BudgetGate
from hermes_bulk.budget.ledger import CallRecord
from hermes_bulk.budget.service import Budget
from hermes_bulk.budget.windows import ZonedInstant
from hermes_bulk.config.settings import load_settings
from hermes_bulk.errors import InvalidTransition
from hermes_bulk.fleet import broker, endpoints
from hermes_bulk.fleet.broker import open_backend
from hermes_bulk.frontends import replies
from hermes_bulk.jobs.request import JobRequest
from hermes_bulk.jobs.service import Jobs
from hermes_bulk.store.records import ItemError, WorkerInfo


@pytest.fixture
def budget(tmp_path):
    b = Budget(tmp_path / "cron-budget")
    yield b
    b.close()


@pytest.fixture
def jobs(env, budget):
    backend = open_backend(load_settings())
    gate = BudgetGate(budget.directory, profile="host-a", budget=budget)
    yield Jobs(load_settings(), backend, request_gate=gate)
    broker.close_all()


@pytest.fixture
def src(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(f'{{"n": {i}}}\n' for i in range(3)))
    return path


def at_the_cap(budget: Budget) -> str:
    """Enforced, with every request bulk may use spent: when the window reopens, as shown."""
    f = budget.settings_file
    f.set("chat_reserve", "1")
    f.set("daily_limit", "3")
    f.set("mode", "enforce")
    for _ in range(2):
        budget.admit(CallRecord("chat"))
    window = budget.window(budget.settings())
    return ZonedInstant(window.end_s, window.zone).shown()


def live_worker(jobs: Jobs, serves: str, name: str = "w1") -> None:
    """A worker of another machine, live now, consuming the routes `serves`."""
    now = time.time()
    jobs.backend.store.heartbeat_worker(
        WorkerInfo(f"elsewhere:{name}", "elsewhere", 1, now, now, 4, serves), ttl_s=60
    )


def run(jobs, job_id) -> str:
    """`hermes-bulk run JOB` (without --wait) as it answers in a shell."""
    return replies.run(jobs, replies.Place(), job=job_id).text


def test_a_job_no_live_worker_serves_waits_for_a_worker(jobs, src):
    job = jobs.create(JobRequest(instruction="Classify", over=str(src))).job
    live_worker(jobs, "hermes")  # live, but it serves only jobs made in Hermes
    text = run(jobs, job.job_id)
    assert text.startswith(
        f"Job {job.job_id} waits for a worker: 3 items pending. 1 worker is live but serves only "
        "jobs created in Hermes; start one for this job's endpoint: hermes-bulk worker, or "
        f"process it here: hermes-bulk run {job.job_id} --wait."
    ), text


def test_a_job_a_live_worker_serves_is_running(jobs, src):
    """The neighbour: a worker that consumes the job's route (its endpoint and key)."""
    job = jobs.create(JobRequest(instruction="Classify", over=str(src))).job
    live_worker(jobs, endpoints.route(job.spec))
    assert run(jobs, job.job_id) == (
        f"Job {job.job_id} is running: 3 items pending. 1 live worker picks it up. "
        f"Check it with: hermes-bulk status {job.job_id}"
    )


def test_a_job_the_budget_holds_says_until_when(jobs, src, budget):
    until = at_the_cap(budget)
    job = jobs.create(JobRequest(instruction="Classify", over=str(src))).job
    live_worker(jobs, endpoints.route(job.spec))
    assert run(jobs, job.job_id) == (
        f"Job {job.job_id} waits for the request budget: 3 items pending, none sent before "
        f"{until} (the rest of this window is kept for chat). 1 live worker picks it up.\n"
        f"Check it with: hermes-bulk status {job.job_id}"
    )


def test_resume_and_retry_say_the_same_of_a_held_job(jobs, src, budget):
    until = at_the_cap(budget)
    job = jobs.create(JobRequest(instruction="Classify", over=str(src))).job
    jobs.run(job.job_id)
    store = jobs.backend.store
    assert store.claim_item(job.job_id, 0, "w1", lease_s=30, max_running=10).index == 0
    assert store.fail_item(job.job_id, 0, "w1", ItemError("PermanentError", "no", 400))
    jobs.pause(job.job_id)
    resumed = replies.resume(jobs, replies.Place(), job=job.job_id).text
    assert resumed.startswith(
        f"Job {job.job_id} resumed and waits for the request budget: 2 items pending, none sent "
        f"before {until} "
    ), resumed
    retried = replies.retry(jobs, replies.Place(), job=job.job_id).text
    assert retried.startswith(
        f"Job {job.job_id}: 1 failed item returned to the queue; the job waits for the request "
        f"budget: 3 items pending, none sent before {until} "
    ), retried


class InHermes(replies.Place):
    """A place whose run starts workers in its own process, as /bulk's does."""

    cmd = "/bulk"
    next_step_sep = "\n"
    processes_here = True

    def __init__(self) -> None:
        super().__init__()
        self.started = 0

    def start_workers(self) -> None:
        self.started += 1


def test_in_hermes_a_held_job_is_not_running_in_the_background(jobs, src, budget):
    until = at_the_cap(budget)
    job = jobs.create(JobRequest(instruction="Classify", over=str(src), concurrency=4)).job
    place = InHermes()
    text = replies.run(jobs, place, job=job.job_id).text
    assert place.started == 1
    assert text == (
        f"Job {job.job_id} waits for the request budget: 3 items pending, none sent before "
        f"{until} (the rest of this window is kept for chat). The worker in this process sends "
        "them then, up to 4 at once, if it still runs.\n"
        f"Check it with: /bulk status {job.job_id}"
    )


@pytest.mark.parametrize("serves, live", [("hermes", 0), ("http", 1)])
def test_a_batch_job_counts_only_workers_that_serve_it_and_names_the_next_step(
    jobs, src, serves, live
):
    """The embedded worker of Hermes serves jobs made in Hermes, never a batch: it is no worker
    for a `/bulk … --batch` job (whose endpoint is any worker's)."""
    job = jobs.create(
        JobRequest(instruction="Classify", over=str(src), batch=True, bind_endpoint=False)
    ).job
    live_worker(jobs, serves)
    text = replies.run(jobs, InHermes(), job=job.job_id).text
    said = "is running" if live else "waits for a worker"
    who = (
        "1 live worker serves it."
        if live
        else "No worker that serves it is live: start one where HERMES_BULK_BASE_URL and the key "
        "are set: hermes-bulk worker"
    )
    assert text == (
        f"Job {job.job_id} {said}: 3 items pending. It runs through the provider's Batch API "
        "(about half the price; answers within the batch window), submitted by a hermes-bulk "
        f"worker with its own endpoint. {who}\nCheck it with: /bulk status {job.job_id}"
    )


class Refusing(InHermes):
    """/bulk's place: a job not made in Hermes cannot be processed by its workers."""

    def check_servable(self, job_ref: str) -> None:
        raise InvalidTransition(f"Job {job_ref} was created by hermes-bulk create")


def test_resume_of_a_batch_job_in_hermes_names_its_worker_not_hermes_bulk_create(jobs, src):
    """A `/bulk … --batch` job is a hermes-bulk worker's: resume is not refused as if it had been
    made by `hermes-bulk create` (run never was), and starts no worker in Hermes."""
    job = jobs.create(
        JobRequest(instruction="Classify", over=str(src), batch=True, bind_endpoint=False)
    ).job
    place = Refusing()
    replies.run(jobs, place, job=job.job_id)
    jobs.pause(job.job_id)
    text = replies.resume(jobs, place, job=job.job_id).text
    assert text.startswith(f"Job {job.job_id} resumed and waits for a worker: 3 items pending.")
    assert place.started == 0
    with pytest.raises(InvalidTransition):  # the neighbour: a live job is still refused there
        replies.resume(
            jobs,
            place,
            job=jobs.create(JobRequest(instruction="Other", over=str(src), fresh=True)).job.job_id,
        )


def test_the_dashboards_resume_and_retry_say_the_same(jobs, src, budget):
    """The dashboard's buttons answer in its own words, by the same facts: only a worker that
    serves the job takes it up, and a job the budget holds sends nothing before it reopens."""
    from hermes_bulk.frontends.dashboard import app

    job = jobs.create(JobRequest(instruction="Classify", over=str(src))).job
    jobs.run(job.job_id)
    jobs.pause(job.job_id)
    live_worker(jobs, "hermes")  # live, serving only jobs made in Hermes
    assert app.resume(jobs, job.job_id) == (
        f"Job {job.job_id} resumed: 3 items pending. No live worker serves it: the job waits "
        "until one starts (see Workers)."
    )
    until = at_the_cap(budget)
    live_worker(jobs, endpoints.route(job.spec), name="w2")
    store = jobs.backend.store
    assert store.claim_item(job.job_id, 0, "w1", lease_s=30, max_running=10).index == 0
    assert store.fail_item(job.job_id, 0, "w1", ItemError("PermanentError", "no", 400))
    assert app.retry(jobs, job.job_id) == (
        f"Job {job.job_id}: 1 failed item returned to the queue. Nothing is sent before {until}: "
        "the request budget keeps the rest for chat. 1 live worker takes it up (see Workers)."
    )
