"""What `create`, `status` and `events` say is what is so (issue 46): a batch job answered
entirely by reuse advises no worker, a batch job names no concurrency, an event says its kind
once, and counts carry thousands separators as the dashboard's do. Real CLI commands, the
loopback provider, SQLite and Redis."""

from __future__ import annotations

import re
import signal
import time

from .helpers import wait_for

#: A count of four or more digits written without its separators ("1896", not "1,896").
BARE = re.compile(r"(?<![\w,.:$/])\d{4,}(?![\w,.:])")


def _folder(tmp_path, n: int):
    folder = tmp_path / "reports"
    folder.mkdir()
    for i in range(n):
        (folder / f"r{i}.txt").write_text(f"report number {i}\n")
    return folder


def test_a_batch_job_answered_by_reuse_advises_no_worker(backend_cli, tmp_path, fake_provider):
    cli = backend_cli
    folder = _folder(tmp_path, 3)
    cli("run", cli.create("Summarise", folder), "--wait", timeout=120)
    made = cli("create", "Summarise", "--over", str(folder), "--batch").stdout
    assert "Nothing to run: the job is completed." in made, made
    assert "worker" not in made, "a completed job needs no worker"
    # The neighbour: a batch job with items to run still says who runs it.
    fresh = cli("create", "Summarise", "--over", str(folder), "--batch", "--fresh").stdout
    assert "hermes-bulk worker" in fresh, fresh


def test_a_batch_job_names_no_concurrency_a_live_job_does(cli, tmp_path):
    folder = _folder(tmp_path, 3)
    batch = cli.create("Summarise", folder, "--batch")
    text = cli("status", batch).stdout
    assert "Mode: batch" in text and "Concurrency" not in text, text
    live = cli.create("Summarise", folder, "--fresh")
    assert "Concurrency: up to 4 items at once" in cli("status", live).stdout


def test_events_say_their_kind_once_and_counts_have_separators(cli, tmp_path):
    job = cli.create("Summarise each report in three lines " * 3, _folder(tmp_path, 3))
    cli("run", job)
    cli("pause", job)
    cli("resume", job, "--max-tokens", "50000")
    cli("pause", job)
    cli("resume", job)
    events = cli("events", job).stdout
    assert re.search(r"^\S+ paused by the user$", events, re.M), events
    assert re.search(r"^\S+ resumed with --max-tokens 50000$", events, re.M), events
    assert re.search(r"^\S+ resumed$", events, re.M), events
    assert "paused: paused" not in events and "resumed: resumed" not in events, events
    status = cli("status", job).stdout
    assert re.search(r"Estimated tokens for the whole job: \d,\d{3} ", status), status
    assert "Token limit: 50,000 (0 charged, 0 reserved)" in status, status
    assert not [line for line in status.splitlines() if BARE.search(line)], status


def test_a_rate_limit_wait_names_its_zone_in_status_and_events(cli, tmp_path, fake_provider):
    """The budget's wait said "00:00 EST"; the rate limit's said "until 11:38:56", a time a
    reader on another machine of the fleet (or later, in another zone) could not place."""
    fake_provider.configure(script=["429:60"])
    job_id = cli.create("Process", _folder(tmp_path, 2), "--concurrency", "1")
    cli("run", job_id)
    worker = cli.spawn_worker("-w", "1")

    def waiting() -> str | None:
        text = cli("status", job_id).stdout
        return text if "rate limit until" in text else None

    try:
        text = wait_for(waiting, message="the rate-limit line")
    finally:
        worker.send_signal(signal.SIGINT)
        worker.wait(30)
    zone = time.strftime("%Z")
    assert re.search(rf"Waiting on a rate limit until \d\d:\d\d:\d\d {zone} \(", text), text
    events = cli("events", job_id).stdout
    assert re.search(rf"all workers wait until \d\d:\d\d:\d\d {zone}$", events, re.M), events


def test_item_counts_of_a_large_job_have_separators(cli, tmp_path):
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(f'{{"n": {i}}}\n' for i in range(1200)))
    job = cli.create("Say A", src)
    status = cli("status", job).stdout
    assert "Items: 0/1,200 completed, 0 failed, 1,200 pending, 0 running" in status, status
    assert not [line for line in status.splitlines() if BARE.search(line)], status
