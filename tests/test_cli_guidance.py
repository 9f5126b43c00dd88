"""Guidance that is true at the terminal, each through real
`hermes-bulk` processes on a real SQLite file and the loopback provider: advice that says what is
missing instead of going in a circle, progress into a log, `delete` that asks a person, and a
/metrics page that shows what docs/operations.md says it shows."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from hermes_bulk.testing.sentinels import free_port
from tests.conftest import ROOT
from tests.helpers import kill_worker_holding_an_item, wait_for


def rows(n: int, path: Path) -> Path:
    path.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(n)))
    return path


def live_workers(cli, job: str) -> int:
    return cli.status(job)["live_workers"]


def stop(worker: subprocess.Popen) -> None:
    worker.send_signal(signal.SIGINT)
    worker.wait(30)


# 1. Advice that says what is missing
# ---------------------------------------------------------------


def test_with_no_live_worker_run_and_status_say_a_worker_is_missing(cli, tmp_path, fake_provider):
    job = cli.create("Classify", rows(3, tmp_path / "rows.jsonl"))
    ran = cli("run", job).stdout
    assert (
        f"No worker is live; start one for this job's endpoint: hermes-bulk worker, "
        f"or process it here: hermes-bulk run {job} --wait."
    ) in " ".join(ran.split()), "run and status say the same"
    status = cli("status", job).stdout
    assert "State: waiting for a worker" in status  # run, never picked up: nothing to recover
    assert (
        f"No worker is live; start one for this job's endpoint: hermes-bulk worker, "
        f"or process it here: hermes-bulk run {job} --wait"
    ) in status
    assert f"Continue with: hermes-bulk run {job}" not in status.splitlines(), (
        "run alone changes nothing here"
    )

    cli("pause", job)
    resumed = cli("resume", job).stdout
    assert resumed.startswith(
        f"Job {job} resumed and waits for a worker: 3 items pending. No worker is live; start "
        "one for this job's endpoint: hermes-bulk worker"
    ), resumed

    worker = cli.spawn_worker()
    try:
        wait_for(lambda: cli.status(job)["state"] == "completed", timeout=60, message="completion")
        second = cli.create(
            "Classify", rows(2, tmp_path / "two.jsonl"), "--fresh"
        )  # the first job answered them
        ran = cli("run", second).stdout
        assert "1 live worker picks it up." in ran and "start one with" not in ran, ran
    finally:
        stop(worker)


def test_a_job_cut_off_mid_run_asks_for_run_and_a_worker_until_one_is_live(
    cli, tmp_path, fake_provider
):
    job = cli.create("Classify", rows(3, tmp_path / "rows.jsonl"), "--concurrency", "1")
    cli("run", job)
    kill_worker_holding_an_item(cli, fake_provider)
    status = cli("status", job).stdout
    assert "No worker is live. Items that were in progress when its workers stopped" in status
    assert (
        f"Continue with: hermes-bulk run {job} --wait, or start hermes-bulk worker and then: "
        f"hermes-bulk run {job}"
    ) in status

    worker = cli.spawn_worker()
    try:
        wait_for(lambda: live_workers(cli, job) == 1, timeout=30, message="the new worker is live")
        status = cli("status", job).stdout
        # A worker that starts alone does not restart a job cut off mid-run (invariant 9): run does.
        assert "it waits to be run again (1 live worker now)." in status, status
        assert f"Continue with: hermes-bulk run {job}" in status.splitlines(), status
        assert "1 live worker picks it up." in cli("run", job).stdout
        wait_for(lambda: cli.status(job)["state"] == "completed", timeout=60, message="completion")
    finally:
        stop(worker)


# 2. Progress without a terminal
# --------------------------------------------------------------------

PROGRESS = r"job {job}: \d+/{total} done, 0 failed, processing, \d+\.\d items/s, about \d+ s left"


def test_run_wait_into_a_log_prints_plain_progress_lines(cli, tmp_path, fake_provider):
    fake_provider.configure(latency_s=0.3)
    job = cli.create(
        "Classify", rows(40, tmp_path / "rows.jsonl"), "--concurrency", "2"
    )  # 6 s or more
    proc = cli("run", job, "--wait", "-w", "2")  # stderr and stdout are pipes, as in CI
    lines = proc.stderr.splitlines()
    assert lines and all(
        re.fullmatch(PROGRESS.format(job=job, total=40), line) for line in lines
    ), proc.stderr
    assert "━" not in proc.stderr, "no bar into a pipe"
    assert "Items: 40/40 completed, 0 failed, 0 pending, 0 running" in proc.stdout


def test_status_watch_prints_lines_into_a_log_and_only_json_with_json(cli, tmp_path, fake_provider):
    fake_provider.configure(latency_s=0.3)
    job = cli.create(
        "Classify", rows(60, tmp_path / "rows.jsonl"), "--concurrency", "2"
    )  # 9 s or more
    worker = cli.spawn_worker("-w", "2")
    try:
        wait_for(lambda: live_workers(cli, job) == 1, timeout=30, message="the worker is live")
        cli("run", job)
        cmd = [sys.executable, "-m", "hermes_bulk", "status", job, "--watch"]
        plain = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli.full_env()
        )
        as_json = subprocess.Popen(
            [*cmd, "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli.full_env(),
        )
        out, err = plain.communicate(timeout=120)
        json_out, json_err = as_json.communicate(timeout=120)
    finally:
        stop(worker)
    assert err.splitlines() and all(
        re.fullmatch(PROGRESS.format(job=job, total=60), line) for line in err.splitlines()
    ), err
    assert "State: completed" in out
    assert json_err == "", "with --json: no bar and no progress lines"
    assert json.loads(json_out)["state"] == "completed"


# 9. delete asks a person, not a script
# -------------------------------------------------------------


def delete(cli, job: str, *flags: str, answer: str | None = None) -> subprocess.CompletedProcess:
    """`hermes-bulk delete`, with standard input a pseudo-terminal answering `answer` (or no
    terminal)."""
    cmd = [sys.executable, "-m", "hermes_bulk", "delete", job, *flags]
    if answer is None:
        return subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=cli.full_env(),
            timeout=60,
        )
    import pty

    controller, terminal = pty.openpty()
    try:
        proc = subprocess.Popen(
            cmd,
            stdin=terminal,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli.full_env(),
        )
        os.write(
            controller, answer.encode() + b"\n"
        )  # held by the terminal until the question reads it
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(terminal)
        os.close(controller)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def exists(cli, job: str) -> bool:
    return cli("status", job, check=False).returncode == 0


def test_delete_asks_on_a_terminal_and_not_in_a_script(cli, tmp_path):
    job = cli.create("Classify", rows(3, tmp_path / "rows.jsonl"))
    question = f"Delete job {job} (3 items, its results and folder)? [y/N]"

    kept = delete(cli, job, answer="n")
    assert kept.returncode == 0 and question in kept.stderr and f"Kept job {job}." in kept.stderr
    assert kept.stdout == "" and exists(cli, job)

    gone = delete(cli, job, answer="y")
    assert (
        question in gone.stderr and gone.stdout == f"Deleted job {job}.\n" and not exists(cli, job)
    )

    on_terminal = cli.create("Classify", rows(3, tmp_path / "b.jsonl"))
    skipped = delete(
        cli, on_terminal, "--yes", answer="n"
    )  # --yes: the answer waiting is never read
    assert "[y/N]" not in skipped.stderr and skipped.stdout == f"Deleted job {on_terminal}.\n"

    scripted = cli.create("Classify", rows(3, tmp_path / "c.jsonl"))
    proc = delete(cli, scripted)  # no terminal: proceeds as it always did
    assert (
        proc.returncode == 0 and proc.stderr == "" and proc.stdout == f"Deleted job {scripted}.\n"
    )
    assert not exists(cli, scripted)


# 9. /metrics shows what its docs say --------------------------------------------------------------


def documented_metrics() -> list[str]:
    text = (
        (ROOT / "docs" / "operations.md").read_text().split("## Metrics", 1)[1].split("\n## ", 1)[0]
    )
    return re.findall(r"`(hermes_bulk_\w+)", text)


def test_metrics_page_shows_the_documented_metrics_and_only_running_jobs(
    cli, tmp_path, fake_provider
):
    done = cli.create("Classify", rows(2, tmp_path / "done.jsonl"))
    fake_provider.configure(latency_s=0.5)
    running = cli.create("Classify", rows(20, tmp_path / "running.jsonl"), "--concurrency", "1")
    paused = cli.create("Classify", rows(2, tmp_path / "paused.jsonl"))
    port = free_port()
    worker = cli.spawn_worker("-w", "2", "--metrics-port", str(port))
    try:
        wait_for(lambda: live_workers(cli, done) == 1, timeout=30, message="the worker is live")
        cli("run", done)
        wait_for(lambda: cli.status(done)["state"] == "completed", timeout=60, message="done")
        cli("pause", paused)  # never run: no items of it on the page
        cli("run", running)
        wait_for(lambda: cli.status(running)["completed"] >= 1, timeout=60, message="progress")
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        stop(worker)
    names = documented_metrics()
    assert len(names) == 9, names
    for name in names:
        assert f"# TYPE {name} " in page, f"docs/operations.md lists {name}; the page lacks it"
    assert {m.group(1) for m in re.finditer(r'hermes_bulk_job_items\{job="(\w+)"', page)} == {
        running
    }, page
    for state in ("pending", "running", "completed", "failed"):
        assert f'hermes_bulk_job_items{{job="{running}",state="{state}"}} ' in page
