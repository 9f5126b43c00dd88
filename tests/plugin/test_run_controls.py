"""`/bulk run JOB --concurrency N`: the shared handler records it on the job
and the gateway's workers apply it. Real hermes-agent 0.19.0, as in test_bulk_plugin.py."""

from __future__ import annotations

from .conftest import job_id_of
from .test_bulk_plugin import rows_jsonl, wait_for_state


def test_bulk_run_with_concurrency_runs_that_many(gateway, hermes_provider, tmp_path):
    src = rows_jsonl(9, tmp_path / "rows.jsonl")
    hermes_provider.configure(latency_s=0.4)
    gw = gateway()
    job = job_id_of(gw.bulk(f'"Classify" --over {src} --concurrency 1'))
    ran = gw.bulk(f"run {job} --concurrency 3 --rpm 6000")
    assert (
        " ".join(ran.splitlines()[0:2])
        == f"Job {job} is running in the background: 9 items pending, up to 3   at once."
    )  # broken at 72 columns, the rest indented
    wait_for_state(gw, job, "completed", timeout=90)
    assert hermes_provider.max_in_flight == 3
    assert "concurrency 3 (was 1), rpm 6000 (was unset)" in gw.bulk(f"events {job}")
