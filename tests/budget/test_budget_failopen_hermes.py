"""The budget's own fail-open, in real hermes-agent 0.19.0: fast, and visible in status.

A ledger locked by another process must not slow a process's first call by more than the
admission timeout (it waited 10 s at open once), and a broken budget.json must leave
`hermes cron-budget status` working (defaults, the error, the fail-open warning) and `set`
able to repair it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from hermes_bulk.testing.fake_provider import FakeProvider
from tests.budget.test_hermes_cron_budget import HERMES, HermesHome

pytestmark = pytest.mark.slow  # real Hermes processes against a locked or broken ledger
pytest.importorskip("hermes_cli", reason="hermes-agent is not installed (scripts/test installs it)")

HOLD_LOCK = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""


@pytest.fixture(scope="module")
def hermes(tmp_path_factory):
    provider = FakeProvider().start()
    home = HermesHome(tmp_path_factory.mktemp("hermes"), provider)
    for key, value in (
        ("model.provider", "custom"),
        ("model.base_url", provider.base_url),
        ("model.default", "fake-model"),
        ("model.api_key", "sk-local-fake"),
    ):
        home("config", "set", key, value, "--force")
    home("plugins", "enable", "cron-budget", "--no-allow-tool-override")
    home("cron-budget", "set", "daily_limit", "1000")  # creates budget.json and the ledger
    yield home
    provider.stop()


def _cron_job(hermes: HermesHome, name: str) -> str:
    created = hermes(
        "cron", "create", "every 1h", "Reply pong", "--name", name, "--deliver", "local"
    )
    return next(
        line.split(": ", 1)[1].strip()
        for line in created.stdout.splitlines()
        if line.startswith("Created job: ")
    )


def _timed_cron_run(hermes: HermesHome, job_id: str) -> float:
    started = time.monotonic()
    assert "succeeded" in hermes("cron", "run", job_id).stdout
    return time.monotonic() - started


def test_a_locked_ledger_fails_the_first_call_of_a_process_open_within_about_a_second(hermes):
    job_id = _cron_job(hermes, "locked")
    free = _timed_cron_run(hermes, job_id)
    ledger = hermes.root / "plugin-data" / "cron-budget" / "ledger.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(ledger), "120"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        sent = hermes.provider_requests()
        locked = _timed_cron_run(hermes, job_id)
        assert hermes.provider_requests() > sent  # the run went through, uncounted
        status = hermes("cron-budget", "status").stdout
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    # Each provider call of the run may wait once for the lock (about 1 s), not 10 s for the open.
    print(f"cron run: {free:.1f} s with a free ledger, {locked:.1f} s with a locked one")
    assert locked - free < 4.0, (free, locked)
    assert "cannot be read now" in status
    assert "⚠ Accounting failed" in status and "those calls went through uncounted" in status


def test_a_broken_budget_json_lets_calls_through_status_warns_and_set_repairs_it(
    hermes,
):
    path = hermes.root / "plugin-data" / "cron-budget" / "budget.json"
    path.write_text(json.dumps({"mode": "enforce", "daily_limit": "lots", "chat_reserve": 1}))
    sent = hermes.provider_requests()
    assert "ANSWER[" in hermes("chat", "-Q", "-q", "hi").stdout
    assert hermes.provider_requests() > sent

    status = hermes("cron-budget", "status")
    assert status.returncode == 0
    said = " ".join(status.stdout.split())  # unwrapped
    assert "Cron budget: observe mode" in said  # the defaults are what is in force
    assert (
        f"⚠ Settings cannot be read, so calls go through uncounted until they can: {path}: "
        "daily_limit 'lots' is not a whole number"
    ) in said
    assert "fix it with: hermes cron-budget set daily_limit VALUE." in said
    assert (
        "Settings (defaults, not in budget.json): mode=observe, daily_limit=1000, chat_reserve=300"
        in said
    )
    assert "⚠ Accounting failed" in status.stdout  # the chat turn's fail-open is shown
    report = json.loads(hermes("cron-budget", "status", "--json").stdout)
    assert "daily_limit 'lots'" in report["settings_error"] and report["failed_open"]["calls"] >= 1

    assert hermes("cron-budget", "set", "daily_limit", "50").stdout.strip() == "daily_limit = 50"
    assert json.loads(path.read_text()) == {"mode": "enforce", "daily_limit": 50, "chat_reserve": 1}
    status = hermes("cron-budget", "status").stdout
    assert (
        "Cron budget: enforce mode" in status and "Settings: mode=enforce, daily_limit=50" in status
    )

    path.write_text("{oops")
    refused = hermes("cron-budget", "set", "mode", "observe", check=False)
    assert refused.returncode == 1
    assert " ".join(refused.stderr.split()) == (  # unwrapped
        f"hermes cron-budget: {path} is not valid JSON (Expecting property name enclosed in double "
        f"quotes at line 1, column 2); fix it by hand, or delete it (rm {path}) to start from the "
        "defaults and set your keys again."
    )
    path.unlink()


def test_status_into_a_closed_pipe_exits_quietly(hermes):
    proc = subprocess.Popen(
        [str(HERMES), "cron-budget", "status"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=hermes.env(),
        cwd=hermes.user_home,
        stdin=subprocess.DEVNULL,
    )
    proc.stdout.close()  # `| head -0`: the reader is gone before anything is written
    stderr = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=120) == 141
    assert (
        "Traceback" not in stderr and "BrokenPipe" not in stderr and "internal error" not in stderr
    ), stderr
