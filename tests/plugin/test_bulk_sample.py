"""/bulk run JOB --sample N in a real Hermes 0.19.0: N items spread over the job go through
Hermes' model, the job pauses after them, and /bulk resume runs the rest. On both backends."""

from __future__ import annotations

import json

from hermes_bulk.testing.fake_provider import digest

from .conftest import job_id_of
from .test_bulk_plugin import wait_for_state


def test_a_bulk_sample_runs_its_items_pauses_and_resume_runs_the_rest(
    gateway, hermes_home, hermes_provider, tmp_path, bulk_backend
):
    url = bulk_backend
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(9)))
    gw = gateway()
    job = job_id_of(gw.bulk(f'"Describe" --over {src}'))
    started = " ".join(gw.bulk(f"run {job} --sample 3").split())
    assert "a sample of 3 items spread over the job" in started
    status = " ".join(wait_for_state(gw, job, "paused", backend=url).split())
    assert "Paused after its sample (run --sample)" in status and "/bulk resume" in status
    assert sorted(r.item for r in hermes_provider.requests) == sorted(
        digest(json.dumps({"n": i})) for i in (0, 4, 8)
    )
    gw.bulk(f"resume {job}")
    wait_for_state(gw, job, "completed", backend=url)
    items = [r.item for r in hermes_provider.requests]
    assert len(items) == 9 and len(set(items)) == 9, "no sampled item was sent again"
