"""A provider's Batch API that never ends a file, redirects, or has no batch API at all: no job
is held for ever, nothing answered is bought again, nothing fails for the provider's behaviour
(DESIGN.md invariant 17). Real `run --wait` processes on both backends and both protocols
against the loopback provider's faults (fake_batches.BatchFaults: endless, redirects,
no_batch_api)."""

from __future__ import annotations

import pytest

from hermes_bulk.runtime.batch_faults import MAX_STRIKES

from .test_batch_mode import FAST, PROTOCOLS, _source, backend_settings

#: A line of the fake's answers is well under this; the byte bound of a file of n requests is
#: 64 x (n + 1) times it (1.3 MB for 4 requests: what the endless fake sends in a tenth of a
#: second).
SMALL_LINES = {"HERMES_BULK_BATCH_MAX_LINE_BYTES": "4096"}


def _env(request, backend: str, protocol: str) -> dict[str, str]:
    return {**backend_settings(request, backend), **FAST, **PROTOCOLS[protocol]}


#: Each call redirected on both stores and both protocols, not every combination (CI time).
REDIRECTED = [
    ("sqlite", "openai", "content"),
    ("redis", "anthropic", "content"),
    ("redis", "openai", "create"),
    ("sqlite", "anthropic", "create"),
    ("sqlite", "openai", "get"),
    ("redis", "anthropic", "get"),
]


def _create(cli, tmp_path, env: dict[str, str], n: int) -> str:
    return cli.json(
        "create",
        "Summarise",
        "--over",
        str(_source(tmp_path, n)),
        "--batch",
        "--fresh",
        "--json",
        **env,
    )["job_id"]


def _run_wait(cli, job_id: str, env: dict[str, str]):
    return cli("run", job_id, "--wait", "--no-check", check=False, timeout=120, **env)


@pytest.mark.parametrize(
    ("backend", "protocol", "kind"),
    [
        ("sqlite", "openai", "blank"),
        ("redis", "anthropic", "blank"),
        ("redis", "openai", "bytes"),
        ("sqlite", "anthropic", "bytes"),
    ],
)
def test_a_results_file_that_never_ends_is_ingested_and_run_wait_returns(
    cli, request, fake_provider, tmp_path, backend, protocol, kind
):
    """Before, the reading thread read the newlines for ever: every item completed, but the
    batch stayed open ("1 open") and `run --wait` never returned."""
    fake_provider.batches.configure(endless=kind)
    env = {**_env(request, backend, protocol), **SMALL_LINES}
    job_id = _create(cli, tmp_path, env, 4)
    proc = _run_wait(cli, job_id, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    status = cli.status(job_id, **env)
    assert (status["state"], status["completed"]) == ("completed", 4)
    batches = status["batches"]
    assert [(b["status"], b["next_poll_at"]) for b in batches] == [("completed", None)], batches
    assert "0 open" in cli("status", job_id, **env).stdout
    assert len(fake_provider.batches.created) == 1, "the same batch, not a new one"


@pytest.mark.parametrize(("backend", "protocol", "call"), REDIRECTED)
def test_a_redirect_is_read_again_then_pauses_and_nothing_is_bought_twice(
    cli, request, fake_provider, tmp_path, backend, protocol, call
):
    """Before, a redirect on the results read as an empty file: 12 items went into 3 batches,
    36 requests, and all 12 failed. Now the same batch is asked again (doubling waits), the
    job pauses naming the redirect, nothing failed; once the provider answers, it completes
    with the one batch."""
    fake_provider.batches.configure(redirects={call: 302})
    if call == "get":  # a batch still validating when created: it is polled
        fake_provider.configure(batch_delay_s=0.5)
    env = {**_env(request, backend, protocol), "HERMES_BULK_BREAKER_FAILURES": "3"}
    job_id = _create(cli, tmp_path, env, 12)
    proc = _run_wait(cli, job_id, env)
    assert proc.returncode == 4, proc.stdout + proc.stderr  # ended paused
    status = cli.status(job_id, **env)
    assert (status["state"], status["failed"], status["completed"]) == ("paused", 0, 0), status
    reason = status["pause_reason"]
    assert "3 requests in a row with a redirect (HTTP 302)" in reason, reason
    assert "never follows" in reason and fake_provider.base_url in reason, reason
    calls = fake_provider.batches.calls
    assert calls.count(call) >= 3 and calls.count("create") <= 3, calls
    assert len(fake_provider.batches.created) == (0 if call == "create" else 1)
    assert cli.json("status", job_id, "--failed", "--json", **env) == []

    fake_provider.batches.configure(redirects={})
    proc = _run_wait(cli, job_id, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    status = cli.status(job_id, **env)
    assert (status["state"], status["completed"]) == ("completed", 12)
    assert len(fake_provider.batches.created) == 1, "the same batch was read, none bought again"
    assert len(fake_provider.batches.lines) == 12


@pytest.mark.parametrize(
    ("backend", "protocol", "status"),
    [
        ("sqlite", "openai", 404),
        ("redis", "openai", 405),
        ("sqlite", "openai", 400),
        ("redis", "anthropic", 400),
        ("sqlite", "anthropic", 404),
    ],
)
def test_an_endpoint_without_a_batch_api_pauses_the_job_at_its_first_answer(
    cli, request, fake_provider, tmp_path, backend, protocol, status
):
    """Before: 15 Batch API calls (3 batches x 5 tries) for an answer that would not change,
    then every item failed with BatchUnusable."""
    fake_provider.batches.configure(no_batch_api=status)
    backend_env = _env(request, backend, protocol)
    job_id = _create(cli, tmp_path, backend_env, 3)
    proc = _run_wait(cli, job_id, backend_env)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    st = cli.status(job_id, **backend_env)
    assert (st["state"], st["failed"], st["completed"], st["pending"]) == ("paused", 0, 0, 3), st
    anthropic = backend_env.get("HERMES_BULK_PROVIDER") == "anthropic"
    what = "Message Batches" if anthropic else "Batch API"
    assert f"has no {what}" in st["pause_reason"], st["pause_reason"]
    assert f"HTTP {status}" in st["pause_reason"] and "without --batch" in st["pause_reason"]
    first = "create" if anthropic else "upload"
    assert fake_provider.batches.calls == [first], "known from its first answer"
    assert cli.json("status", job_id, "--failed", "--json", **backend_env) == []


@pytest.mark.parametrize(("backend", "protocol"), [("sqlite", "anthropic"), ("redis", "openai")])
def test_a_file_cut_before_its_lines_is_read_again_from_the_same_batch_then_given_up(
    cli, request, fake_provider, tmp_path, backend, protocol
):
    """A file whose first line passes the file's byte bound (64 x 3 x 4096 bytes for 2
    requests) and never ends: the lines after it never come. The same batch is read again,
    MAX_STRIKES times, never bought again; then its items get a failed attempt naming the
    bound."""
    fake_provider.batches.configure(
        endless="bytes", line_faults={'"n": 0': "huge"}, huge_line_bytes=1024 * 1024
    )
    env = {**_env(request, backend, protocol), **SMALL_LINES}
    job_id = cli.json(
        "create", "Summarise", "--over", str(_source(tmp_path, 2)), "--batch", "--fresh",
        "--retries", "0", "--json", **env,
    )["job_id"]  # fmt: skip
    proc = _run_wait(cli, job_id, env)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # ended with failed items
    assert len(fake_provider.batches.created) == 1
    assert len(fake_provider.batches.file_gets) == MAX_STRIKES, fake_provider.batches.file_gets
    assert len(set(fake_provider.batches.file_gets)) == 1
    failed = cli.json("status", job_id, "--failed", "--json", **env)
    assert {f["error_type"] for f in failed} == {"BatchUnusable"}, failed
    bound = 64 * 3 * 4096
    assert all(f"did not end within {bound} bytes" in f["message"] for f in failed), failed
