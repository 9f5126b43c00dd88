"""A bulk job under an enforced cron budget waits for the next window instead of failing items."""

from __future__ import annotations

import datetime
import json
import signal
from zoneinfo import ZoneInfo

from hermes_bulk.budget.settings import machine_zone

from ..helpers import wait_for


def test_a_bulk_job_stops_at_the_background_cap_and_says_it_waits_for_the_window(
    cli, tmp_path, fake_provider
):
    root = tmp_path / "hermes-root"
    env = {"HERMES_HOME": str(root)}
    for key, value in (("chat_reserve", "2"), ("daily_limit", "10"), ("mode", "enforce")):
        cli("budget", "set", key, value, **env)
    src = tmp_path / "items.jsonl"
    src.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(20)))
    job_id = cli.create("Process", src, "--concurrency", "2")
    cli("run", job_id)
    worker = cli.spawn_worker("-w", "2", **env)
    try:
        wait_for(
            lambda: "Waiting for the request budget" in cli("status", job_id, **env).stdout,
            timeout=60,
            message="the budget line in status",
        )
        status = cli.json("status", job_id, "--json", **env)
        text = cli("status", job_id, **env).stdout
    finally:
        worker.send_signal(signal.SIGINT)
        worker.wait(30)
    assert (status["state"], status["completed"], status["failed"]) == ("processing", 8, 0)
    assert status["budget_held_until"] is not None
    # The window (reset 00:00, machine zone) reopens tomorrow: the line gives the date and the zone.
    zone = ZoneInfo(machine_zone())
    reopens = datetime.datetime.fromtimestamp(status["budget_held_until"], zone)
    assert reopens.date() > datetime.datetime.now(zone).date()
    assert (
        f"Waiting for the request budget: the window reopens at {reopens:%Y-%m-%d %H:%M %Z} "
        in text
    )
    assert len(fake_provider.requests) == 8, "the cap (daily_limit - chat_reserve) is not crossed"
    report = cli("budget", "status", **env).stdout
    assert "bulk" in report
