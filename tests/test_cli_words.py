"""What `hermes-bulk` says, through a real process: counts, dates, ended jobs, dead workers, pipes,
narrow output, and `wait`'s exit statuses."""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import time

from hermes_bulk.frontends.views import status_text
from hermes_bulk.jobs.service import JobStatus
from hermes_bulk.store.protocol import JobRecord, JobSpec
from tests.helpers import wait_for


def _one_file(tmp_path, name="only.txt", text="the only item"):
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / name).write_text(text)
    return src


def test_one_item_is_one_item_and_a_completed_job_is_not_paused(cli, tmp_path):
    src = _one_file(tmp_path)
    created = cli("create", "Summarize", "--over", str(src), "--concurrency", "1")
    assert "with 1 item." in created.stdout and "1 items" not in created.stdout
    job = created.stdout.split()[2]
    ran = cli("run", job, "--wait")
    assert "Concurrency: up to 1 item at once" in ran.stdout
    refused = cli("pause", job, check=False)
    assert refused.returncode == 1
    assert (
        refused.stderr.strip() == f"hermes-bulk: Job {job} is already completed; nothing changed."
    )
    assert "State: completed" in cli("status", job).stdout  # and it still is


def test_a_budget_wait_into_tomorrow_gives_the_date():
    now = time.time()
    tomorrow = now + 86_400
    job = JobRecord(
        spec=JobSpec(
            job_id="j1", instruction="x", source="s", source_kind="file", concurrency=1, retries=0
        ),
        created_at=now,
        state="running",
        pause_reason=None,
        total=1,
        pending=1,
        running=0,
        completed=0,
        failed=0,
        tokens_in=0,
        tokens_out=0,
        tokens_charged=0,
        tokens_reserved=0,
        estimated_tokens=1,
        skipped=0,
        last_claim_at=None,
        run_at=now,
    )
    text = status_text(JobStatus(job, "processing", None, 1, budget_held_until=tomorrow))
    day = datetime.datetime.fromtimestamp(tomorrow).strftime("%Y-%m-%d %H:%M:%S")
    assert f"the window reopens at {day} (requests are kept for chat)" in text
    soon = now + 1
    if datetime.date.fromtimestamp(soon) == datetime.date.today():  # not run across midnight
        text = status_text(JobStatus(job, "processing", None, 1, budget_held_until=soon))
        assert f"reopens at {datetime.datetime.fromtimestamp(soon):%H:%M:%S} (" in text


def test_a_worker_killed_with_9_is_shown_as_not_answering(cli):
    worker = cli.spawn_worker(HERMES_BULK_LEASE_SECONDS="60")
    try:
        wait_for(
            lambda: "No live workers" not in cli("workers").stdout, message="the worker registers"
        )
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        # Heartbeats every 5 s (a third of the 60 s lease, at most 5 s): silent after 3 of them.
        wait_for(
            lambda: "not answering for" in cli("workers", HERMES_BULK_LEASE_SECONDS="60").stdout,
            timeout=40,
            interval=1,
            message="the dead worker is shown as not answering",
        )
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def test_output_into_a_closed_pipe_ends_quietly(cli, tmp_path):
    job = cli("create", "Summarize", "--over", str(_one_file(tmp_path))).stdout.split()[2]
    for args in (["status", job], ["list"], ["status"]):
        proc = subprocess.Popen(
            [sys.executable, "-m", "hermes_bulk", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=cli.full_env(),
        )
        proc.stdout.close()  # `| head`: the reader is gone
        stderr = proc.stderr.read().decode()
        proc.stderr.close()
        assert proc.wait(timeout=60) == 141, (args, stderr)
        assert stderr == "", (args, stderr)


def test_list_into_a_pipe_keeps_every_column_whole(cli, tmp_path):
    job = cli(
        "create",
        "Summarize each report in three short bullet points",
        "--over",
        str(_one_file(tmp_path)),
    ).stdout.split()[2]
    listed = cli("list", COLUMNS="80").stdout
    row = next(line for line in listed.splitlines() if job in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[1:5] == ["not started", "0/1", "0", "?"], listed  # done/total, failed, cost


def test_wait_exits_by_how_the_job_ended(cli, tmp_path, fake_provider):
    src = _one_file(tmp_path)
    job = cli("create", "Summarize", "--over", str(src)).stdout.split()[2]
    started = time.monotonic()
    timed_out = cli("wait", job, "--timeout", "1", check=False)
    assert timed_out.returncode == 124 and time.monotonic() - started < 30
    assert (
        timed_out.stderr.strip()
        == f"hermes-bulk: job {job} has not ended after 1 s (it is not started)."
    )

    cli("run", job)
    worker = cli.spawn_worker("--burst")
    try:
        done = cli("wait", job, "--timeout", "60", check=False)
    finally:
        worker.wait(timeout=60)
    assert done.returncode == 0, done.stderr
    assert "State: completed" in done.stdout

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "a.txt").write_text("PERMANENT-400 item")
    fake_provider.configure(item_faults={"PERMANENT-400": "400"})
    failed = cli("create", "Summarize", "--over", str(bad)).stdout.split()[2]
    cli("run", failed, "--wait", check=False)
    assert cli("wait", failed, check=False).returncode == 1

    # --fresh: the first job answered this file, and a reused job is completed at create.
    paused = cli("create", "Summarize", "--over", str(src), "--fresh").stdout.split()[2]
    cli("pause", paused)
    assert cli("wait", paused, check=False).returncode == 4
