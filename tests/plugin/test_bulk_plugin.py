"""/bulk in a real Hermes Agent 0.19.0: slash commands sent to `python -m tui_gateway.entry`.

Each test starts Hermes' TUI gateway on a temporary HERMES_HOME whose model is the loopback
provider, and talks to it the way the TUI does (JSON-RPC `command.dispatch`). The gateway
process stays up between commands, so what happens after a command has answered is observable.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from hermes_bulk.testing.fake_provider import digest, expected_answer

from ..helpers import job_status, local_jobs, wait_for, worker_passes
from .conftest import clean_env, config_set, job_id_of

ROOT = Path(__file__).resolve().parents[2]
REPORTS = ROOT / "examples" / "reports"


def files_of(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def completed(status: str) -> int:
    line = next(line for line in status.splitlines() if line.startswith("Items: "))
    return int(line.split()[1].split("/")[0])


def data_dir(gw) -> Path:
    """The gateway's Bulk data directory (the profile's plugin-data)."""
    return gw.home / "plugin-data" / "bulk"


def wait_for_state(
    gw, job: str, state: str, timeout: float = 60, backend: str | None = None
) -> str:
    """Wait, reading the store in this process, until the job is in `state` (as /bulk status
    words it); then /bulk status in the gateway, which must say so too."""
    with local_jobs(data_dir(gw), backend) as jobs:
        wait_for(
            lambda: job_status(jobs, job)["state"] == state.replace(" ", "_"),
            timeout=timeout,
            interval=0.05,
            message=f"job {job} to be {state}",
        )
    status = gw.bulk(f"status {job}")
    assert f"State: {state}" in status, status
    return status


def rows_jsonl(n: int, path: Path) -> Path:
    path.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(n)))
    return path


def test_bulk_end_to_end_in_hermes(gateway, hermes_home, hermes_provider, tmp_path):
    shutil.copytree(REPORTS, tmp_path / "reports")  # --over relative to where Hermes runs
    gw = gateway(cwd=tmp_path)

    created = gw.bulk('"Summarize this report in 3 bullet points" --over reports --concurrency 3')
    job = job_id_of(created)
    assert created.startswith(f"Created job {job} with 5 items.\nAt most ")  # its worst case
    assert "4,096)\nEstimated cost: unknown (" in created, created
    assert created.endswith(f"\nStart it with: /bulk run {job}")
    assert hermes_provider.requests == [], "creating a job makes no model calls"

    ran = gw.bulk(f"run {job}")
    assert ran == (
        f"Job {job} is running in the background: 5 items pending, up to 3\n"
        f"  at once.\nCheck it with: /bulk status {job}"
    )  # 72 columns: Hermes' TUI frames a reply in 6 to 7 of 80
    status = wait_for_state(gw, job, "completed")
    lines = status.splitlines()
    assert lines[:3] == [
        f"Job {job}: completed",
        "State: completed",
        "Items: 5/5 completed, 0 failed, 0 pending, 0 running",
    ]
    assert (
        lines[3].startswith("Actual tokens (reported by Hermes): ")
        and lines[3] != "Actual tokens (reported by Hermes): 0 in, 0 out"
    )
    assert lines[4].startswith("Estimated tokens for the whole job: ")
    # after the estimate, the worst case and the cost, wrapped at 80 columns
    assert "Concurrency: up to 3 items at once" in lines[5:11], lines
    assert any(line.startswith("Cost: unknown (genai-prices does not know") for line in lines)

    exported = gw.bulk(f"export {job}")
    path = hermes_home / "plugin-data" / "bulk" / "jobs" / job / "results.md"
    assert (
        " ".join(exported.split())
        == f"Exported job {job} to {path} 5 completed, 0 failed, 0 unfinished, of 5 items."
    )
    text = path.read_text()
    for name, content in files_of(REPORTS).items():
        assert f"## {name}\n\n{expected_answer(content)}\n" in text, name
    assert len(hermes_provider.requests) == 5, "one model call per item"

    gw.bulk(f"export {job} --format jsonl")
    rows = [json.loads(line) for line in path.with_suffix(".jsonl").read_text().splitlines()]
    assert {(r["provider"], r["model"]) for r in rows} == {("custom", "fake-model")}, (
        "who answered is recorded"
    )
    assert all(r["tokens_in"] and r["tokens_out"] for r in rows)
    assert gw.bulk("status").splitlines()[1].startswith(f"{job}  completed  5/5 completed")


def test_structured_answers_with_a_schema(gateway, hermes_home, hermes_provider, tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text(
        json.dumps(
            {
                "type": "object",
                "properties": {"summary": {"type": "string"}, "length": {"type": "integer"}},
                "required": ["summary", "length"],
            }
        )
    )
    src = tmp_path / "t.jsonl"
    src.write_text('{"t": "alpha"}\n{"t": "beta"}\n')
    gw = gateway()
    job = job_id_of(gw.bulk(f'"Describe it" --over {src} --schema {schema}'))
    gw.bulk(f"run {job}")
    wait_for_state(gw, job, "completed")
    gw.bulk(f"export {job} --format csv")
    path = hermes_home / "plugin-data" / "bulk" / "jobs" / job / "results.csv"
    rows = list(csv.DictReader(path.read_text(encoding="utf-8-sig").splitlines()))
    assert list(rows[0]) == [
        "item",
        "status",
        "result",
        "error",
        "tokens_in",
        "tokens_out",
        "cost_usd",
        "summary",
        "length",
    ]
    for row, item in zip(rows, ('{"t": "alpha"}', '{"t": "beta"}'), strict=True):
        assert (row["summary"], row["length"]) == ("summary:" + digest(item), str(len(item)))
    # --column names the answer's column; a schema field's name is the field's own
    gw.bulk(f"export {job} --format csv --column answer")
    named = list(csv.reader(path.read_text(encoding="utf-8-sig").splitlines()))
    assert named[0] == [
        "item",
        "status",
        "answer",
        "error",
        "tokens_in",
        "tokens_out",
        "cost_usd",
        "summary",
        "length",
    ]
    assert "choose another" in gw.bulk(f"export {job} --format csv --column summary")


def test_work_goes_on_in_the_background_and_pause_and_resume_take_effect(
    gateway, hermes_provider, tmp_path
):
    src = rows_jsonl(30, tmp_path / "rows.jsonl")
    gw = gateway(HERMES_BULK_LEASE_SECONDS="3")  # a maintenance pass a second: the quiet wait below
    job = job_id_of(gw.bulk(f'"Classify" --over {src} --concurrency 2'))

    hermes_provider.hold()  # every request waits at the provider until the test releases it
    try:
        # /bulk run answers while no item can finish: it waits for none of them.
        assert gw.bulk(f"run {job}").startswith(f"Job {job} is running in the background")
        # The work goes on after /bulk run has answered: the workers are threads in the Hermes
        # process (the first call in a process also loads Hermes' model client: a few seconds).
        hermes_provider.wait_held(2)
        assert completed(gw.bulk(f"status {job}")) == 0

        assert " ".join(gw.bulk(f"pause {job}").split()) == (  # unwrapped
            f"Job {job} paused: no new items start; items in progress may finish. "
            f"Continue with: /bulk resume {job}"
        )
        with local_jobs(data_dir(gw)) as jobs:
            # the two in progress finish; their chains find the job paused
            hermes_provider.release()
            wait_for(
                lambda: job_status(jobs, job)["running"] == 0,
                message="the items in progress to finish",
            )
            assert job_status(jobs, job)["completed"] == 2
            worker_passes(jobs, job)  # its triggers taken, and two maintenance passes since
        assert len(hermes_provider.requests) == 2, (
            "only the items in progress at the pause reached the provider"
        )
        paused = gw.bulk(f"status {job}")
        assert "State: paused" in paused and f"Continue with: /bulk resume {job}" in paused
        assert completed(paused) == 2, "items in progress finish after a pause"
    finally:
        hermes_provider.release()

    assert " ".join(gw.bulk(f"resume {job}").split()).startswith(  # unwrapped
        f"Job {job} resumed and is running in the background: 28 items pending, up to 2 at once."
    )
    wait_for_state(gw, job, "completed")
    counts = Counter(r.item for r in hermes_provider.requests)
    assert sorted(counts) == sorted(digest(json.dumps({"n": i})) for i in range(30))
    assert set(counts.values()) == {1}, "each item was sent once"


def test_a_429_is_waited_out_by_every_worker_not_failed(gateway, hermes_provider, tmp_path):
    src = rows_jsonl(3, tmp_path / "rows.jsonl")
    # Hermes retries a 429 once itself (ignoring Retry-After); the second one reaches Bulk.
    hermes_provider.configure(script=["429:2", "429:2"])
    gw = gateway()
    job = job_id_of(gw.bulk(f'"Classify" --over {src} --concurrency 1'))
    gw.bulk(f"run {job}")
    status = wait_for_state(gw, job, "completed")
    assert "Items: 3/3 completed, 0 failed" in status
    events = gw.bulk(f"events {job}").replace("\n  ", " ")  # each event on one line again
    waits = [line for line in events.splitlines() if "HTTP 429" in line]
    assert len(waits) == 1 and "all workers wait until" in waits[0], waits
    statuses = [r.status for r in hermes_provider.requests]
    assert statuses[:3] == [429, 429, 200] and statuses.count(429) == 2
    gap = hermes_provider.requests[2].at - hermes_provider.requests[1].at
    assert gap >= 1.8, (
        f"Bulk waited the provider's Retry-After (2 s) before asking again, not {gap:.2f} s"
    )


def test_after_hermes_restarts_a_job_awaits_recovery_until_run(gateway, hermes_provider, tmp_path):
    src = rows_jsonl(20, tmp_path / "rows.jsonl")
    first = gateway()
    job = job_id_of(first.bulk(f'"Classify" --over {src} --concurrency 2'))
    hermes_provider.hold()
    try:
        first.bulk(f"run {job}")
        in_flight = {r.item for r in hermes_provider.wait_requests(2)}
        hermes_provider.wait_held(2)
        first.kill()  # Hermes dies mid-job, two items in flight: its worker threads with it
    finally:
        hermes_provider.release()  # their answers go to a dead process
    assert len(hermes_provider.requests) == 2

    second = gateway()
    # Bulk starts in this Hermes with its first slash command: it returns the dead gateway's
    # items to the queue, and starts no worker (one starts with /bulk run), so nothing can send.
    status = second.bulk(f"status {job}")
    assert "State: awaiting recovery" in status and f"Continue with: /bulk run {job}" in status
    with local_jobs(data_dir(second)) as jobs:
        assert jobs.liveness.live_workers() == [], (
            "a restarted Hermes runs no worker until /bulk run"
        )
        assert (job_status(jobs, job)["state"], job_status(jobs, job)["running"]) == (
            "awaiting_recovery",
            0,
        )
    assert len(hermes_provider.requests) == 2, "a restart starts no job by itself"

    assert second.bulk(f"run {job}").startswith(f"Job {job} is running in the background")
    status = wait_for_state(second, job, "completed")
    assert "Items: 20/20 completed, 0 failed" in status
    counts = Counter(r.item for r in hermes_provider.requests)
    assert len(counts) == 20
    assert {item for item, n in counts.items() if n > 1} == in_flight, (
        "only the items in flight when Hermes died are sent again"
    )
    assert max(counts.values()) == 2


def test_answers_are_text_help_usage_errors_and_settings(
    gateway, hermes_home, hermes_provider, tmp_path
):
    config_set(hermes_home, "plugins.entries.bulk.settings.max_concurrency", "3")
    (tmp_path / "a.txt").write_text("alpha")
    gw = gateway()

    help_text = gw.bulk("")
    assert (
        help_text.startswith("Bulk: apply one instruction")
        and "/bulk run [--concurrency N] [--rpm N] [--tpm N] [--sample N]\n          JOB"
        in help_text
    )
    assert gw.bulk("help") == help_text
    assert gw.bulk("export --help").startswith("usage: /bulk export [-h] [--format {md,csv,jsonl}]")

    missing = gw.bulk('"Summarize"')
    assert missing.splitlines()[0] == "The following arguments are required: --over."
    assert "usage: /bulk create" in missing
    assert gw.bulk('"Summarize --over x').startswith(
        "Cannot read the arguments (No closing quotation)"
    )
    assert gw.bulk("status nosuchjob") == "No job 'nosuchjob'. List jobs with: /bulk list"
    assert gw.bulk(f'"Do" --over {tmp_path} --concurrency 5') == (
        "--concurrency 5 is more than max_concurrency (3); lower it, or raise\n"
        "  plugins.entries.bulk.settings.max_concurrency."
    )  # 80 columns
    # Replies wrap at 80 columns, and a long temporary path moves the break: compare the words.
    said = " ".join(gw.bulk(f'"Do" --over {tmp_path / "missing"}').split())
    assert said.startswith(f"--over {tmp_path / 'missing'}: no such file"), said
    assert gw.bulk("status") == 'No jobs yet. Create one with: /bulk "<instruction>" --over PATH'

    # A job made by `hermes-bulk create` in the same data directory calls the endpoint in
    # HERMES_BULK_*, not Hermes' model: /bulk does not run it.
    env = clean_env(
        hermes_home, HERMES_BULK_MODEL="m", HERMES_BULK_BASE_URL="http://127.0.0.1:9/v1"
    )
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "hermes_bulk",
            "create",
            "Do",
            "--over",
            str(tmp_path / "a.txt"),
            "--json",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    http_job = json.loads(cli.stdout)["job_id"]
    assert " ".join(gw.bulk(f"run {http_job}").split()) == (
        f"Job {http_job} was created by hermes-bulk create and calls the endpoint set in "
        f"HERMES_BULK_*, not Hermes' model. Process it with: hermes-bulk run {http_job} --wait"
    )
    assert "State: not started" in gw.bulk(f"status {http_job}")
    assert hermes_provider.requests == []


HIDE_ENTRY_POINT = """
import importlib.metadata as metadata, runpy, sys
_entry_points = metadata.entry_points
def entry_points(*args, **kwargs):  # as if hermes-bulk had not been installed with pip
    found = _entry_points(*args, **kwargs)
    return metadata.EntryPoints(ep for ep in found if ep.group != "hermes_agent.plugins")
metadata.entry_points = entry_points
{extra}
runpy.run_module("tui_gateway.entry", run_name="__main__", alter_sys=True)
"""


def test_directory_install(gateway, hermes_home, hermes_provider, tmp_path):
    shutil.copytree(ROOT / "plugins" / "bulk", hermes_home / "plugins" / "bulk")
    (tmp_path / "a.txt").write_text("alpha")

    gw = gateway(argv=["-c", HIDE_ENTRY_POINT.format(extra="")])
    job = job_id_of(gw.bulk(f'"Do" --over {tmp_path / "a.txt"}'))
    gw.bulk(f"run {job}")
    wait_for_state(gw, job, "completed")

    # Without the hermes-bulk package, /bulk says how to install it.
    broken = gateway(
        argv=["-c", HIDE_ENTRY_POINT.format(extra='sys.modules["hermes_bulk"] = None')]
    )
    answer = broken.bulk("status")
    assert answer.startswith("Bulk cannot start: the Python package 'hermes_bulk' is not installed")
    assert f"{sys.executable} -m pip install hermes-bulk" in answer
