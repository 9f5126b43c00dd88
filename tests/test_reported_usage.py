"""A provider's usage report is believed only when it can be a token count.

10**30 tokens once made saving every answer fail in the store (SQLite's integers stop at 2**63,
Redis's Lua numbers at 14 digits), so items that were answered, and paid for, ended failed.
Such a report (or `true`) now counts as no report: the item's reservation, its worst case, is
charged.
"""

from __future__ import annotations

import json

import pytest


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_an_absurd_usage_report_is_no_report(backend, cli, tmp_path, fake_provider, request):
    if backend == "redis":
        cli.env["HERMES_BULK_BACKEND"] = request.getfixturevalue("redis_url")
    src = tmp_path / "items.jsonl"
    src.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(5)))
    fake_provider.configure(usage={"prompt_tokens": 10**30, "completion_tokens": True})
    job_id = cli.create("Process", src)
    cli("run", job_id, "--wait", timeout=60)
    done = cli.json("status", job_id, "--json")
    assert (done["state"], done["completed"]) == ("completed", 5)
    assert (done["tokens_in"], done["tokens_out"]) == (0, 0)
    assert done["tokens_charged"] == done["worst_case_tokens"], "the worst cases are charged"
    assert len(fake_provider.requests) == 5, "each item was sent once"


@pytest.mark.parametrize(
    ("details", "cached"),
    [
        ({"cached_tokens": 40}, 40),
        ({"cached_tokens": 101}, 0),  # more cached than was sent
        ({"cached_tokens": 10**30}, 0),
        ({"cached_tokens": True}, 0),
        ({"cached_tokens": "40"}, 0),
        ({"cached_tokens": -1}, 0),
        ({}, 0),
        ([40], 0),
        ("40", 0),
        (None, 0),
    ],
)
def test_a_cache_report_is_believed_only_within_the_input(
    cli, tmp_path, fake_provider, details, cached
):
    """usage.prompt_tokens_details.cached_tokens prices input at the cached price: a count that
    is not a token count within the reported input is no report (all input at the input
    price); the item is answered all the same."""
    src = tmp_path / "items.jsonl"
    src.write_text('{"n": 1}\n')
    usage = {"prompt_tokens": 100, "completion_tokens": 10, "prompt_tokens_details": details}
    fake_provider.configure(usage=usage)
    cli.env["HERMES_BULK_PRICE"] = "1,2,0.5"  # the price a job records at create
    job_id = cli.create("Process", src)
    cli("run", job_id, "--wait", timeout=60)
    done = cli.status(job_id)
    assert (done["completed"], done["tokens_in"], done["tokens_cached"]) == (1, 100, cached)
    assert done["cost_usd"] == pytest.approx(((100 - cached) * 1 + cached * 0.5 + 10 * 2) / 1e6)
