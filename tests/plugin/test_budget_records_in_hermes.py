"""What the request budget records of /bulk's requests in real Hermes 0.19.0 (issue 46, point 14):
the provider and API mode Hermes really speaks to (a Claude endpoint's Messages API, as Hermes'
own chat rows have it), and only requests that reached a provider (a port nobody listens on
receives nothing, so counts nothing); and what /bulk run says of a job the budget holds (point
11)."""

from __future__ import annotations

from urllib.parse import urlsplit

from hermes_bulk.budget.ledger import CallRecord
from hermes_bulk.budget.service import Budget
from hermes_bulk.budget.settings import budget_dir
from hermes_bulk.budget.windows import ZonedInstant
from hermes_bulk.testing.sentinels import free_port

from ..helpers import wait_for
from .conftest import config_set, job_id_of, run_until_completed


def _budget(home) -> Budget:
    budget = Budget(budget_dir(home))
    budget.settings_file.set("daily_limit", "1000")  # a budget is configured: bulk counts
    return budget


def _items(folder, n: int):
    folder.mkdir()
    for i in range(n):
        (folder / f"{i}.txt").write_text(f"{folder.name} item {i}")
    return folder


def test_requests_to_a_claude_endpoint_are_recorded_as_hermes_sends_them(
    gateway, hermes_home, hermes_provider, tmp_path
):
    """A custom endpoint under /anthropic: Hermes speaks the Messages API to it."""
    origin = "{0.scheme}://{0.netloc}".format(urlsplit(hermes_provider.base_url))
    config_set(hermes_home, "model.base_url", f"{origin}/anthropic")
    config_set(hermes_home, "model.default", "claude-haiku-4-5")
    budget = _budget(hermes_home)
    try:
        gw = gateway()
        job = job_id_of(gw.bulk(f'"Summarize" --over {_items(tmp_path / "in", 2)}'))
        run_until_completed(gw, job)
        assert {r.protocol for r in hermes_provider.requests} == {"anthropic"}
        window = budget.window(budget.settings())
        rows = budget.ledger(budget.settings()).entries(window)
    finally:
        budget.close()
    assert {(e.call.call_class, e.call.provider, e.call.api_mode) for e in rows} == {
        ("bulk", "custom", "anthropic_messages")
    }
    assert len(rows) == len(hermes_provider.requests) == 2


def test_requests_that_reach_no_provider_are_not_counted(gateway, hermes_home, tmp_path):
    """Nothing listens on the port: each attempt is admitted, then taken back."""
    config_set(hermes_home, "model.base_url", f"http://127.0.0.1:{free_port()}/v1")
    budget = _budget(hermes_home)
    try:
        gw = gateway()
        job = job_id_of(gw.bulk(f'"Summarize" --over {_items(tmp_path / "in", 2)} --retries 0'))
        gw.bulk(f"run {job}")
        wait_for(
            lambda: "State: failed" in gw.bulk(f"status {job}"),
            timeout=90,
            interval=0.3,
            message="both items fail",
        )
        c = budget.report().counts
    finally:
        budget.close()
    assert (c.total, c.by_class()["bulk"], c.get("not_sent")) == (0, 0, 2), c


def test_a_run_the_budget_holds_says_so_and_until_when_not_that_it_runs(
    gateway, hermes_home, hermes_provider, tmp_path
):
    """Issue 46, 11: nothing is sent before the window reopens, and the reply says that."""
    budget = Budget(budget_dir(hermes_home))
    try:
        budget.settings_file.set("chat_reserve", "1")
        budget.settings_file.set("daily_limit", "3")
        budget.settings_file.set("mode", "enforce")
        for _ in range(2):
            budget.admit(CallRecord("chat", profile="default", model="fake-model"))
        window = budget.window(budget.settings())
        until = ZonedInstant(window.end_s, window.zone).shown()
        gw = gateway()
        job = job_id_of(gw.bulk(f'"Summarize" --over {_items(tmp_path / "in", 3)}'))
        ran = gw.bulk(f"run {job}")
        assert " ".join(ran.split()) == (
            f"Job {job} waits for the request budget: 3 items pending, none sent before {until} "
            "(the rest of this window is kept for chat). The worker in this process sends them "
            f"then, up to 4 at once, if it still runs. Check it with: /bulk status {job}"
        ), ran
        assert all(len(line) <= 80 for line in ran.splitlines()), ran
        wait_for(
            lambda: budget.report().counts.decisions("held") >= 3,
            timeout=60,
            interval=0.2,
            message="each item asked the budget and was held",
        )
        assert hermes_provider.requests == []
    finally:
        budget.close()
