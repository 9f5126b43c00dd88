"""The budget gate's hold as a pure function (budget/gate.hold_s): what each decision makes a
bulk request wait, the window's end at equality with the least hold and one step either side."""

from __future__ import annotations

import pytest

from hermes_bulk.budget import policy
from hermes_bulk.budget.gate import MIN_HOLD_S, hold_s
from hermes_bulk.budget.service import Outcome
from hermes_bulk.budget.settings import BudgetSettings
from hermes_bulk.budget.windows import Window

WINDOW = Window(start_s=0, end_s=1000, zone="UTC")


def outcome(decision: str, window: Window | None = WINDOW) -> Outcome:
    return Outcome(decision, window, BudgetSettings())


@pytest.mark.parametrize(
    ("now", "wait"),
    [
        (0.0, 1000.0),
        (998.5, 1.5),
        (999.0, MIN_HOLD_S),  # the window ends exactly the least hold away
        (999.5, MIN_HOLD_S),
        (1000.0, MIN_HOLD_S),  # its end seen from a clock at or past it
        (1010.0, MIN_HOLD_S),
    ],
)
def test_a_held_request_waits_for_its_window_and_at_least_the_least_hold(now, wait):
    assert hold_s(outcome(policy.HELD), now) == wait


@pytest.mark.parametrize("decision", [policy.ALLOWED, policy.WOULD_BLOCK, policy.FAILED_OPEN])
def test_every_other_decision_lets_the_request_go(decision):
    assert hold_s(outcome(decision), 0.0) == 0.0


def test_a_hold_without_a_window_lets_the_request_go():
    assert hold_s(outcome(policy.HELD, window=None), 0.0) == 0.0
