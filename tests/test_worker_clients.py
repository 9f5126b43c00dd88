"""A worker serves only the kinds of job it has a model client for, and leaves the others alone.

A job created in Hermes must reach Hermes' model; one created by `hermes-bulk create` the
endpoint in HERMES_BULK_*. A worker without the client a job needs gives its items back and puts
the trigger back on the queue for another worker: nothing is failed, nothing goes to the wrong
endpoint.
"""

from __future__ import annotations

from hermes_bulk.jobs import Jobs
from hermes_bulk.model import HttpModelClient
from hermes_bulk.worker import WorkerRuntime

from .helpers import wait_for


def test_a_worker_leaves_a_job_it_has_no_client_for_to_one_that_has(settings, fake_provider, tmp_path):
    src = tmp_path / "rows.jsonl"
    src.write_text('{"n": 1}\n{"n": 2}\n{"n": 3}\n')
    jobs = Jobs(settings)
    job_id = jobs.create("Do", str(src), client="hermes", provider="hermes:default:custom:fake-model",
                         model="fake-model").job.job_id
    jobs.run(job_id)

    http_only = WorkerRuntime(jobs.backend, settings, threads=2)  # the default: HERMES_BULK_* only
    http_only.start()
    http_only.start_embedded_consumer()
    try:
        wait_for(lambda: any(e.kind == "worker_cannot_serve" for e in jobs.status(job_id, events=20).events),
                 timeout=15, message="the worker to say it leaves the job")
        handled = len(fake_provider.requests)
    finally:
        http_only.stop()
    st = jobs.status(job_id, events=50)
    assert handled == 0 and fake_provider.requests == [], "nothing went to HERMES_BULK_BASE_URL"
    assert (st.job.pending, st.job.completed, st.job.failed) == (3, 0, 0), "no item failed, none lost"
    told = [e for e in st.events if e.kind == "worker_cannot_serve"]
    assert len(told) == 1 and "created in Hermes" in told[0].message

    # A worker that has a client for jobs created in Hermes (here: the loopback endpoint).
    model = HttpModelClient(base_url=fake_provider.base_url, api_key=None, model="fake-model", timeout_s=10)
    serving = WorkerRuntime(jobs.backend, settings, threads=2, clients={"hermes": lambda job: model})
    serving.start()
    serving.start_embedded_consumer()
    try:
        jobs.run(job_id)
        wait_for(lambda: jobs.status(job_id).state == "completed", timeout=30, message="completion")
    finally:
        serving.stop()
        model.close()
    assert len(fake_provider.requests) == 3


def test_the_default_worker_serves_only_jobs_made_by_hermes_bulk_create(settings):
    assert set(WorkerRuntime(Jobs(settings).backend, settings, threads=1).clients) == {"http"}
