"""A worker serves only the kinds of job it has a model client for, and never sees the others.

A job created in Hermes must reach Hermes' model; one created by `hermes-bulk create` the
endpoint in HERMES_BULK_*. Each kind has its own queue, so a worker without the client a job
needs never takes its triggers: nothing is failed, nothing goes to the wrong endpoint, and the
job waits for no one.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from hermes_bulk.fleet import broker
from hermes_bulk.jobs.request import JobRequest
from hermes_bulk.jobs.service import Jobs
from hermes_bulk.providers.client import HttpModelClient
from hermes_bulk.runtime.worker import WorkerRuntime

from .helpers import wait_for


def _hermes_job(jobs: Jobs, tmp_path, n: int = 3) -> str:
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(f'{{"n": {i}}}\n' for i in range(n)))
    return jobs.create(
        JobRequest(
            instruction="Do",
            over=str(src),
            client="hermes",
            provider="hermes:default:custom:fake-model",
            model="fake-model",
        )
    ).job.job_id


def _count_polls(monkeypatch, queues) -> Counter:
    """Reads of each of these Huey queues (by name) from now on: a consumer's poll counter."""
    polls: Counter = Counter()
    lock = threading.Lock()
    for huey in queues:

        def counted(dequeue=huey.dequeue, name=huey.name):
            with lock:
                polls[name] += 1
            return dequeue()

        monkeypatch.setattr(huey, "dequeue", counted)
    return polls


def test_a_worker_never_takes_triggers_of_a_job_it_has_no_client_for(
    settings, fake_provider, tmp_path, monkeypatch
):
    jobs = Jobs(settings)
    job_id = _hermes_job(jobs, tmp_path)
    jobs.run(job_id)
    assert (
        jobs.backend.queue_length(["hermes"]) == 3 and jobs.backend.queue_length(["http"]) == 0
    ), "the triggers wait on the queue of jobs created in Hermes"

    http_only = WorkerRuntime(jobs.backend, settings, threads=2)  # the default: HERMES_BULK_* only
    polls = _count_polls(monkeypatch, http_only.queues())
    http_only.start()
    http_only.start_embedded_consumer()
    try:
        http_only.maintain_once()  # its pump, too, leaves the job to workers that serve it
        # Every queue the worker consumes has been read again since, by each of its threads:
        # a trigger it could take would have been taken.
        since, names = dict(polls), [q.name for q in http_only.queues()]
        wait_for(
            lambda: all(polls[name] >= since.get(name, 0) + 2 for name in names),
            timeout=30,
            interval=0.01,
            message="the worker's consumers to read their queues again",
        )
        st = jobs.status(job_id, events=50)
    finally:
        http_only.stop()
    assert fake_provider.requests == [], "nothing went to HERMES_BULK_BASE_URL"
    assert (st.job.pending, st.job.running, st.job.completed, st.job.failed) == (3, 0, 0, 0)
    assert st.job.last_claim_at is None, "the worker never claimed an item of it"
    assert not [e for e in st.events if e.kind == "worker_cannot_serve"]
    assert jobs.backend.queue_length(["hermes"]) == 3, (
        "its triggers were left for a worker that can serve it"
    )

    # A worker that has a client for jobs created in Hermes (here: the loopback endpoint).
    model = HttpModelClient(
        base_url=fake_provider.base_url, api_key=None, model="fake-model", timeout_s=10
    )
    serving = WorkerRuntime(
        jobs.backend, settings, threads=2, clients={"hermes": lambda job: model}
    )
    serving.start()
    serving.start_embedded_consumer()
    try:
        wait_for(lambda: jobs.status(job_id).state == "completed", timeout=30, message="completion")
    finally:
        serving.stop()
        model.close()
    assert len(fake_provider.requests) == 3


def test_a_trigger_on_the_wrong_queue_is_passed_on_to_the_right_one(
    settings, fake_provider, tmp_path
):
    """Triggers sent before queues were per kind sit on the http queue: they move, not loop."""
    jobs = Jobs(settings)
    job_id = _hermes_job(jobs, tmp_path, n=2)
    jobs.store.set_state(job_id, "running", from_states=["not_started"])
    jobs.backend.trigger(job_id, 0, 2, client="http")  # where an older release put it
    http_only = WorkerRuntime(jobs.backend, settings, threads=2)
    http_only.start()
    http_only.start_embedded_consumer()
    try:
        wait_for(
            lambda: jobs.backend.queue_length(["hermes"]) == 2, timeout=10, message="the hand-over"
        )
        assert jobs.backend.queue_length(["http"]) == 0
    finally:
        http_only.stop()
    assert fake_provider.requests == [] and jobs.status(job_id).job.pending == 2


def test_each_kind_of_model_client_has_its_own_queue_on_both_backends(
    settings, redis_url, tmp_path
):
    (tmp_path / "q").mkdir()
    sqlite = broker.build_backend(f"sqlite:///{tmp_path / 'q' / 'bulk.db'}")
    redis = broker.build_backend(redis_url)
    try:
        for backend in (sqlite, redis):
            backend.trigger("j1", 0, 2, client="http")
            backend.trigger("j2", 0, 3, client="hermes")
            assert backend.queue("http").name.endswith(broker.QUEUE_NAME)
            assert backend.queue("hermes").name.endswith(broker.QUEUE_NAME + ".hermes")
            assert (
                backend.queue_length(["http"]),
                backend.queue_length(["hermes"]),
                backend.queue_length(["http", "hermes"]),
            ) == (2, 3, 5)
            assert [t.args for t in backend.queue("hermes").pending()] == [
                ("j2", 0),
                ("j2", 1),
                ("j2", 2),
            ]
    finally:
        sqlite.close()
        redis.close()


@pytest.mark.parametrize(
    "clients, queues",
    [
        (None, ["hermes-bulk.{own}", "hermes-bulk", "hermes-bulk.{old}"]),
        ({"hermes": None}, ["hermes-bulk.hermes"]),
    ],
)
def test_a_worker_consumes_the_queues_of_the_kinds_it_serves(settings, clients, queues):
    """HTTP: its own endpoint's queue, the kind's (jobs that recorded no endpoint) and that of
    jobs its key made before every credential bound a job (one thread each but its own)."""
    runtime = WorkerRuntime(Jobs(settings).backend, settings, threads=3, clients=clients)
    names = [q.format(own=runtime.own_route, old=runtime.old_route) for q in queues]
    assert [q.name for q in runtime.queues()] == names
    assert runtime.queue_threads() == [3, 1, 1][: len(names)]


def test_the_default_worker_serves_only_jobs_made_by_hermes_bulk_create(settings):
    assert set(WorkerRuntime(Jobs(settings).backend, settings, threads=1).clients) == {"http"}


def test_run_wait_on_a_job_this_machine_cannot_serve_says_so_instead_of_waiting(
    cli, settings, tmp_path
):
    """No Hermes configuration here (HOME is empty): the CLI cannot call Hermes' model."""
    job_id = _hermes_job(Jobs(settings), tmp_path)
    proc = cli("run", job_id, "--wait", check=False, timeout=30)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith(
        f"hermes-bulk: Job {job_id} cannot be processed here: this machine does not "
        "serve jobs created in Hermes: no Hermes configuration at "
    )
    assert f"continue it with: /bulk run {job_id} (in Hermes" in " ".join(proc.stderr.split())
