"""`hermes-bulk doctor`'s one model request is a bulk request (issue 46, point 10, the CLI's
side): the check of a model GET /models does not list sends a 1-token request, which passes the
request budget's gate; while the budget holds bulk requests it is not sent, and doctor says
until when. Real `hermes-bulk` processes, the loopback provider (its request log: what was
sent) and the budget in the root Hermes home."""

from __future__ import annotations

from hermes_bulk.budget.ledger import CallRecord
from hermes_bulk.budget.service import Budget
from hermes_bulk.budget.settings import budget_dir
from hermes_bulk.budget.windows import ZonedInstant


def test_doctor_sends_its_check_only_when_the_budget_lets_bulk_through(
    cli, tmp_path, fake_provider
):
    env = {"HERMES_HOME": str(tmp_path / "hermes-root")}
    for key, value in (("chat_reserve", "1"), ("daily_limit", "3"), ("mode", "enforce")):
        cli("budget", "set", key, value, **env)
    budget = Budget(budget_dir(tmp_path / "hermes-root"))
    try:
        for _ in range(2):  # bulk stops at 2: used
            budget.admit(CallRecord("chat", model="x"))
        window = budget.window(budget.settings())
        until = ZonedInstant(window.end_s, window.zone).shown()
        # other-model is not listed by GET /models: its check is a 1-token request
        held = cli("doctor", "--model", "other-model", check=False, **env)
        assert fake_provider.requests == [], "nothing was sent"
        assert held.returncode == 1, "not checked is not usable"
        said = " ".join(held.stdout.split())
        assert (
            "-- model not checked (not listed by GET /models): nothing was sent; the request "
            f"budget holds bulk requests until {until}: this window has used 2 of its 3 "
            "requests, and cron and bulk stop at 2 (1 kept for chat) Not checked."
        ) in said, held.stdout

        budget.settings_file.set("daily_limit", "4")  # one request left for bulk: it goes
        sent = cli("doctor", "--model", "other-model", **env)
        assert "'other-model' answered a 1-token request" in sent.stdout, sent.stdout
        assert len(fake_provider.requests) == 1
        c = budget.report().counts
        assert (c.by_class()["bulk"], c.total, c.decisions("held")) == (1, 3, 1)
    finally:
        budget.close()
