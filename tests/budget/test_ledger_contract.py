"""The request-ledger contract (budget/ledger.py), run unchanged against SQLite and Redis.

Admission is one atomic check-and-count: eight processes hammer one ledger behind a barrier and
the counts come out exact, enforce mode admits exactly the cap, and the ledger's own record of
the order of calls replays, one call at a time, to the very decisions it handed out.
"""

from __future__ import annotations

import datetime as dt
import multiprocessing
import time
from collections import Counter
from zoneinfo import ZoneInfo

import pytest

from hermes_bulk.budget import policy
from hermes_bulk.budget.ledger import CallRecord
from hermes_bulk.budget.ledger_location import open_ledger
from hermes_bulk.budget.policy import ALLOWED, HELD, WOULD_BLOCK
from hermes_bulk.budget.windows import Window, next_window, window_at

BACKENDS = ["sqlite", "redis"]
PROCESSES = 8


@pytest.fixture(params=BACKENDS)
def location(request, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "ledger.db")
    return request.getfixturevalue("redis_url")


@pytest.fixture
def ledger(location):
    led = open_ledger(location)
    yield led
    led.close()


@pytest.fixture
def window() -> Window:
    return window_at(time.time(), dt.time(0, 0), ZoneInfo("UTC"))


def terms(
    call: CallRecord,
    *,
    mode="enforce",
    daily_limit=10,
    chat_reserve=4,
    job_limit=None,
    models=("*",),
):
    return policy.terms_for(
        call.call_class,
        call.model,
        call.job_id,
        mode=mode,
        daily_limit=daily_limit,
        chat_reserve=chat_reserve,
        job_limit=job_limit,
        models=models,
    )


def cron(job="job1", run="run1", model="m", name="digest"):
    return CallRecord(
        "cron",
        profile="default",
        job_id=job,
        job_name=name,
        run_id=run,
        provider="custom",
        model=model,
        api_mode="chat_completions",
    )


def chat(profile="default", model="m"):
    return CallRecord(
        "chat", profile=profile, provider="custom", model=model, api_mode="chat_completions"
    )


def admit(ledger, window, call, **kw):
    return ledger.admit(call, window, terms(call, **kw))


# One call at a time ---------------------------------------------------------------------------


def test_background_calls_are_admitted_up_to_the_cap_then_held_and_not_counted(ledger, window):
    decisions = [admit(ledger, window, cron(run=f"r{i}")).decision for i in range(8)]
    assert decisions == [ALLOWED] * 6 + [HELD] * 2
    c = ledger.counts(window)
    assert (c.total, c.get("calls"), c.decisions(HELD)) == (6, 8, 2)
    assert c.by_class()["cron"] == 6


def test_chat_and_auxiliary_calls_are_allowed_and_counted_past_the_daily_limit(ledger, window):
    for _ in range(12):
        assert admit(ledger, window, chat()).decision == ALLOWED
    aux = CallRecord("auxiliary", profile="default", model="m")
    assert admit(ledger, window, aux).decision == ALLOWED
    c = ledger.counts(window)
    assert c.total == 13
    assert (c.by_class()["chat"], c.by_class()["auxiliary"]) == (12, 1)


def test_chat_that_used_the_window_holds_background_work_sooner(ledger, window):
    for _ in range(6):
        admit(ledger, window, chat())
    assert admit(ledger, window, cron()).decision == HELD
    assert admit(ledger, window, CallRecord("bulk", job_id="b1", model="m")).decision == HELD


def test_observe_mode_lets_over_cap_calls_through_counts_them_and_records_would_block(
    ledger, window
):
    for i in range(6):
        admit(ledger, window, cron(run=f"r{i}"), mode="observe")
    a = admit(ledger, window, cron(run="late"), mode="observe")
    b = admit(ledger, window, cron(run="late"), mode="observe")
    assert (a.decision, b.decision) == (WOULD_BLOCK, WOULD_BLOCK)
    assert a.counted and b.window_total == 8
    job = {j.job_id: j for j in ledger.counts(window).jobs()}["job1"]
    assert (job.requests, job.held_runs, job.would_block_runs) == (8, 0, 1)  # one run, two calls


def test_each_admission_says_what_it_decided_and_the_counts_right_after_it(ledger, window):
    def said(call, **kw):
        a = admit(ledger, window, call, **kw)
        return a.decision, a.counted, a.window_total, a.job_requests, a.job_held_runs

    assert said(cron(run="r1"), job_limit=2) == (ALLOWED, True, 1, 1, 0)  # a window's first call
    assert said(chat()) == (ALLOWED, True, 2, 0, 0)
    assert said(cron(run="r2"), job_limit=2) == (ALLOWED, True, 3, 2, 0)
    assert said(cron(run="r3"), job_limit=2) == (HELD, False, 3, 2, 1)
    assert said(cron(run="r4", model="gpt-4o"), job_limit=2, models=("*:free",)) == (
        ALLOWED,
        False,
        3,
        2,
        1,
    )
    assert said(cron(run="r5"), job_limit=2, mode="observe") == (WOULD_BLOCK, True, 4, 3, 1)
    assert said(cron(job="job2"), job_limit=2) == (ALLOWED, True, 5, 1, 0)


def test_held_runs_are_counted_once_per_run_and_the_first_is_told_apart(ledger, window):
    for i in range(6):
        admit(ledger, window, cron(run=f"r{i}"))
    first = admit(ledger, window, cron(run="run-a"))
    again = admit(ledger, window, cron(run="run-a"))  # the same run asking twice
    second = admit(ledger, window, cron(run="run-b"))
    other_job = admit(ledger, window, cron(job="job2", run="run-c"))
    assert [x.decision for x in (first, again, second, other_job)] == [HELD] * 4
    assert (first.job_held_runs, again.job_held_runs, second.job_held_runs) == (1, 1, 2)
    assert other_job.job_held_runs == 1
    jobs = {j.job_id: j for j in ledger.counts(window).jobs()}
    assert (jobs["job1"].held_runs, jobs["job1"].held) == (2, 3)


def test_job_limit_holds_one_cron_job_while_others_still_run(ledger, window):
    got = [admit(ledger, window, cron(run=f"r{i}"), job_limit=2).decision for i in range(3)]
    assert got == [ALLOWED, ALLOWED, HELD]
    assert admit(ledger, window, cron(job="job2"), job_limit=2).decision == ALLOWED
    assert {j.job_id: j.requests for j in ledger.counts(window).jobs()} == {"job1": 2, "job2": 1}


def test_calls_of_models_outside_the_globs_are_recorded_but_not_counted_nor_held(ledger, window):
    for _ in range(8):
        assert admit(ledger, window, cron(model="gpt-4o"), models=("*:free",)).decision == ALLOWED
    c = ledger.counts(window)
    assert (c.total, c.get("uncounted"), c.get("calls")) == (0, 8, 8)
    assert len(ledger.entries(window)) == 8


def test_each_window_counts_on_its_own(ledger, window):
    for i in range(6):
        admit(ledger, window, cron(run=f"r{i}"))
    later = next_window(window, dt.time(0, 0))
    assert admit(ledger, later, cron()).decision == ALLOWED
    assert (ledger.counts(window).total, ledger.counts(later).total) == (6, 1)


def test_profiles_count_in_one_ledger_and_are_told_apart(ledger, window):
    admit(ledger, window, chat(profile="default"))
    admit(ledger, window, chat(profile="work"))
    admit(ledger, window, chat(profile="work"))
    assert ledger.counts(window).by_profile() == {"default": 1, "work": 2}


def test_the_record_keeps_every_field_of_each_call_in_admission_order(ledger, window):
    calls = [
        cron(run="r1"),
        chat(profile="work"),
        CallRecord("bulk", profile="host-a", job_id="b1", model="m", api_mode="chat_completions"),
    ]
    for call in calls:
        admit(ledger, window, call)
    entries = ledger.entries(window)
    assert [e.call for e in entries] == calls
    assert [e.decision for e in entries] == [ALLOWED] * 3
    assert all(e.window_start_s == window.start_s and e.counted for e in entries)
    assert entries[0].at <= entries[1].at <= entries[2].at


def test_a_call_taken_back_frees_its_count_and_is_recorded_as_not_sent(ledger, window):
    """A request that never reached the provider: its counts go back, to the one it took."""
    bulk = CallRecord("bulk", profile="host-a", job_id="b1", provider="anthropic", model="m")
    for _ in range(6):
        admit(ledger, window, bulk)
    assert admit(ledger, window, bulk).decision == HELD  # at the cap (10 - 4)
    ledger.take_back(bulk, window)
    c = ledger.counts(window)
    assert (c.total, c.by_class()["bulk"], c.by_profile(), c.get("not_sent")) == (
        5,
        5,
        {"host-a": 5},
        1,
    )
    assert {j.job_id: j.requests for j in c.jobs()} == {"b1": 5}
    assert c.get("calls") == 7, "the call was recorded once, when it was admitted"
    assert admit(ledger, window, bulk).decision == ALLOWED, "the cap has room again"
    assert admit(ledger, window, bulk).decision == HELD, "for one request, not two"
    last = ledger.entries(window)[-3]
    assert (last.call, last.decision, last.counted) == (bulk, "not_sent", False)


def test_a_take_back_never_takes_a_count_below_zero(ledger, window):
    """One more take-back than counts (its neighbour): the counters stay at 0, not below."""
    call = cron(run="r1")
    admit(ledger, window, call)
    ledger.take_back(call, window)
    ledger.take_back(call, window)
    c = ledger.counts(window)
    assert (c.total, c.by_class()["cron"], c.get("job:job1:requests")) == (0, 0, 0)
    assert c.get("not_sent") == 2 and c.by_profile() == {"default": 0}
    assert admit(ledger, window, chat()).window_total == 1


def test_a_take_back_counts_in_the_window_of_the_call(ledger, window):
    admit(ledger, window, chat())
    later = next_window(window, dt.time(0, 0))
    admit(ledger, later, chat())
    ledger.take_back(chat(), window)
    assert (ledger.counts(window).total, ledger.counts(later).total) == (0, 1)


def test_a_job_keeps_its_name_and_class(ledger, window):
    admit(ledger, window, cron(name="morning digest"))
    admit(ledger, window, cron(name=""))  # a call that could not look the name up keeps the old one
    (job,) = ledger.counts(window).jobs()
    assert (job.job_id, job.name, job.call_class) == ("job1", "morning digest", "cron")
    admit(ledger, window, cron(name="evening digest"))  # renamed in Hermes: the new name shows
    (job,) = ledger.counts(window).jobs()
    assert job.name == "evening digest"


# Eight processes at once ----------------------------------------------------------------------


def _hammer(location, window, barrier, queue, worker, calls_per_process, mix, limits):
    from hermes_bulk.budget import sqlite_ledger

    # The property here is atomicity, on whatever else this machine runs: a turn holder that the
    # OS deschedules must not fail a call open (timeouts have their own tests).
    sqlite_ledger.ADMIT_TIMEOUT_S = 30.0
    led = open_ledger(location)
    barrier.wait()
    got = []
    for i in range(calls_per_process):
        call_class = mix[i % len(mix)]
        job = f"job{worker % 3}" if call_class in ("cron", "bulk") else ""
        call = CallRecord(
            call_class, profile=f"p{worker}", job_id=job, run_id=f"w{worker}-{i}", model="m"
        )
        got.append((call_class, led.admit(call, window, terms(call, **limits)).decision))
    led.close()
    queue.put(got)


def _run_hammer(location, window, calls_per_process, mix, limits):
    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(PROCESSES), ctx.Queue()
    procs = [
        ctx.Process(
            target=_hammer,
            args=(location, window, barrier, queue, w, calls_per_process, mix, limits),
        )
        for w in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    results = [d for _ in procs for d in queue.get(timeout=120)]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    return results


def test_eight_processes_in_enforce_mode_admit_exactly_the_cap_of_background_requests(
    ledger, location, window
):
    limits = {"daily_limit": 300, "chat_reserve": 100}
    results = _run_hammer(
        location, window, 60, ("cron", "bulk"), limits
    )  # 480 calls for 200 places
    decisions = Counter(d for _, d in results)
    assert decisions == {ALLOWED: 200, HELD: 280}
    c = ledger.counts(window)
    assert (c.total, c.get("calls"), c.decisions(HELD)) == (200, 480, 280)
    assert sum(c.by_profile().values()) == 200


def test_eight_processes_mixing_chat_and_background_count_exactly_and_serialise(
    ledger, location, window
):
    limits = {"daily_limit": 400, "chat_reserve": 150}
    mix = ("cron", "chat", "bulk", "auxiliary", "cron")
    results = _run_hammer(location, window, 60, mix, limits)
    sent = Counter(cls for cls, _ in results)
    c = ledger.counts(window)
    assert c.get("calls") == PROCESSES * 60 == len(ledger.entries(window))
    for cls in ("chat", "auxiliary"):  # never held, all counted
        assert c.by_class()[cls] == sent[cls]
        assert all(d == ALLOWED for k, d in results if k == cls)
    background_allowed = sum(1 for k, d in results if k in ("cron", "bulk") and d == ALLOWED)
    assert c.total == sent["chat"] + sent["auxiliary"] + background_allowed
    # The ledger's order of calls, replayed one at a time through the rule, gives every decision
    # it handed out: no two processes ever passed the same last free request.
    total, job_counts = 0, Counter()
    for e in ledger.entries(window):
        expected = policy.decide(
            e.call.call_class,
            terms(e.call, **limits),
            window_total=total,
            job_requests=job_counts[e.call.job_id],
        )
        assert e.decision == expected
        if e.counted:
            total += 1
            job_counts[e.call.job_id] += 1
    assert total == c.total
    assert (
        total - sent["chat"] - sent["auxiliary"] <= limits["daily_limit"] - limits["chat_reserve"]
    )
    assert c.decisions(HELD) > 0  # the cap was reached: the mix really contended for it
