"""Live jobs on Claude's Messages API (HERMES_BULK_PROVIDER=anthropic), through the real CLI and
workers against the loopback provider, on both backends: the protocol is chosen by the
settings, recorded on the job, and only a worker speaking it serves the job."""

from __future__ import annotations

import json

import pytest

from hermes_bulk.testing.fake_provider import expected_answer

from .test_batch_mode import _rows, _source

CLAUDE = {"HERMES_BULK_PROVIDER": "anthropic"}
#: An instruction long enough that the system text and it pass the fake's 1,024-token cache
#: minimum: every item after the first reads it from the prompt cache.
LONG_INSTRUCTION = "Summarise the record in one line. " + "Keep to the facts given. " * 200


def test_a_live_job_speaks_the_messages_api_and_reads_the_prompt_cache(
    backend_cli, fake_provider, tmp_path
):
    cli = backend_cli
    cli.env["HERMES_BULK_PRICE"] = "3,15,0.3,3.75"  # Claude Sonnet's, with its cache prices
    # The key must arrive as x-api-key: a bearer token is refused by require_key here too.
    fake_provider.configure(require_key=cli.env["HERMES_BULK_API_KEY"])
    n = 6
    job_id = cli.json(
        "create", LONG_INSTRUCTION, "--over", str(_source(tmp_path, n)), "--concurrency", "1",
        "--json", **CLAUDE,
    )["job_id"]  # fmt: skip
    proc = cli("run", job_id, "--wait", check=False, **CLAUDE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = cli.status(job_id, **CLAUDE)
    assert (job["state"], job["completed"], job["protocol"]) == ("completed", n, "anthropic")
    assert [r.protocol for r in fake_provider.requests] == ["anthropic"] * n
    assert {r.status for r in fake_provider.requests} == {200}
    rows = _rows(cli, job_id, CLAUDE)
    assert [r["result"] for r in rows] == [
        expected_answer(json.dumps({"n": i, "mark": ""})) for i in range(n)
    ]
    # The first item wrote the shared prefix to the cache; the other five read it.
    per_read = len(LONG_INSTRUCTION) // 4
    assert job["tokens_cached"] >= (n - 1) * per_read * 0.9
    assert per_read * 0.9 <= job["tokens_cache_written"] <= per_read * 1.2
    # Priced as Anthropic bills it: reads at a tenth of input, writes at 1.25 times.
    written, read = job["tokens_cache_written"], job["tokens_cached"]
    assert job["cache_written_usd"] == pytest.approx(written * 3.75 / 1e6)
    assert job["cache_read_usd"] == pytest.approx(read * 0.3 / 1e6)
    assert job["cache_saved_usd"] == pytest.approx(read * 2.7 / 1e6)
    plain = job["tokens_in"] - read - written
    assert job["cost_usd"] == pytest.approx(
        (plain * 3 + read * 0.3 + written * 3.75 + job["tokens_out"] * 15) / 1e6, abs=1e-8
    )
    text = cli("status", job_id, **CLAUDE).stdout
    assert f"({read:,} from the prompt cache, {written:,} written to it)" in text
    assert f"for {read:,} tokens read (saving $" in text and f"for {written:,} written" in text
    assert "$0.30 cached; $3.75 cache write;" in text


def test_a_claude_job_is_left_to_workers_that_speak_its_protocol(
    backend_cli, fake_provider, tmp_path
):
    """The same URL and key, another protocol: an OpenAI worker must not send a Claude job's
    items as chat completions (one proxy URL may serve both)."""
    cli = backend_cli
    job_id = cli.json(
        "create", "Say A", "--over", str(_source(tmp_path, 3)), "--json", **CLAUDE
    )["job_id"]  # fmt: skip
    proc = cli("run", job_id, "--wait", "--no-check", check=False, HERMES_BULK_PROVIDER="openai")
    assert proc.returncode != 0
    assert "created for" in proc.stderr and "(anthropic)" in proc.stderr, proc.stderr
    assert "HERMES_BULK_PROVIDER" in proc.stderr and "Traceback" not in proc.stderr
    assert fake_provider.requests == [], "nothing was sent in the other protocol"
    proc = cli("run", job_id, "--wait", check=False, **CLAUDE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [r.protocol for r in fake_provider.requests] == ["anthropic"] * 3


def test_a_schema_job_is_answered_through_the_forced_tool(backend_cli, fake_provider, tmp_path):
    cli = backend_cli
    schema = tmp_path / "schema.json"
    schema.write_text(
        json.dumps(
            {
                "type": "object",
                "properties": {"label": {"type": "string"}},
                "required": ["label"],
            }
        )
    )
    job_id = cli.json(
        "create", "Label it", "--over", str(_source(tmp_path, 3)), "--schema", str(schema),
        "--json", **CLAUDE,
    )["job_id"]  # fmt: skip
    proc = cli("run", job_id, "--wait", check=False, **CLAUDE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _rows(cli, job_id, CLAUDE)
    assert all(isinstance(json.loads(r["result"])["label"], str) for r in rows), rows
    assert [r.protocol for r in fake_provider.requests] == ["anthropic"] * 3


def test_doctor_checks_a_claude_endpoint_with_its_own_headers(cli, fake_provider):
    fake_provider.configure(require_key=cli.env["HERMES_BULK_API_KEY"])
    proc = cli("doctor", **CLAUDE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "key      accepted" in proc.stdout
    proc = cli("doctor", check=False, HERMES_BULK_API_KEY="sk-wrong-key-000", **CLAUDE)
    assert proc.returncode != 0
    assert "correct HERMES_BULK_API_KEY (or ANTHROPIC_API_KEY)" in proc.stdout + proc.stderr


def _shown_request(text: str) -> dict:
    """The request a dry run prints: the JSON after "The request for the first item"."""
    start = text.index("\n", text.index("The request for the first item")) + 1
    return json.loads(text[start:])


def test_a_claude_dry_run_shows_the_messages_request_that_is_sent(cli, fake_provider, tmp_path):
    """The dry run and the send build the request in one place: in Claude mode it is a
    Messages request (top-level system, max_tokens, the forced tool for --schema), field for
    field what the worker then sends for the same item."""
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"label": {"type": "string"}}}))
    system = tmp_path / "system.txt"
    system.write_text("Be brief.")
    flags = ["--schema", str(schema), "--system", str(system), "-o", "top_k=5"]
    src = _source(tmp_path, 1)
    shown = cli("create", "Label it", "--over", str(src), *flags, "--dry-run", "--full", **CLAUDE)
    request = _shown_request(shown.stdout)
    assert request["system"] == [{"type": "text", "text": request["system"][0]["text"]}]
    assert "Be brief." in request["system"][0]["text"]
    assert [m["role"] for m in request["messages"]] == ["user"], "no system message inside"
    assert request["max_tokens"] == 4096 and request["top_k"] == 5
    assert request["tool_choice"]["type"] == "tool" and "response_format" not in request
    job_id = cli.json("create", "Label it", "--over", str(src), *flags, "--json", **CLAUDE)[
        "job_id"
    ]
    proc = cli("run", job_id, "--wait", check=False, **CLAUDE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (sent,) = fake_provider.requests
    assert (sent.protocol, sent.body) == ("anthropic", request)


def test_an_openai_dry_run_shows_the_chat_request_that_is_sent(cli, fake_provider, tmp_path):
    src = _source(tmp_path, 1)
    shown = cli("create", "Say A", "--over", str(src), "--dry-run", "--full")
    request = _shown_request(shown.stdout)
    assert [m["role"] for m in request["messages"]] == ["system", "user"]
    assert request["max_tokens"] == 4096 and "system" not in request
    job_id = cli.create("Say A", src)
    cli("run", job_id, "--wait")
    (sent,) = fake_provider.requests
    assert (sent.protocol, sent.body) == ("openai", request)
