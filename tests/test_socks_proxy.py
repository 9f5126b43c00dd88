"""A SOCKS proxy in the environment is refused in one line at start (docs/decisions.md,
"Proxies"): `run`, `run --wait --no-check`, `worker` and `create` exit 1 naming the variable and
what to do; nothing is sent and no item fails. Before, `run` said "internal error
(ImportError)" and with --no-check every item failed.

Real parts: CLI processes against the loopback provider; the variable set as a user would.
"""

from __future__ import annotations

import pytest

from hermes_bulk.errors import ClientUnavailable
from hermes_bulk.providers.client import HttpModelClient

from .test_batch_mode import _source
from .test_transport import no_proxies  # noqa: F401

SOCKS = "socks5://127.0.0.1:1080"


def _refused(proc, name: str) -> None:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"hermes-bulk: {name} names a socks5 proxy"), lines[0]
    assert f"unset {name}" in lines[0] and "HTTP proxy" in lines[0], lines[0]
    assert "internal error" not in proc.stderr


def test_a_socks_proxy_is_one_line_at_start_and_nothing_fails(
    cli, fake_provider, tmp_path, no_proxies
):
    job_id = cli.create("Summarise", _source(tmp_path, 3))
    socks = {"ALL_PROXY": SOCKS}
    _refused(cli("run", job_id, check=False, process=True, **socks), "ALL_PROXY")
    _refused(cli("worker", "--burst", check=False, timeout=60, **socks), "ALL_PROXY")
    _refused(
        cli("create", "x", "--over", str(_source(tmp_path, 1, "b.jsonl")), check=False, **socks),
        "ALL_PROXY",
    )
    status = cli.status(job_id)
    assert (status["failed"], status["completed"]) == (0, 0), status
    assert fake_provider.requests == []


@pytest.mark.parametrize("name", ["all_proxy", "HTTP_PROXY"])
def test_each_variable_that_names_a_socks_proxy_is_refused_by_run_no_check(
    cli, fake_provider, tmp_path, no_proxies, name
):
    """Before, `run --wait --no-check` failed every item ("unexpected error in the worker")."""
    job_id = cli.create("Summarise", _source(tmp_path, 3))
    proc = cli("run", job_id, "--wait", "--no-check", check=False, timeout=60, **{name: SOCKS})
    _refused(proc, name)
    assert cli.status(job_id)["failed"] == 0
    assert fake_provider.requests == []


def test_a_socks_proxy_the_endpoint_is_exempt_from_changes_nothing(
    cli, fake_provider, tmp_path, no_proxies
):
    """The neighbour: NO_PROXY names the endpoint's host, so the proxy is not used."""
    job_id = cli.create("Summarise", _source(tmp_path, 2))
    env = {"ALL_PROXY": SOCKS, "NO_PROXY": "127.0.0.1"}
    proc = cli("run", job_id, "--wait", check=False, timeout=60, **env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert cli.status(job_id)["completed"] == 2


def test_a_client_made_under_a_socks_proxy_cannot_serve_rather_than_fail_items(
    fake_provider, no_proxies
):
    """Past the start-up check (a variable set later): the worker leaves the item to others
    (ClientUnavailable gives it back), it never fails it."""
    no_proxies.setenv("ALL_PROXY", SOCKS)
    with pytest.raises(ClientUnavailable, match="ALL_PROXY names a socks5 proxy"):
        HttpModelClient(base_url=fake_provider.base_url, api_key="k", model="m", timeout_s=5)
