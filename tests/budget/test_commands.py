"""`status` and `set` as people see them: `hermes-bulk budget …` and the `/cron-budget` reply."""

from __future__ import annotations

import json

import pytest

from hermes_bulk.budget.commands import slash
from hermes_bulk.budget.ledger import CallRecord
from hermes_bulk.budget.report import use_bar
from hermes_bulk.budget.service import Budget
from hermes_bulk.budget.settings import LEDGER_ENV, budget_dir


@pytest.fixture
def root(env, tmp_path, monkeypatch):
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "hermes"))
    monkeypatch.delenv(LEDGER_ENV, raising=False)
    env["HERMES_HOME"] = str(tmp_path / "hermes")
    return tmp_path / "hermes"


@pytest.fixture
def budget(root):
    b = Budget(budget_dir())
    yield b
    b.close()


def fill(budget: Budget) -> None:
    f = budget.settings_file
    f.set("chat_reserve", "2")
    f.set("daily_limit", "6")
    f.set("mode", "enforce")
    for profile in ("default", "work"):
        budget.admit(CallRecord("chat", profile=profile, model="m"))
    for run in ("r1", "r1", "r2"):
        budget.admit(
            CallRecord(
                "cron",
                profile="default",
                job_id="a1b2c3d4e5f6",
                job_name="morning digest",
                run_id=run,
                model="m",
            )
        )
    budget.admit(CallRecord("bulk", profile="host-a", job_id="29b74c4db08b", model="m"))


def test_the_use_bar_fills_with_use_and_marks_where_background_work_stops():
    assert use_bar(0, 10, 7, width=10) == "░░░░░░░│░░"
    assert use_bar(5, 10, 7, width=10) == "█████░░│░░"
    assert use_bar(8, 10, 7, width=10) == "███████┃░░"
    assert use_bar(20, 10, 7, width=10) == "██████████"[:7] + "┃" + "██"


def test_status_shows_the_window_the_use_bar_classes_profiles_and_each_jobs_runs(budget):
    fill(budget)
    text = slash("status", budget)
    assert "Cron budget: enforce mode" in text
    assert "Window: " in text and "resets in" in text
    assert "Used: 4 of 6 requests [" in text and "] 67%" in text
    assert "Cron and bulk stop at 4 (2 kept for chat); 0 left for them" in text
    assert "By class: chat 2, cron 2, auxiliary 0, bulk 0\nRequests held: 2, would-block: 0" in text
    assert "By profile: default 3, work 1" in text
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("job "))
    assert lines[header].split() == [
        "job",
        "name",
        "class",
        "requests",
        "held",
        "runs",
        "would-block",
    ]
    rows = {line.split()[0]: line for line in lines[header + 2 : header + 4]}
    assert rows["a1b2c3d4e5f6"].split()[-3:] == [
        "2",
        "1",
        "0",
    ]  # 2 requests, 1 held run (r2), 0 would-block
    assert "morning digest" in rows["a1b2c3d4e5f6"]
    assert rows["29b74c4db08b"].split()[-3:] == ["0", "1", "0"]
    assert "Settings: mode=enforce, daily_limit=6, chat_reserve=2" in text


def test_the_slash_command_explains_its_usage_in_one_reply(budget):
    assert "status" in slash("help", budget) and "set" in slash("help", budget)
    reply = " ".join(slash("frobnicate", budget).split())  # unwrapped
    assert (
        reply.startswith("/cron-budget: ")
        and "Usage: /cron-budget [status | set KEY VALUE | path]" in reply
    )
    assert slash('set reset "9', budget).startswith("/cron-budget: cannot read the arguments")
    assert slash("set timezone Europe/Berlin", budget) == "timezone = Europe/Berlin"
    assert slash("set timezone Nowhere", budget).startswith(
        "/cron-budget: timezone 'Nowhere' is not an IANA"
    )
    assert slash("", budget).startswith("Cron budget: observe mode")


def test_hermes_bulk_budget_works_on_a_machine_without_hermes(cli, root):
    assert cli("budget", "set", "mode", "enforce").stdout.strip() == "mode = enforce"
    bad = cli("budget", "set", "chat_reserve", "5000", check=False)
    assert bad.returncode == 1
    assert " ".join(bad.stderr.split()) == (
        "hermes-bulk budget: chat_reserve (5000) is above daily_limit (1000); "
        "lower chat_reserve or raise daily_limit first."
    )
    unknown = cli("budget", "set", "colour", "blue", check=False)
    assert unknown.returncode == 1 and "Unknown setting 'colour'" in unknown.stderr
    data = json.loads(cli("budget", "status", "--json").stdout)
    assert data["mode"] == "enforce" and data["used"] == 0 and data["background_cap"] == 700
    assert cli("budget", "path").stdout.strip() == str(root / "plugin-data" / "cron-budget")
    assert "Cron budget: enforce mode" in cli("budget").stdout


def test_moving_the_reset_time_says_that_counting_starts_afresh_in_the_new_window(budget):
    fill(budget)
    hour = budget.window(budget.settings()).start_local.hour
    reply = " ".join(slash(f"set reset {(hour + 12) % 24:02d}:00", budget).split())
    assert (
        "the 4 requests counted so far stay with the old window, and counting starts afresh"
        in reply
    )


def test_setting_an_unreachable_redis_ledger_is_saved_with_a_warning(budget):
    from hermes_bulk.testing.sentinels import free_port

    reply = slash(f"set ledger redis://127.0.0.1:{free_port()}/0", budget)
    assert reply.splitlines()[0].startswith("ledger = redis://127.0.0.1:")
    reply = " ".join(reply.split())
    assert (
        "Warning: the ledger cannot be used now" in reply and "calls go through uncounted" in reply
    )
    assert budget.settings().ledger.startswith("redis://")


def test_setting_a_reachable_redis_ledger_moves_counting_there(budget, redis_url):
    assert slash(f"set ledger {redis_url}", budget).count("\n") == 0
    budget.admit(CallRecord("chat"))
    assert budget.report().counts.total == 1 and budget.report().ledger.startswith("redis://")


def test_every_line_of_status_set_and_help_fits_a_chat_reply(budget):
    """Issue 46, 13: status drew lines of 150 columns (the settings, a fail-open note, the window
    with its zone's name); each is a /cron-budget reply too, which Hermes' TUI shows in a pager
    6 columns narrower than the terminal. Every line: at most 72, whatever the content."""
    f = budget.settings_file
    f.set("timezone", "America/Argentina/ComodRivadavia")
    f.set("models", "*:free,gpt-4o-mini,claude-3-5-haiku-*,meta-llama/llama-3.1-8b-instruct")
    fill(budget)
    budget.admit(CallRecord("cron", job_id="b" * 12, job_name="Morning digest of every feed " * 3))
    budget.admit(CallRecord("chat", profile="a-profile-with-a-rather-long-name", model="x"))
    budget.notes.note(budget.window(budget.settings()).start_s, "the ledger is not answering " * 4)
    for text in (
        slash("status", budget),
        slash("help", budget),
        slash("set models gpt-4o-mini,claude-3-5-haiku-*,meta-llama/llama-3.1-8b-*", budget),
        slash("set daily_limit lots-and-lots-of-requests-every-day", budget),
    ):
        # one word longer than a line (the models' globs) stays whole, to be copied
        wide = [line for line in text.splitlines() if len(line) > 72 and " " in line.strip()]
        assert not wide, text
    status = slash("status", budget)
    assert "Morning digest o…  cron" in status  # a long name ends in "…", its row one line
    assert "Settings: mode=enforce, daily_limit=6, chat_reserve=2" in status
