"""The plugin's glue, called with exactly the keyword arguments Hermes passes
(hermes_cli.middleware, agent/auxiliary_hooks.py), including the newer-Hermes paths 0.19.0 cannot
run."""

from __future__ import annotations

import pytest

from hermes_bulk.budget.ledger import CallRecord
from hermes_bulk.budget.service import Budget
from hermes_bulk.plugin import cron_budget

MAIN_LOOP = dict(
    original_request={},
    task_id="t",
    turn_id="u",
    api_request_id="r",
    model="fake-model",
    provider="custom",
    base_url="http://127.0.0.1/v1",
    api_mode="chat_completions",
    api_call_count=1,
    middleware_trace=[],
)


@pytest.fixture
def budget(tmp_path, monkeypatch):
    b = Budget(tmp_path / "cron-budget")
    monkeypatch.setattr(cron_budget, "_budget", b)
    monkeypatch.setattr(cron_budget, "_aux_via_hook", False)
    yield b
    b.close()


def over_the_cap(budget: Budget) -> None:
    f = budget.settings_file
    f.set("chat_reserve", "1")
    f.set("daily_limit", "2")
    f.set("mode", "enforce")
    budget.admit(CallRecord("chat"))


class Provider:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, request):
        self.calls += 1
        return "PROVIDER"


@pytest.mark.parametrize(
    "session_id, job_id",
    [
        ("cron_fdbd2b283fff_20261130_161318", "fdbd2b283fff"),
        ("20261130_161253_4cfec1", None),
        ("cron_", None),
        ("", None),
    ],
)
def test_the_cron_job_id_is_read_from_the_session_id(session_id, job_id):
    assert cron_budget.cron_job_id(session_id) == job_id


def test_a_chat_call_goes_to_the_provider_and_is_counted_once(budget):
    over_the_cap(budget)
    provider = Provider()
    result = cron_budget.llm_execution(
        {"messages": []}, provider, session_id="20261130_1", platform="cli", **MAIN_LOOP
    )
    assert (result, provider.calls) == ("PROVIDER", 1)
    assert budget.report().counts.by_class()["chat"] == 2


def _failing(cause: BaseException):
    """A provider call that fails as the openai SDK fails: APIConnectionError from cause."""
    import httpx
    import openai

    def call(request):
        request_ = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
        try:
            raise cause
        except BaseException as exc:
            raise openai.APIConnectionError(request=request_) from exc

    return call


@pytest.mark.parametrize(
    ("cause", "counted"),
    [("ConnectError", 0), ("RemoteProtocolError", 1)],
    ids=["no connection made", "connection lost after sending"],
)
def test_a_chat_call_that_never_reached_the_provider_is_taken_back(budget, cause, counted):
    """Issue 46, 14: the error reaches the caller unchanged; only a connection never made is
    taken back (a connection lost on the way may have reached the provider)."""
    import httpx
    import openai

    budget.settings_file.set("mode", "observe")
    error = getattr(httpx, cause)("x")
    with pytest.raises(openai.APIConnectionError):
        cron_budget.llm_execution(
            {"messages": []}, _failing(error), session_id="s", platform="cli", **MAIN_LOOP
        )
    c = budget.report().counts
    assert (c.by_class()["chat"], c.get("not_sent")) == (counted, 1 - counted)


def test_a_cron_call_over_the_cap_answers_without_the_provider(budget):
    over_the_cap(budget)
    provider = Provider()
    result = cron_budget.llm_execution(
        {"messages": []},
        provider,
        session_id="cron_abc123def456_20261130_120000",
        platform="cron",
        **MAIN_LOOP,
    )
    assert provider.calls == 0
    assert result.choices[0].message.content.startswith("Held by cron-budget:")
    again = cron_budget.llm_execution(
        {"messages": []},
        provider,
        session_id="cron_abc123def456_20261130_130000",
        platform="cron",
        **MAIN_LOOP,
    )
    assert again.choices[0].message.content == "[SILENT]" and provider.calls == 0


def test_a_cron_session_is_cron_even_when_the_platform_is_not_passed(budget):
    over_the_cap(budget)
    provider = Provider()
    cron_budget.llm_execution(
        {}, provider, session_id="cron_abc123def456_20261130_120000", platform="", **MAIN_LOOP
    )
    assert provider.calls == 0


def test_when_the_budget_itself_breaks_the_call_goes_through(budget, monkeypatch):
    over_the_cap(budget)

    def broken():
        raise RuntimeError("boom")

    monkeypatch.setattr(cron_budget, "budget", broken)
    provider = Provider()
    result = cron_budget.llm_execution(
        {}, provider, session_id="cron_abc123def456_20261130_120000", platform="cron", **MAIN_LOOP
    )
    assert (result, provider.calls) == ("PROVIDER", 1)


def test_an_auxiliary_call_through_the_middleware_counts_unless_pre_auxiliary_call_counts_it(
    budget, monkeypatch
):
    provider = Provider()
    cron_budget.llm_execution(
        {}, provider, session_id="", platform="", task="compression", **MAIN_LOOP
    )
    assert budget.report().counts.by_class()["auxiliary"] == 1
    monkeypatch.setattr(cron_budget, "_aux_via_hook", True)
    cron_budget.llm_execution(
        {}, provider, session_id="", platform="", task="compression", **MAIN_LOOP
    )
    assert budget.report().counts.by_class()["auxiliary"] == 1
    assert provider.calls == 2


def test_pre_auxiliary_call_counts_each_attempt_and_skips_a_bulk_charged_one(budget):
    from hermes_bulk.budget.gate import mark_precharged

    hook = dict(
        session_id="",
        task_id="",
        turn_id="",
        platform="",
        middleware_trace=[],
        api_request_id="",
        retry_count=0,
        api_call_count=1,
        model="aux-model",
        provider="openrouter",
        base_url="",
        api_mode="chat_completions",
        streaming=False,
        started_at=0.0,
        message_count=1,
        request_messages=[],
        system_prompt="",
        tool_count=0,
        approx_input_tokens=1,
        request_char_count=4,
        max_tokens=None,
        request={},
    )
    cron_budget.on_pre_auxiliary_call(aux_task="title_generation", task="title_generation", **hook)
    mark_precharged()
    cron_budget.on_pre_auxiliary_call(aux_task="", task="", **hook)
    counts = budget.report().counts
    assert counts.by_class()["auxiliary"] == 1
    (entry,) = budget.ledger(budget.settings()).entries(budget.window(budget.settings()))
    assert (entry.call.model, entry.call.provider, entry.call.api_mode) == (
        "aux-model",
        "openrouter",
        "chat_completions",
    )


def test_a_held_run_counts_its_words_one_request_one_is_kept(budget):
    f = budget.settings_file
    f.set("chat_reserve", "1")
    f.set("daily_limit", "3")
    f.set("job_limit", "1")
    f.set("mode", "enforce")
    provider = Provider()
    session = "cron_abc123def456_20261130_1200{:02d}"
    cron_budget.llm_execution(
        {"messages": []}, provider, session_id=session.format(0), platform="cron", **MAIN_LOOP
    )
    held = cron_budget.llm_execution(
        {"messages": []}, provider, session_id=session.format(1), platform="cron", **MAIN_LOOP
    )
    assert (
        "it has used 1 of its job_limit of 1 request in this window"
        in held.choices[0].message.content
    )
    budget.admit(CallRecord("chat"))  # the window's background share (2 of 3) is used
    other = cron_budget.llm_execution(
        {"messages": []},
        provider,
        session_id="cron_0123456789ab_20261130_120000",
        platform="cron",
        **MAIN_LOOP,
    )
    assert (
        "this window has used 2 of its 3 requests, and cron and bulk jobs stop at 2 (1 is kept "
        "for chat)" in other.choices[0].message.content
    )
