"""Liveness as pure functions (fleet/liveness heartbeat_interval, answering): each bound at
equality and one step over, both sides of the cadence's floor and ceiling."""

from __future__ import annotations

import pytest

from hermes_bulk.fleet.liveness import (
    MAX_HEARTBEAT_S,
    SILENT_AFTER_BEATS,
    answering,
    heartbeat_interval,
)
from hermes_bulk.store.records import WorkerInfo


@pytest.mark.parametrize(
    ("lease_s", "beat_s"),
    [
        (0.3, 0.2),  # a third would be 0.1: the floor
        (0.6, 0.2),  # a third is the floor exactly
        (0.9, 0.3),
        (15.0, MAX_HEARTBEAT_S),  # a third is the ceiling exactly
        (15.3, MAX_HEARTBEAT_S),
        (300.0, MAX_HEARTBEAT_S),
    ],
)
def test_a_worker_heartbeats_every_third_of_its_lease_within_the_floor_and_ceiling(lease_s, beat_s):
    assert heartbeat_interval(lease_s) == pytest.approx(beat_s)


def beat_at(seconds: float) -> WorkerInfo:
    return WorkerInfo("w", "h", 1, 0.0, seconds, 1)


@pytest.mark.parametrize("heartbeat_s", [0.2, MAX_HEARTBEAT_S])  # a shorter beat is not trusted
def test_a_worker_answers_until_three_of_the_longest_beats_pass_and_not_a_ms_after(heartbeat_s):
    silent_s = SILENT_AFTER_BEATS * MAX_HEARTBEAT_S
    assert silent_s == 15.0
    assert answering(beat_at(1000.0), 1000.0 + silent_s, heartbeat_s=heartbeat_s)
    assert not answering(beat_at(1000.0), 1000.0 + silent_s + 0.001, heartbeat_s=heartbeat_s)
    assert answering(beat_at(1000.0), 1000.0, heartbeat_s=heartbeat_s)


def test_a_longer_beat_than_the_ceiling_waits_three_of_it():
    assert answering(beat_at(1000.0), 1030.0, heartbeat_s=10.0)
    assert not answering(beat_at(1000.0), 1030.001, heartbeat_s=10.0)


def test_a_beat_long_ago_is_silent_however_the_times_divide():
    assert not answering(beat_at(100.0), 1000.0, heartbeat_s=MAX_HEARTBEAT_S)
