"""`/bulk doctor` in a real Hermes gateway: Hermes' own model (what /bulk jobs call) is checked
with one 1-token request through ctx.llm; a refused key is one FAIL line, without provider text.
That request passes the request budget as a bulk request does (issue 46, point 10)."""

from __future__ import annotations

from hermes_bulk.budget.ledger import CallRecord
from hermes_bulk.budget.service import Budget
from hermes_bulk.budget.settings import budget_dir, machine_zone
from hermes_bulk.budget.windows import ZonedInstant

from .conftest import hermes


def test_bulk_doctor_checks_hermes_model_with_one_request(gateway, hermes_provider):
    gw = gateway()
    answer = gw.bulk("doctor")
    assert answer.splitlines() == [
        "ok   model    Hermes' model custom/fake-model answered a 1-token request",
        "Usable.",
    ], answer
    assert len(hermes_provider.requests) == 1

    hermes_provider.configure(require_key="sk-not-what-hermes-has")
    try:
        answer = gw.bulk("doctor")
    finally:
        hermes_provider.configure(require_key=None)
    first = answer.replace("\n  ", " ").splitlines()[
        0
    ]  # a reply wraps at 80 columns, continuing indented
    assert first.startswith(
        "FAIL model    Hermes' model custom/fake-model did not answer a 1-token request: "
        "the provider refused the credentials (HTTP 401)"
    ), answer
    assert "Not usable" in answer and "sk-LEAKED" not in answer and "sk-local-fake" not in answer


def _budget_at(home, *, used: int, daily_limit: int, chat_reserve: int = 1) -> Budget:
    """An enforced budget under the root home whose window has `used` chat requests counted."""
    budget = Budget(budget_dir(home))
    budget.settings_file.set("chat_reserve", str(chat_reserve))
    budget.settings_file.set("daily_limit", str(daily_limit))
    budget.settings_file.set("mode", "enforce")
    for _ in range(used):
        budget.admit(CallRecord("chat", profile="default", model="fake-model"))
    return budget


def test_bulk_doctor_passes_the_request_budget_as_a_bulk_request(
    gateway, hermes_home, hermes_provider
):
    """Issue 46, 10: at 7 of 8 with 1 kept for chat, the check would take chat's request: it is
    not sent, and the reply says until when. One more request in the window (its neighbour):
    the check goes, counted once, as bulk (Hermes' observer would count it as auxiliary)."""
    hermes(hermes_home, "plugins", "enable", "cron-budget", "--no-allow-tool-override")
    budget = _budget_at(hermes_home, used=7, daily_limit=8)
    try:
        gw = gateway()
        until = ZonedInstant(budget.window(budget.settings()).end_s, machine_zone()).shown()
        answer = gw.bulk("doctor")
        assert hermes_provider.requests == [], "the check was not sent"
        assert " ".join(answer.split()) == (
            "-- model not checked: nothing was sent; the request budget holds bulk requests "
            f"until {until}: this window has used 7 of its 8 requests, and cron and bulk stop "
            f"at 7 (1 kept for chat) Not checked. Check again once the window reopens at {until}, "
            "or give bulk more of this window (raise daily_limit or lower chat_reserve)."
        ), answer
        assert all(len(line) <= 80 for line in answer.splitlines()), answer
        c = budget.report().counts
        assert (c.total, c.decisions("held"), c.by_class()["bulk"]) == (7, 1, 0)

        budget.settings_file.set("daily_limit", "9")  # bulk stops at 8: one left
        answer = gw.bulk("doctor")
        assert answer.splitlines()[-1] == "Usable.", answer
        assert len(hermes_provider.requests) == 1
        c = budget.report().counts
        assert (c.by_class()["bulk"], c.by_class()["auxiliary"], c.total) == (1, 0, 8), c
    finally:
        budget.close()
