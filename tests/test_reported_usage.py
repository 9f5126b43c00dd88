"""A provider's usage report is believed only when it can be a token count.

10**30 tokens once made saving every answer fail in the store (SQLite's integers stop at 2**63,
Redis's Lua numbers at 14 digits), so items that were answered, and paid for, ended failed.
Such a report (or `true`) now counts as no report: the item's estimate is charged.
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
    assert done["tokens_charged"] == done["estimated_tokens"], "the estimates are charged instead"
    assert len(fake_provider.requests) == 5, "each item was sent once"
