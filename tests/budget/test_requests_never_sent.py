"""The request budget counts what a provider received: a bulk request that never reached one (no
connection was made, or it was refused before it was sent) is taken back, and each request is
recorded with the provider and API mode it went to (issue 46, point 14).

In-process: the item pipeline (runtime/pipeline.py) with a real BudgetGate over a SQLite
ledger, a scripted model client and the HTTP client against the loopback provider.
"""

from __future__ import annotations

import pytest

from hermes_bulk.budget.gate import BudgetGate
from hermes_bulk.budget.service import Budget
from hermes_bulk.config.provider import ANTHROPIC
from hermes_bulk.errors import EndpointUnreachable, TransientModelError, not_sent
from hermes_bulk.fleet import broker
from hermes_bulk.providers.client import Completion, HttpModelClient
from hermes_bulk.store.protocol import Usage
from hermes_bulk.testing.fake_provider import FakeProvider

from ..test_retry_policy import Clock, make_job, processor


@pytest.fixture(scope="module")
def provider():
    fake = FakeProvider().start()
    yield fake
    fake.stop()


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def backend(tmp_path, clock):
    b = broker.build_backend(f"sqlite:///{tmp_path / 'bulk.db'}")
    b.store.db.clock = clock.time
    yield b
    b.close()


@pytest.fixture
def budget(tmp_path):
    b = Budget(tmp_path / "cron-budget")
    b.settings_file.set("daily_limit", "1000")  # a budget is configured: bulk requests count
    yield b
    b.close()


@pytest.fixture
def gate(budget):
    g = BudgetGate(budget.directory, profile="host-a", budget=budget)
    yield g


def counts(budget):
    c = budget.report().counts
    return c.by_class()["bulk"], c.get("not_sent")


def test_requests_that_found_no_connection_are_taken_back(backend, clock, tmp_path, gate, budget):
    """Twice no connection (the HTTP client's EndpointUnreachable), then an answer: one request
    reached the provider, one is counted."""
    client = Scripted([EndpointUnreachable("cannot connect")] * 2)
    job = make_job(backend.store, retries=2)
    p = processor(backend, client, clock, tmp_path, request_gate=gate)
    p.handle(job, 0)
    assert client.calls == 3 and p.counters.snapshot()["requests"] == 3
    assert counts(budget) == (1, 2), "admitted three times, two taken back"


def test_requests_the_provider_answered_with_an_error_stay_counted(
    backend, clock, tmp_path, gate, budget, provider
):
    """The neighbour: a 503 reached the provider (it may count it against a limit)."""
    provider.reset_records()
    provider.configure(script=["503", "ok"], item_faults={})
    client = HttpModelClient(base_url=provider.base_url, api_key="k", model="m", timeout_s=5)
    try:
        job = make_job(backend.store, retries=2)
        processor(backend, client, clock, tmp_path, request_gate=gate).handle(job, 0)
    finally:
        client.close()
    assert [r.status for r in provider.requests] == [503, 200]
    assert counts(budget) == (2, 0)


class Scripted:
    """A model client that fails with each error given in turn, then answers."""

    provider_key = "p:x"

    def __init__(self, errors) -> None:
        self.errors, self.calls = list(errors), 0

    def complete(self, *args, **kwargs):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return Completion(text="answer", usage=Usage(5, 3))


@pytest.mark.parametrize(
    ("error", "bulk", "taken_back"),
    [
        (lambda: not_sent(TransientModelError("refused before sending")), 0, 3),
        (lambda: TransientModelError("connection lost after sending"), 3, 0),
    ],
)
def test_only_a_call_marked_as_never_sent_is_taken_back(
    error, bulk, taken_back, backend, clock, tmp_path, gate, budget
):
    job = make_job(backend.store, retries=2)
    client = Scripted([error() for _ in range(3)])
    processor(backend, client, clock, tmp_path, request_gate=gate).handle(job, 0)
    assert counts(budget) == (bulk, taken_back)


@pytest.mark.parametrize(
    ("protocol", "provider_name", "api_mode"),
    [
        (ANTHROPIC, "anthropic", "anthropic_messages"),
        ("openai", "openai-compatible", "chat_completions"),
    ],
)
def test_each_request_is_recorded_with_the_provider_and_api_mode_it_goes_to(
    protocol, provider_name, api_mode, backend, gate, budget
):
    job_id = make_job(backend.store, protocol=protocol, model="claude-haiku-4-5")
    assert gate.admit(backend.store.get_job(job_id)) == 0.0
    (entry,) = budget.ledger(budget.settings()).entries(budget.window(budget.settings()))
    assert (entry.call.call_class, entry.call.provider, entry.call.api_mode) == (
        "bulk",
        provider_name,
        api_mode,
    )
    assert (entry.call.profile, entry.call.model) == ("host-a", "claude-haiku-4-5")
