"""`/bulk wait` in real Hermes Agent 0.19.0: `wait` is a command of the CLI, and `/bulk wait`
was "invalid choice". It waits as long as a reply may, then says the job has not ended and that
a notice follows."""

from __future__ import annotations

import json
import re
import time

from .conftest import job_id_of


def test_bulk_wait_answers_within_the_reply_limit(gateway, hermes_provider, tmp_path):
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(3)))
    gw = gateway()
    job = job_id_of(gw.bulk(f'"Summarize" --over {src}'))
    assert gw.bulk(f"wait {job}") == (
        f"Job {job} is not started: start it with: /bulk run {job}"
    ), "said at once, not after the reply's limit"
    hermes_provider.configure(latency_s=4)
    gw.bulk(f"run {job}")
    started = time.monotonic()
    early = gw.bulk(f"wait {job} --timeout 1")
    assert time.monotonic() - started < 10, "it gave up at its --timeout"
    assert re.fullmatch(
        rf"Job {job} is still processing after 1 s: 0/3 completed, 0 failed\.\n"
        rf"A notice follows when it ends; check it with: /bulk status {job}",
        early,
    ), early
    done = gw.bulk(f"wait {job}")
    assert done.startswith(f"Job {job}: completed\nState: completed\nItems: 3/3 completed"), done
    assert all(len(line) <= 80 for line in done.splitlines()), done
    assert "wait" in gw.bulk("help"), "the help offers it"
