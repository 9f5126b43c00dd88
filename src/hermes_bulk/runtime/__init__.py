"""Where an item's life happens: the worker process and what it runs.

worker.py        WorkerRuntime: leases, recovery passes, the Huey consumer, the chains of items
pipeline.py      one item's life: claim, check the source, wait on limits, call, validate, save
batch_driver.py  a job run through the provider's Batch API: submit, poll, ingest, cancel
breaker.py       the endpoint's circuit breaker: when no item can succeed there, the job pauses
metrics.py       a worker's Prometheus page
client_kinds.py  the model-client kinds a worker finds by entry point (e.g. Hermes' /bulk jobs)
"""
