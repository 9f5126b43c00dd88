"""What only one backend can show: lock and outage timeouts, expiry and bounds, the key schema."""

from __future__ import annotations

import datetime as dt
import sqlite3
import time
from zoneinfo import ZoneInfo

import pytest
import redis

from hermes_bulk.budget import policy, redis_ledger
from hermes_bulk.budget.ledger import (
    KEEP_AFTER_WINDOW_S,
    CallRecord,
    LedgerUnavailable,
)
from hermes_bulk.budget.ledger_location import open_ledger
from hermes_bulk.budget.windows import Window, window_at
from hermes_bulk.testing.sentinels import free_port
from tests.conftest import RedisServer

TERMS = policy.terms_for(
    "chat", "m", None, mode="enforce", daily_limit=10, chat_reserve=2, job_limit=None, models=("*",)
)


@pytest.fixture
def window() -> Window:
    return window_at(time.time(), dt.time(0, 0), ZoneInfo("UTC"))


@pytest.mark.alone  # bounds a latency
def test_sqlite_an_admission_gives_up_on_a_ledger_locked_for_long_after_about_a_second(
    tmp_path, window
):
    led = open_ledger(str(tmp_path / "ledger.db"))
    blocker = sqlite3.connect(tmp_path / "ledger.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        with pytest.raises(LedgerUnavailable, match="is not answering"):
            led.admit(CallRecord("chat"), window, TERMS)
        assert time.monotonic() - started < 2.0
    finally:
        blocker.execute("ROLLBACK")
    assert led.admit(CallRecord("chat"), window, TERMS).decision == "allowed"
    led.close()


@pytest.mark.alone  # bounds a latency
def test_sqlite_admissions_take_turns_on_the_lock_file_and_give_up_on_a_holder_that_keeps_it(
    tmp_path, window
):
    import fcntl
    import os

    led = open_ledger(str(tmp_path / "ledger.db"))
    fd = os.open(tmp_path / "ledger.db.lock", os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another process's turn that does not end
    try:
        started = time.monotonic()
        with pytest.raises(LedgerUnavailable, match="is busy"):
            led.admit(CallRecord("chat"), window, TERMS)
        assert 0.9 < time.monotonic() - started < 2.0
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    assert (
        led.admit(CallRecord("chat"), window, TERMS).window_total == 1
    )  # the abandoned turn counted nothing
    led.close()


def test_sqlite_many_threads_admitting_at_once_all_get_their_turn(tmp_path, window):
    import threading

    led = open_ledger(str(tmp_path / "ledger.db"))
    errors = []

    def admit_many():
        try:
            for _ in range(50):
                led.admit(CallRecord("chat"), window, TERMS)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=admit_many) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and led.counts(window).total == 800
    led.close()


def test_sqlite_the_first_call_of_a_window_drops_windows_that_ended_over_a_week_ago(
    tmp_path, window
):
    led = open_ledger(str(tmp_path / "ledger.db"))
    old = Window(
        start_s=window.start_s - KEEP_AFTER_WINDOW_S - 3 * 86_400,
        end_s=window.start_s - KEEP_AFTER_WINDOW_S - 2 * 86_400,
        zone="UTC",
    )
    recent = Window(start_s=window.start_s - 86_400, end_s=window.start_s, zone="UTC")
    for w in (old, recent):
        led.admit(CallRecord("chat"), w, TERMS)
    led.admit(CallRecord("chat"), window, TERMS)
    assert led.counts(old).counters == {} and led.entries(old) == []
    assert led.counts(recent).total == 1
    led.close()


def test_sqlite_the_ledger_file_is_private(tmp_path):
    open_ledger(str(tmp_path / "budget" / "ledger.db")).close()
    assert oct((tmp_path / "budget" / "ledger.db").stat().st_mode & 0o777) == "0o600"
    assert oct((tmp_path / "budget").stat().st_mode & 0o777) == "0o700"


@pytest.mark.alone  # bounds a latency
def test_redis_an_unreachable_server_is_reported_at_once_without_credentials():
    started = time.monotonic()
    with pytest.raises(LedgerUnavailable) as err:
        open_ledger(f"redis://:hunter2@127.0.0.1:{free_port()}/0")
    assert time.monotonic() - started < 1.5
    assert "hunter2" not in str(err.value) and "127.0.0.1" in str(err.value)


@pytest.mark.alone  # bounds a latency
def test_redis_a_server_that_dies_fails_the_next_admission_fast_and_a_restart_recovers(
    tmp_path, window
):
    server = RedisServer(tmp_path).start()
    try:
        led = open_ledger(server.url + "?prefix=outage")
        assert led.admit(CallRecord("chat"), window, TERMS).counted
        server.kill()
        started = time.monotonic()
        with pytest.raises(LedgerUnavailable):
            led.admit(CallRecord("chat"), window, TERMS)
        assert time.monotonic() - started < 1.5
        server.start()  # same port, same AOF directory
        assert led.admit(CallRecord("chat"), window, TERMS).window_total == 2
        led.close()
    finally:
        server.kill()


def test_redis_every_key_of_a_window_shares_one_hash_tag_and_expires_a_week_after_it(
    redis_url, window, request
):
    led = open_ledger(redis_url)
    call = CallRecord("cron", job_id="j1", run_id="r1", model="m")
    over = policy.terms_for(
        "cron",
        "m",
        "j1",
        mode="enforce",
        daily_limit=1,
        chat_reserve=1,
        job_limit=None,
        models=("*",),
    )
    led.admit(call, window, over)  # held: touches the runs set too
    keys = led.window_keys(window)
    r = redis.Redis.from_url(redis_url.split("?")[0])
    request.addfinalizer(r.close)  # an unclosed client's socket warns in a later test
    prefix = redis_url.split("prefix=")[1]
    assert keys == [
        f"{{{prefix}:budget}}:w:{window.start_s}",
        f"{{{prefix}:budget}}:w:{window.start_s}:runs",
        f"{{{prefix}:budget}}:w:{window.start_s}:log",
    ]
    for key in keys:
        ttl = r.ttl(key)
        assert (
            window.end_s + KEEP_AFTER_WINDOW_S - time.time() - 5
            < ttl
            <= window.end_s + KEEP_AFTER_WINDOW_S - time.time() + 1
        )
    assert sorted(k.decode() for k in r.keys(f"*{prefix}*")) == sorted(keys)
    led.close()


def test_redis_the_record_of_a_window_is_capped(redis_url, window, monkeypatch):
    monkeypatch.setattr(redis_ledger, "LOG_ENTRIES_KEPT", 100)
    led = open_ledger(redis_url)
    for _ in range(500):
        led.admit(CallRecord("chat"), window, TERMS)
    assert len(led.entries(window, limit=10_000)) < 300
    assert led.counts(window).total == 500  # counters are exact whatever the record keeps
    led.close()
