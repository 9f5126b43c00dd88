"""/bulk status in a real Hermes 0.19.0 shows what a job spent and would cost: at genai-prices'
price of Hermes' model when it knows it, else at HERMES_BULK_PRICE (the plugin's `price` setting),
else why it cannot say. On both backends."""

from __future__ import annotations

import json

from .conftest import config_set, job_id_of
from .test_bulk_plugin import wait_for_state


def test_bulk_status_shows_the_cost_at_the_price_of_hermes_model(
    gateway, hermes_home, hermes_provider, tmp_path, bulk_backend
):
    url = bulk_backend
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(3)))
    gw = gateway()
    created = gw.bulk(f'"Describe" --over {src}')
    assert "Estimated cost: unknown (genai-prices does not know 'fake-model'" in " ".join(
        created.split()
    )
    job = job_id_of(created)
    gw.bulk(f"run {job}")
    status = " ".join(wait_for_state(gw, job, "completed", backend=url).split())
    assert "Cost: unknown (genai-prices does not know 'fake-model'" in status

    config_set(hermes_home, "plugins.entries.bulk.settings.price", "2,8")
    gw = gateway()
    job = job_id_of(gw.bulk(f'"Describe" --over {src} --fresh'))
    gw.bulk(f"run {job}")
    status = " ".join(wait_for_state(gw, job, "completed", backend=url).split())
    assert "Cost: $" in status and "so far, about $" in status
    assert "$2.00 in, $8.00 out per million tokens (HERMES_BULK_PRICE)" in status


def test_hermes_cache_reads_are_recorded_and_priced_as_cached(
    gateway, hermes_home, hermes_provider, tmp_path
):
    """Hermes passes on cache_read_input_tokens (as Anthropic-shaped usage reports it); input
    read from the cache is recorded and priced at the cached price."""
    config_set(hermes_home, "plugins.entries.bulk.settings.price", "1,2,0.5")
    usage = {"prompt_tokens": 100, "completion_tokens": 10, "cache_read_input_tokens": 40}
    hermes_provider.configure(usage=usage)
    src = tmp_path / "rows.jsonl"
    src.write_text('{"n": 1}\n')
    gw = gateway()
    job = job_id_of(gw.bulk(f'"Describe" --over {src}'))
    gw.bulk(f"run {job}")
    status = " ".join(wait_for_state(gw, job, "completed").split())
    assert "100 in (40 from the prompt cache), 10 out" in status
    # 60 at $1, 40 at $0.50 and 10 at $2 per million; all of it, as nothing is left to run
    assert "Cost: $0.00010 so far, about $0.00010, at most $" in status
    assert "for the whole job" in status
