"""Quota windows: boundaries, and the DST rule in zones that change clocks."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from hermes_bulk.budget.windows import next_window, reset_instant, window_at

NEW_YORK = ZoneInfo(
    "America/New_York"
)  # 2025: spring forward 03-09 02:00→03:00, fall back 11-02 02:00→01:00
BERLIN = ZoneInfo(
    "Europe/Berlin"
)  # 2025: spring forward 03-30 02:00→03:00, fall back 10-26 03:00→02:00
UTC = ZoneInfo("UTC")
HOUR = 3600


def at(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


def test_a_window_runs_from_the_latest_reset_to_the_next_one():
    w = window_at(at("2025-06-10T15:00:00+00:00"), dt.time(0, 0), UTC)
    assert (w.start_s, w.end_s) == (
        at("2025-06-10T00:00:00+00:00"),
        at("2025-06-11T00:00:00+00:00"),
    )


def test_before_the_reset_time_the_window_is_the_one_that_opened_yesterday():
    w = window_at(at("2025-06-10T08:59:59+02:00"), dt.time(9, 0), BERLIN)
    assert w.start_local.isoformat() == "2025-06-09T09:00:00+02:00"
    assert w.end_local.isoformat() == "2025-06-10T09:00:00+02:00"


def test_the_reset_instant_belongs_to_the_new_window_and_the_last_second_to_the_old_one():
    reset = at("2025-06-10T09:00:00+02:00")
    assert window_at(reset, dt.time(9, 0), BERLIN).start_s == reset
    assert window_at(reset - 0.001, dt.time(9, 0), BERLIN).end_s == reset


def test_next_window_starts_where_the_last_one_ended():
    w = window_at(at("2025-06-10T12:00:00+00:00"), dt.time(0, 0), UTC)
    assert next_window(w, dt.time(0, 0)).start_s == w.end_s


@pytest.mark.parametrize(
    "zone, day_before, dst_day",
    [
        (NEW_YORK, "2025-03-08", "2025-03-09"),
        (BERLIN, "2025-03-29", "2025-03-30"),
    ],
)
def test_the_window_that_contains_spring_forward_is_23_hours(zone, day_before, dst_day):
    noon_before = (
        dt.datetime.fromisoformat(f"{day_before}T12:00:00").replace(tzinfo=zone).timestamp()
    )
    w = window_at(noon_before, dt.time(0, 0), zone)
    assert w.start_local.date().isoformat() == day_before
    assert w.length_s == 24 * HOUR  # midnight to midnight before the change
    w = next_window(w, dt.time(0, 0))
    assert w.start_local.date().isoformat() == dst_day
    assert w.length_s == 23 * HOUR
    assert (w.start_local.hour, w.end_local.hour) == (0, 0)


@pytest.mark.parametrize("zone, dst_day", [(NEW_YORK, "2025-11-02"), (BERLIN, "2025-10-26")])
def test_the_window_that_contains_fall_back_is_25_hours(zone, dst_day):
    noon = dt.datetime.fromisoformat(f"{dst_day}T12:00:00").replace(tzinfo=zone).timestamp()
    w = window_at(noon, dt.time(0, 0), zone)
    assert w.length_s == 25 * HOUR
    assert (w.start_local.hour, w.end_local.hour) == (0, 0)


def test_a_reset_time_skipped_by_spring_forward_opens_the_window_the_gap_later():
    # New York, 2025-03-09: 02:00 EST jumps to 03:00 EDT, so 02:30 does not exist that day.
    start = reset_instant(dt.date(2025, 3, 9), dt.time(2, 30), NEW_YORK)
    assert dt.datetime.fromtimestamp(start, NEW_YORK).isoformat() == "2025-03-09T03:30:00-04:00"
    inside_gap_day = at("2025-03-09T03:10:00-04:00")  # after the jump, before 03:30
    w = window_at(inside_gap_day, dt.time(2, 30), NEW_YORK)
    assert w.start_local.isoformat() == "2025-03-08T02:30:00-05:00"
    assert w.end_s == start
    assert w.length_s == 24 * HOUR  # 02:30 EST to 03:30 EDT is 24 real hours
    after = next_window(w, dt.time(2, 30))
    assert after.end_local.isoformat() == "2025-03-10T02:30:00-04:00"
    assert after.length_s == 23 * HOUR


def test_a_reset_time_in_the_hour_repeated_by_fall_back_opens_the_window_once_at_the_first():
    # Berlin, 2025-10-26: 03:00 CEST goes back to 02:00 CET, so 02:30 happens twice.
    first = at("2025-10-26T02:30:00+02:00")
    second = at("2025-10-26T02:30:00+01:00")
    w = window_at(first, dt.time(2, 30), BERLIN)
    assert w.start_s == first
    assert window_at(second, dt.time(2, 30), BERLIN) == w  # the second 02:30 is no new reset
    assert w.end_local.isoformat() == "2025-10-27T02:30:00+01:00"
    assert w.length_s == 25 * HOUR
    before = window_at(first - 1, dt.time(2, 30), BERLIN)
    assert before.end_s == first and before.length_s == 24 * HOUR


def test_every_instant_of_a_year_falls_in_exactly_one_window_that_starts_at_the_reset_time():
    """Walk a year of windows in a DST zone: they tile time with no gap or overlap."""
    reset = dt.time(1, 30)
    w = window_at(at("2025-01-01T12:00:00+00:00"), reset, NEW_YORK)
    lengths = set()
    for _ in range(366):
        nxt = next_window(w, reset)
        assert nxt.start_s == w.end_s
        assert window_at(w.end_s - 1, reset, NEW_YORK) == w
        assert window_at((w.start_s + w.end_s) / 2, reset, NEW_YORK) == w
        assert (w.start_local.hour, w.start_local.minute) == (1, 30)
        lengths.add(w.length_s // HOUR)
        w = nxt
    assert lengths == {23, 24, 25}
