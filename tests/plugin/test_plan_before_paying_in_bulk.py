"""/bulk takes --instruction-file as `hermes-bulk` does, its path resolved against Hermes' working
directory like --over, and warns when --max-tokens is below the estimate (real Hermes)."""

from __future__ import annotations

from .conftest import job_id_of
from .test_bulk_plugin import wait_for_state


def test_bulk_reads_the_instruction_file_from_hermes_working_directory(
    gateway, hermes_provider, tmp_path
):
    (tmp_path / "brief.txt").write_text("Summarise in one line.\n" + "Be brief. " * 40)
    (tmp_path / "t.jsonl").write_text('{"t": "alpha"}\n{"t": "beta"}\n{"t": "gamma"}\n')
    gw = gateway(cwd=tmp_path)
    # Each item may use up to about 1,400 tokens (its bytes and max_tokens 512); the three are
    # expected to use about 2,350 (a third of a token a character, and 512 out each).
    reply = gw.bulk(
        "--instruction-file brief.txt --over t.jsonl --max-tokens 2000 --max-output-tokens 512"
    )
    job = job_id_of(reply)
    assert "Warning: --max-tokens 2000 is below the estimate" in reply, reply
    assert "Be brief. Be brief." in gw.bulk(f"show {job} 1")
    bad = gw.bulk("--instruction-file missing.txt --over t.jsonl")
    assert "--instruction-file" in bad and "cannot read it" in bad, bad


def test_bulk_dry_run_shows_the_request_and_creates_no_job(gateway, hermes_provider, tmp_path):
    (tmp_path / "t.jsonl").write_text('{"t": "alpha"}\n{"t": "beta"}\n')
    gw = gateway(cwd=tmp_path)
    reply = gw.bulk('"Summarise" --over t.jsonl --dry-run')
    assert reply.startswith("Dry run: no job created. 2 items."), reply
    assert "----- BEGIN ITEM" in reply and "Summarise" in reply
    (tmp_path / "big.txt").write_text("word " * 20_000)
    cut = gw.bulk('"Summarise" --over big.txt --dry-run')
    assert "--full shows the whole request" in cut and len(cut) < 5_000, "a screenful in a chat"
    whole = gw.bulk('"Summarise" --over big.txt --dry-run --full')
    assert whole.count("word") >= 20_000, "the whole item (the chat wraps its lines)"
    assert "No jobs" in gw.bulk("list") or "no jobs" in gw.bulk("list").lower()


def test_bulk_dry_run_counts_the_answers_it_would_reuse(gateway, hermes_provider, tmp_path):
    (tmp_path / "t.jsonl").write_text("".join(f'{{"t": "row {i}"}}\n' for i in range(4)))
    gw = gateway(cwd=tmp_path)
    job = job_id_of(gw.bulk('"Summarise" --over t.jsonl'))
    gw.bulk(f"run {job}")
    wait_for_state(gw, job, "completed")
    (tmp_path / "t.jsonl").write_text("".join(f'{{"t": "row {i}"}}\n' for i in range(6)))
    reply = " ".join(gw.bulk('"Summarise" --over t.jsonl --dry-run').split())  # unwrapped
    assert "6 items: 4 answered before (reused), 2 to run." in reply, reply
    assert "Estimated tokens for the 2 to run: " in reply and f"as job {job} learned" in reply
