"""Where an item's life happens: the worker process and what it runs.

worker.py             WorkerRuntime: start-up, the Huey consumer, the chains of items
worker_serving.py     what a worker serves: its routes, the jobs it takes, its model clients
worker_maintenance.py heartbeats, leases, dead workers' items back, stalled chains restarted
worker_stop.py        stop sending, drain, stop: what a worker leaves and gives back
pipeline.py           one item's life: claim, check the source, wait on limits, call, validate, save
sending.py            an item's request: shared limits, the request gate, the breaker, retries
saving.py             an item's outcome saved, through a backend outage and a full disk
batch_driver.py       a job run through the provider's Batch API: a pass over the batch jobs
batch_submit.py       a batch opened in the store, its file uploaded, created at the provider
batch_requests.py     the requests file, and the ids binding a line to its request
batch_poll.py         a batch polled, cancelled (paused job, --batch-deadline), ingested once ended
batch_ingest.py       an ended batch's files read into the store, what it still holds settled
batch_faults.py       what goes wrong in a batch step: strikes, redirects, a batch given up
batch_delete.py       what `delete` does to a batch job's batches at the provider
breaker.py            the endpoint's circuit breaker: when no item can succeed there, the job pauses
metrics.py            a worker's Prometheus page
client_kinds.py       the model-client kinds a worker finds by entry point (e.g. Hermes' /bulk jobs)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..jobs.service import Jobs
    from ..store.protocol import JobRecord


def cancel_batches(jobs: Jobs, job: JobRecord) -> None:
    """What front ends hand to Jobs as its batch canceller (the jobs API speaks to no provider):
    batch_delete.cancel_open_batches, loaded only when a batch job is deleted, so the read
    commands start without the provider's client."""
    from .batch_delete import cancel_open_batches

    cancel_open_batches(jobs, job)
