"""The cron budget as it is now, in real Hermes 0.19.0: a budget set while the gateway runs holds
its next /bulk request, which is counted as bulk; `set ledger local` is one file under the root
Hermes home whatever a process's working directory; what a user reads carries the budget's zone
and the window's true use."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hermes_bulk.budget.ledger import CallRecord
from hermes_bulk.budget.service import Budget
from hermes_bulk.budget.settings import budget_dir

from ..helpers import wait_for
from .conftest import HERMES, clean_env, hermes, job_id_of, run_until_completed

pytestmark = pytest.mark.slow  # real Hermes processes: cron runs and a gateway under a budget


def _items(folder: Path, n: int) -> Path:
    """n files no other job has (answers are reused across jobs)."""
    folder.mkdir()
    for i in range(n):
        (folder / f"{i}.txt").write_text(f"{folder.name} item {i}")
    return folder


def _classes(home: Path) -> dict[str, int]:
    budget = Budget(budget_dir(home))
    try:
        return budget.report().counts.by_class()
    finally:
        budget.close()


def _budget(home: Path, *settings: tuple[str, str], cwd: Path | None = None) -> list[str]:
    """`hermes cron-budget set KEY VALUE` for each, as a user types it (in cwd); their outputs."""
    out = []
    for key, value in settings:
        proc = subprocess.run(
            [str(HERMES), "cron-budget", "set", key, value],
            env=clean_env(home),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        assert proc.returncode == 0, proc.stderr
        out.append(proc.stdout.strip())
    return out


def _enable_cron_budget(home: Path) -> None:
    hermes(home, "plugins", "enable", "cron-budget", "--no-allow-tool-override")


def test_a_budget_set_while_the_gateway_runs_holds_the_next_bulk_job_at_the_cap_counted_as_bulk(
    gateway, hermes_home, hermes_provider, tmp_path
):
    _enable_cron_budget(hermes_home)
    gw = gateway()
    # /bulk runs before any budget exists; the plugin counts, so each request is counted as bulk.
    first = job_id_of(gw.bulk(f'"Summarize" --over {_items(tmp_path / "first", 3)}'))
    run_until_completed(gw, first, "the first job")
    assert len(hermes_provider.requests) == 3
    classes = _classes(hermes_home)
    assert (classes["bulk"], classes["auxiliary"]) == (3, 0), classes

    _budget(
        hermes_home,
        ("timezone", "Asia/Tokyo"),
        ("reset", "09:00"),
        ("chat_reserve", "1"),
        ("daily_limit", "8"),
        ("mode", "enforce"),
    )  # cron and bulk stop at 7; 3 are used
    job = job_id_of(
        gw.bulk(f'"Summarize" --over {_items(tmp_path / "second", 10)} --concurrency 2')
    )
    gw.bulk(f"run {job}")
    status = wait_for(
        lambda: (
            "Waiting for the request budget" in (s := gw.bulk(f"status {job}"))
            and ", 0 running" in s
            and s
        ),
        timeout=90,
        interval=0.3,
        message="the job held at the cap",
    )
    assert "Items: 4/10 completed" in status, status
    assert len(hermes_provider.requests) == 7, "nothing past the cap reached the provider"
    classes = _classes(hermes_home)
    assert (classes["bulk"], classes["auxiliary"]) == (7, 0), classes

    budget = Budget(budget_dir(hermes_home))
    try:
        end = budget.window(budget.settings()).end_local
    finally:
        budget.close()
    assert (
        f"the window reopens at {end:%Y-%m-%d %H:%M} JST" in status
        or f"the window reopens at {end:%H:%M} JST" in status
    ), status


def test_set_ledger_local_is_one_file_under_the_root_home_whatever_the_working_directory(
    gateway, hermes_home, hermes_provider, tmp_path
):
    _enable_cron_budget(hermes_home)
    typed_in, served_in = tmp_path / "typed-in", tmp_path / "served-in"
    typed_in.mkdir()
    served_in.mkdir()
    (said,) = _budget(hermes_home, ("ledger", "local"), cwd=typed_in)
    assert said == f"ledger = {hermes_home / 'local'}"
    gw = gateway(cwd=served_in)
    job = job_id_of(gw.bulk(f'"Summarize" --over {_items(tmp_path / "items", 2)}'))
    run_until_completed(gw, job)
    status = hermes(hermes_home, "cron-budget", "status").stdout
    assert "By class: chat 0, cron 0, auxiliary 0, bulk 2" in status, status
    assert (hermes_home / "local").is_file()
    assert not (typed_in / "local").exists() and not (served_in / "local").exists()


def test_a_held_cron_run_says_the_windows_use_and_the_cap_and_when_it_resets_in_the_budgets_zone(
    hermes_home, hermes_provider
):
    _enable_cron_budget(hermes_home)
    _budget(
        hermes_home,
        ("timezone", "Asia/Tokyo"),
        ("reset", "09:00"),
        ("chat_reserve", "7"),
        ("daily_limit", "8"),
        ("mode", "enforce"),
    )  # cron and bulk stop at 1
    budget = Budget(budget_dir(hermes_home))
    try:
        for _ in range(4):
            budget.admit(CallRecord("chat", profile="people", model="fake-model"))
        end = budget.window(budget.settings()).end_local
    finally:
        budget.close()
    created = hermes(
        hermes_home,
        "cron",
        "create",
        "every 1h",
        "Reply pong",
        "--name",
        "digest",
        "--deliver",
        "local",
    ).stdout
    job_id = next(
        line.split(": ", 1)[1].strip()
        for line in created.splitlines()
        if line.startswith("Created job: ")
    )
    assert "succeeded" in hermes(hermes_home, "cron", "run", job_id).stdout
    assert len(hermes_provider.requests) == 0
    (output,) = (hermes_home / "cron" / "output" / job_id).glob("*.md")
    said = output.read_text().rstrip().splitlines()[-1]
    assert said.startswith(
        "Held by cron-budget: this run was not sent to the model because this window has used 4 of "
        "its 8 requests, and cron and bulk jobs stop at 1 (7 are kept for chat). The job keeps its "
        f"schedule and runs normally after the window resets at {end:%Y-%m-%d %H:%M} JST;"
    ), said
