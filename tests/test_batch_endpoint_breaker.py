"""A --batch job whose endpoint is down, or refuses the key, pauses naming it, as a live job does.

Before, a refused key cost each batch five strikes and then an attempt of every item (a wrong
key failed the job item by item), and an endpoint that never answered kept the job running
forever with nothing said. A real `run --wait` process drives the batch against the loopback
provider (a wrong key) or a port nothing listens on; the job ends paused with a reason naming
the endpoint, and no item is charged an attempt. On both backends.
"""

from __future__ import annotations

import pytest

from hermes_bulk.testing.sentinels import free_port

from .test_batch_mode import _source

FAST = {"HERMES_BULK_BATCH_POLL_SECONDS": "0.1", "HERMES_BULK_BREAKER_FAILURES": "3"}


@pytest.fixture(params=["sqlite", "redis"])
def backend_env(request, tmp_path) -> dict[str, str]:
    url = (
        f"sqlite:///{tmp_path / 'bulk.db'}"
        if request.param == "sqlite"
        else request.getfixturevalue("redis_url")
    )
    return {"HERMES_BULK_BACKEND": url, **FAST}


def _run_until_paused(cli, tmp_path, env: dict[str, str]) -> dict:
    job_id = cli.json(
        "create",
        "Summarise",
        "--over",
        str(_source(tmp_path, 6)),
        "--batch",
        "--fresh",
        "--json",
        **env,
    )["job_id"]
    proc = cli("run", job_id, "--wait", "--no-check", check=False, timeout=90, **env)
    assert proc.returncode == 4, proc.stdout + proc.stderr  # ended paused
    status = cli.json("status", job_id, "--json", **env)
    assert (status["state"], status["failed"], status["completed"]) == ("paused", 0, 0), status
    failed = cli.json("status", job_id, "--failed", "--json", **env)
    assert failed == [], "no item was charged for the endpoint"
    return status


def test_a_refused_key_pauses_a_batch_job_naming_the_endpoint(
    cli, tmp_path, fake_provider, backend_env
):
    fake_provider.configure(require_key="the-only-right-key")
    try:
        status = _run_until_paused(cli, tmp_path, backend_env)
    finally:
        fake_provider.configure(require_key=None)
    assert "refused the API key this job was created with (HTTP 401)" in status["pause_reason"]
    assert fake_provider.base_url in status["pause_reason"]


def test_a_batch_endpoint_that_never_answers_pauses_the_job_naming_it(cli, tmp_path, backend_env):
    down = f"http://127.0.0.1:{free_port()}/v1"
    status = _run_until_paused(cli, tmp_path, {**backend_env, "HERMES_BULK_BASE_URL": down})
    assert down in status["pause_reason"] and "in a row failed" in status["pause_reason"], status[
        "pause_reason"
    ]
