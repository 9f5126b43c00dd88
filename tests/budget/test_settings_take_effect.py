"""The budget as it is now: a budget set while a worker runs holds that worker's next request;
ledger paths are absolute; times a user reads carry the budget's zone."""

from __future__ import annotations

import json
import signal

from hermes_bulk.budget.service import Budget
from hermes_bulk.budget.settings import LEDGER_ENV, SettingsFile, budget_dir, ledger_location

from ..helpers import wait_for


def _items(path, n: int):
    """n records no other job has (answers are reused across jobs)."""
    path.write_text("".join(json.dumps({"n": i, "of": path.stem}) + "\n" for i in range(n)))
    return path


def test_a_budget_set_while_a_worker_runs_holds_its_next_bulk_request_at_the_cap(
    cli, tmp_path, fake_provider
):
    root = tmp_path / "hermes-root"
    env = {"HERMES_HOME": str(root)}
    worker = cli.spawn_worker("-w", "2", **env)
    try:
        # The worker serves a job before any budget exists: nothing is charged, nothing held.
        before = cli.create("Process", _items(tmp_path / "a.jsonl", 2))
        cli("run", before)
        wait_for(
            lambda: cli.json("status", before, "--json", **env)["state"] == "completed",
            timeout=60,
            message="the job before the budget completes",
        )
        assert not (budget_dir(root) / "ledger.db").exists()
        for key, value in (
            ("timezone", "Asia/Tokyo"),
            ("reset", "09:00"),
            ("chat_reserve", "1"),
            ("daily_limit", "6"),
            ("mode", "enforce"),
        ):
            cli("budget", "set", key, value, **env)
        job = cli.create("Process", _items(tmp_path / "b.jsonl", 10), "--concurrency", "2")
        cli("run", job)
        wait_for(
            lambda: cli.json("status", job, "--json", **env)["budget_held_until"],
            timeout=60,
            message="the job held by the budget",
        )
        # One status reads the job's counts before the budget, so a read that saw the hold may
        # hold counts from before the worker took the items it charged: only a read begun after the
        # hold was seen has every charged item as running or done.
        status = wait_for(
            lambda: (s := cli.json("status", job, "--json", **env))["running"] == 0 and s,
            timeout=60,
            message="the items charged before the hold are done",
        )
        text = cli("status", job, **env).stdout
    finally:
        worker.send_signal(signal.SIGINT)
        worker.wait(30)
    assert (status["completed"], status["failed"]) == (5, 0)
    assert len(fake_provider.requests) == 2 + 5, "the worker sent nothing past the cap of 5"
    from hermes_bulk.budget.windows import ZonedInstant

    budget = Budget(budget_dir(root))
    try:
        counts = budget.report().counts
        reopens = ZonedInstant(budget.window(budget.settings()).end_s, "Asia/Tokyo").shown()
    finally:
        budget.close()
    assert counts.by_class()["bulk"] == 5 and counts.by_class()["auxiliary"] == 0
    # "09:00 JST" when that is later today in Tokyo, else with its day before it.
    assert reopens == "09:00 JST" or reopens.endswith(" 09:00 JST"), reopens
    assert f"Waiting for the request budget: the window reopens at {reopens} " in text


def test_a_relative_ledger_path_is_made_absolute_against_the_root_hermes_home(
    tmp_path, monkeypatch
):
    root = tmp_path / "root"
    directory = budget_dir(root)
    monkeypatch.chdir(tmp_path)
    settings = SettingsFile(directory).set("ledger", "local")
    assert settings.ledger == str(root / "local")
    assert json.loads((directory / "budget.json").read_text())["ledger"] == str(root / "local")
    assert SettingsFile(directory).set("ledger", "sqlite:///shared/ledger.db").ledger == str(
        root / "shared/ledger.db"
    )
    assert SettingsFile(directory).set("ledger", "/abs/ledger.db").ledger == "/abs/ledger.db"
    # A budget.json an older version wrote, with the path as it was given: read the same way.
    (directory / "budget.json").write_text(json.dumps({"ledger": "older.db"}))
    assert SettingsFile(directory).load().ledger == str(root / "older.db")
    monkeypatch.delenv(LEDGER_ENV, raising=False)
    assert ledger_location(SettingsFile(directory).load(), directory) == str(root / "older.db")
    monkeypatch.setenv(LEDGER_ENV, "from-env.db")
    assert ledger_location(SettingsFile(directory).load(), directory) == str(root / "from-env.db")


def test_a_zoned_instant_is_a_number_to_code_and_a_time_with_its_zone_to_a_reader():
    from hermes_bulk.budget.windows import ZonedInstant

    at = 1_795_996_800  # 2026-11-30 00:00 UTC
    instant = ZonedInstant(at, "Asia/Tokyo")
    assert instant == at and json.dumps({"t": instant}) == '{"t": 1795996800.0}'
    assert instant.shown(now_s=at) == "09:00 JST"
    assert instant.shown(now_s=at - 86_400) == "2026-11-30 09:00 JST"
