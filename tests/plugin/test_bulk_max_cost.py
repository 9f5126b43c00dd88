"""/bulk … --max-cost USD in a real Hermes 0.19.0: a job priced at the plugin's `price` setting
pauses before it would spend more, /bulk status says why, and /bulk resume --max-cost lets it
finish. On both backends."""

from __future__ import annotations

import json

from .conftest import config_set, job_id_of
from .test_bulk_plugin import wait_for_state


def test_a_bulk_job_pauses_at_its_cost_limit_and_resumes_with_a_larger_one(
    gateway, hermes_home, hermes_provider, tmp_path, bulk_backend
):
    url = bulk_backend
    config_set(hermes_home, "plugins.entries.bulk.settings.price", "100,400")
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps({"n": i, "text": "word " * i}) + "\n" for i in range(8)))
    gw = gateway()
    created = " ".join(
        gw.bulk(
            f'"Describe" --over {src} --max-cost 0.1 --max-output-tokens 40 --concurrency 1'
        ).split()
    )
    assert "Estimated cost: about $" in created
    job = job_id_of(created)
    gw.bulk(f"run {job}")
    status = " ".join(wait_for_state(gw, job, "paused", backend=url).split())
    assert "Paused: cost limit reached" in status and "--max-cost <usd>" in status
    assert "Cost limit: $0.10 (" in status
    answered = len(hermes_provider.requests)
    assert 0 < answered < 8 and f"Items: {answered}/8 completed" in status
    refused = " ".join(gw.bulk(f"resume {job}").split())
    assert "paused at its cost limit ($0.10)" in refused and "Traceback" not in refused
    gw.bulk(f"resume {job} --max-cost 2")
    status = " ".join(wait_for_state(gw, job, "completed", backend=url).split())
    assert "Cost limit: $2.00 (" in status
    items = [r.item for r in hermes_provider.requests]
    assert len(items) == 8 and len(set(items)) == 8, "no item was sent twice"
