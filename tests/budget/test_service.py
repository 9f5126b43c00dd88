"""Budget, the service every front end uses: settings follow budget.json, and accounting fails
open."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time

import pytest

from hermes_bulk.budget.ledger import CallRecord
from hermes_bulk.budget.policy import ALLOWED, FAILED_OPEN, HELD
from hermes_bulk.budget.report import as_dict, status_text
from hermes_bulk.budget.service import HELD_FOR_JOB_LIMIT, HELD_FOR_WINDOW, Budget
from hermes_bulk.budget.settings import LEDGER_ENV, BudgetSettings
from tests.conftest import RedisServer


@pytest.fixture
def budget_dir(tmp_path, monkeypatch):
    monkeypatch.delenv(LEDGER_ENV, raising=False)
    return tmp_path / "cron-budget"


@pytest.fixture
def budget(budget_dir):
    b = Budget(budget_dir)
    yield b
    b.close()


def cron(run="r1", job="job1"):
    return CallRecord(
        "cron", profile="default", job_id=job, job_name="digest", run_id=run, model="m"
    )


def enforce(budget, daily_limit="3", chat_reserve="1", **more):
    f = budget.settings_file
    f.set("mode", "enforce")
    f.set("chat_reserve", chat_reserve)  # first: the default reserve (300) is above a small limit
    f.set("daily_limit", daily_limit)
    for key, value in more.items():
        f.set(key, value)


def test_a_set_in_another_process_reaches_a_running_budget_at_its_next_call(budget, budget_dir):
    assert budget.admit(cron()).decision == ALLOWED  # observe, defaults
    other = Budget(budget_dir)  # another process, as far as the file is concerned
    enforce(other, daily_limit="2", chat_reserve="1")
    assert budget.admit(cron(run="r2")).decision == HELD
    other.close()


def test_the_first_held_run_of_a_job_is_told_apart_from_later_ones(budget):
    enforce(budget)
    budget.admit(cron(run="r0"))
    budget.admit(cron(run="r0"))
    first = budget.admit(cron(run="r1"))
    assert first.held and first.first_held_run and first.held_because == HELD_FOR_WINDOW
    assert budget.admit(cron(run="r1")).first_held_run  # the same run, asking again, still explains
    assert not budget.admit(cron(run="r2")).first_held_run
    assert budget.admit(cron(run="r3", job="job2")).first_held_run  # another job has its own first


def test_a_job_held_by_job_limit_says_so(budget):
    enforce(budget, daily_limit="100", chat_reserve="10", job_limit="1")
    budget.admit(cron(run="r0"))
    outcome = budget.admit(cron(run="r1"))
    assert outcome.held and outcome.held_because == HELD_FOR_JOB_LIMIT


@pytest.mark.alone  # bounds a latency
def test_a_ledger_locked_for_long_lets_the_call_through_and_status_warns_until_the_window_ends(
    budget, budget_dir
):
    budget.admit(CallRecord("chat"))  # creates the ledger
    blocker = sqlite3.connect(budget_dir / "ledger.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        outcome = budget.admit(cron())
        assert outcome.decision == FAILED_OPEN and not outcome.held
        assert time.monotonic() - started < 2.0
        # Moments later the ledger is left alone: no second wait on the lock.
        started = time.monotonic()
        assert budget.admit(cron()).decision == FAILED_OPEN
        assert time.monotonic() - started < 0.1
    finally:
        blocker.execute("ROLLBACK")
    report = budget.report()
    assert report.failopen is not None and report.failopen.calls == 2
    assert (
        "is not answering (database is locked)" in report.failopen.reason
    )  # the cause, not "skipped"
    text = " ".join(status_text(report).split())  # unwrapped
    assert "⚠ Accounting failed 2 times in this window" in text
    assert "went through uncounted" in text
    later = Budget(budget_dir, clock=lambda: time.time() + 86_400)  # the next window starts clean
    assert later.report().failopen is None
    later.close()


@pytest.mark.alone  # bounds a latency
def test_a_first_call_fails_open_within_a_second_on_a_locked_ledger_and_opens_it_later(
    budget_dir,
):
    first = Budget(budget_dir)
    first.admit(CallRecord("chat"))  # the ledger exists (and is migrated)
    first.close()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys, time\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('BEGIN IMMEDIATE'); print('locked', flush=True); time.sleep(60)",
            str(budget_dir / "ledger.db"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    now = [time.time()]
    fresh = Budget(budget_dir, clock=lambda: now[0])  # a new process: the ledger is not open yet
    try:
        assert holder.stdout.readline().strip() == "locked"
        started = time.monotonic()
        assert fresh.admit(cron()).decision == FAILED_OPEN
        assert (
            time.monotonic() - started < 2.0
        )  # was 10 s: the open waited longer than an admission
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    now[0] += 3  # past RETRY_AFTER_S: the ledger is opened again, and counts
    assert fresh.admit(cron()).decision == ALLOWED
    assert fresh.report().counts.by_class()["cron"] == 1
    fresh.close()


def test_a_redis_ledger_that_goes_down_fails_open_and_counts_again_once_it_is_back(
    tmp_path, budget_dir, monkeypatch
):
    server = RedisServer(tmp_path).start()
    now = [time.time()]
    b = Budget(budget_dir, clock=lambda: now[0])
    try:
        b.settings_file.set("ledger", server.url + "?prefix=failover")
        b.settings_file.set("mode", "enforce")
        assert b.admit(cron()).decision == ALLOWED
        server.kill()
        assert b.admit(CallRecord("chat")).decision == FAILED_OPEN
        report = b.report()
        assert report.counts is None and "Redis" in report.ledger_error
        assert "⚠ Accounting failed" in status_text(report)
        server.start()
        now[0] += 3  # past RETRY_AFTER_S
        assert b.admit(cron(run="r2")).decision == ALLOWED
        assert b.report().counts.total == 2
    finally:
        b.close()
        server.kill()


def test_a_broken_budget_json_fails_open_and_status_shows_the_defaults_error_and_warning(
    budget, budget_dir
):
    from hermes_bulk.budget.commands import run_budget_command
    from hermes_bulk.budget.grammar import add_budget_arguments
    from hermes_bulk.usage import Parser

    budget_dir.mkdir(parents=True)
    (budget_dir / "budget.json").write_text(
        json.dumps({"mode": "enforce", "timezone": "Asia/Tokyo", "daily_limit": "lots"})
    )
    assert budget.admit(cron()).decision == FAILED_OPEN
    report = budget.report()  # status still works
    assert (
        report.settings == BudgetSettings()
        and "daily_limit 'lots' is not a whole number" in report.settings_error
    )
    assert report.failopen is not None and report.failopen.calls == 1  # the warning is found
    text = " ".join(status_text(report).split())  # unwrapped
    assert "⚠ Accounting failed 1 time in this window" in text
    assert "⚠ Settings cannot be read, so calls go through uncounted until they can: " in text
    assert "fix it with: hermes cron-budget set daily_limit VALUE." in text
    assert "Settings (defaults, not in budget.json): mode=observe, daily_limit=1000" in text
    assert as_dict(report)["settings_error"] == report.settings_error

    parser = Parser(prog="hermes cron-budget")
    add_budget_arguments(parser)
    status, reply = run_budget_command(
        parser.parse_args(["set", "daily_limit", "500"]), budget, prog="hermes cron-budget"
    )
    assert (status, reply) == (
        0,
        "daily_limit = 500",
    )  # set repairs the bad key and keeps the others
    assert budget.settings().mode == "enforce" and budget.settings().timezone == "Asia/Tokyo"
    assert budget.report().settings_error is None

    (budget_dir / "budget.json").write_text("{not json")
    status, reply = run_budget_command(
        parser.parse_args(["set", "mode", "observe"]), budget, prog="hermes cron-budget"
    )
    assert (
        status == 1
        and "budget.json is not valid JSON (Expecting property name enclosed in double quotes at "
        "line 1, column 2); fix it by hand, or delete it (rm "
        in " ".join(reply.split())  # unwrapped
    )
    assert (budget_dir / "budget.json").read_text() == "{not json"  # nothing changed


def test_background_work_is_reported_held_until_the_window_ends_only_in_enforce_mode(budget):
    enforce(budget, daily_limit="2", chat_reserve="1")
    assert budget.background_held_until("m") is None
    budget.admit(CallRecord("chat"))
    window = budget.window(budget.settings())
    assert budget.background_held_until("m") == window.end_s
    budget.settings_file.set("models", "*:free")
    assert budget.background_held_until("m") is None  # that model does not count
    budget.settings_file.set("models", "*")
    budget.settings_file.set("mode", "observe")
    assert budget.background_held_until("m") is None
