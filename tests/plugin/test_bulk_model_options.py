"""/bulk … --temperature, --max-output-tokens, --system and -o in a real Hermes 0.19.0: a job on
Hermes' model sends what ctx.llm passes on; -o needs --batch (a hermes-bulk worker's endpoint).
On both backends."""

from __future__ import annotations

import json

from .conftest import job_id_of
from .test_bulk_plugin import wait_for_state


def test_a_bulk_job_sends_its_temperature_and_system_text_through_hermes(
    gateway, hermes_home, hermes_provider, tmp_path, bulk_backend
):
    url = bulk_backend
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(3)))
    system = tmp_path / "system.txt"
    system.write_text("Answer as a ship's captain would.\n")
    gw = gateway()
    created = gw.bulk(
        f'"Describe" --over {src} --temperature 0.3 --max-output-tokens 80 --system {system}'
    )
    job = job_id_of(created)
    gw.bulk(f"run {job}")
    status = wait_for_state(gw, job, "completed", backend=url)
    assert "Each request: temperature 0.3; at most 80 output tokens" in status
    assert len(hermes_provider.requests) == 3
    for sent in hermes_provider.requests:
        assert sent.options["temperature"] == 0.3
        assert sent.system.startswith("Answer as a ship's captain would.\n\n")

    # Hermes passes on the temperature and the output limit only: -o needs --batch.
    refused = " ".join(gw.bulk(f'"Describe" --over {src} -o top_p=0.9').split())  # unwrapped
    assert "takes --temperature and --max-output-tokens only" in refused and "--batch" in refused
    batch = gw.bulk(f'"Describe" --over {src} -o top_p=0.9 --batch')
    assert "Created job" in batch and "Batch API" in batch
