"""The native Anthropic client (providers/anthropic.py) against the loopback provider's Messages
API, and the official `anthropic` SDK against the same fake, so the fake is held to the real
client. What a Messages answer can be besides what was asked is read as an attacker would send
it."""

from __future__ import annotations

import json

import pytest

from hermes_bulk.errors import (
    InvalidAnswer,
    PermanentModelError,
    RateLimited,
    TransientModelError,
    TruncatedAnswer,
)
from hermes_bulk.jobs.prompt import build_messages
from hermes_bulk.providers.anthropic import (
    TOOL_NAME,
    AnthropicModelClient,
    messages_body,
    parse_message,
    split_shared,
)
from hermes_bulk.store.records import Usage
from hermes_bulk.testing.fake_provider import digest, expected_answer

SCHEMA = {
    "type": "object",
    "properties": {"label": {"type": "string", "enum": ["a", "b"]}},
    "required": ["label"],
}


def _messages(item: str, instruction: str = "Summarise it") -> list[dict[str, str]]:
    return build_messages(instruction, "line:1", item, "b2:" + "0" * 32)


@pytest.fixture
def claude(fake_provider):
    client = AnthropicModelClient(
        base_url=fake_provider.base_url, api_key="sk-ant-test", model="claude-x", timeout_s=10
    )
    yield client
    client.close()


def test_an_item_is_answered_through_the_messages_api(claude, fake_provider):
    fake_provider.configure(require_key="sk-ant-test")  # sent as x-api-key, not a bearer token
    done = claude.complete(_messages("the first row"), max_tokens=100)
    assert done.text == expected_answer("the first row")
    assert done.usage.reported and done.usage.tokens_in > 0 and done.usage.tokens_out > 0
    assert done.usage.tokens_cached is None, "nothing was read from the cache"
    (request,) = fake_provider.requests
    assert request.item == digest("the first row") and request.options["max_tokens"] == 100


def test_a_schema_is_asked_through_a_forced_tool_and_its_input_is_the_answer(claude):
    body = messages_body("claude-x", _messages("row"), max_tokens=None, json_schema=SCHEMA)
    assert body["tools"][0]["input_schema"] == SCHEMA
    assert body["tool_choice"] == {"type": "tool", "name": TOOL_NAME}
    assert body["max_tokens"] == 4096, "the Messages API requires max_tokens"
    done = claude.complete(_messages("row"), max_tokens=50, json_schema=SCHEMA)
    assert json.loads(done.text)["label"] in ("a", "b")


def test_the_shared_instruction_is_a_cache_breakpoint_once_it_is_long_enough(claude):
    short = messages_body("claude-x", _messages("row"), max_tokens=10)
    assert all("cache_control" not in b for b in short["messages"][0]["content"])
    long_instruction = "Follow the house style. " * 400  # about 2,400 tokens
    first, second = (
        claude.complete(_messages(item, long_instruction), max_tokens=50) for item in ("a", "b")
    )
    body = messages_body("claude-x", _messages("a", long_instruction), max_tokens=10)
    shared, item = body["messages"][0]["content"]
    assert shared["cache_control"] == {"type": "ephemeral"} and "cache_control" not in item
    assert shared["text"].startswith("Instruction:") and item["text"].startswith("\n\nItem ")
    assert first.usage.tokens_cached is None, "the first request writes the cache"
    assert first.usage.tokens_written >= 1024 and second.usage.tokens_written is None
    assert second.usage.tokens_cached >= 1024, "the second reads it"
    assert second.usage.tokens_in == first.usage.tokens_in, "input counts its cache reads too"
    floor = messages_body("claude-x", _messages("a", "word " * 400), max_tokens=10)
    assert "cache_control" in floor["messages"][0]["content"][0], "from 512 tokens, any model's"


def test_splitting_keeps_every_character_and_never_cuts_inside_the_item():
    user = _messages("line one\n\nItem fake\n----- BEGIN ITEM x")[1]["content"]
    shared, item = split_shared(user)
    assert shared + item == user and shared == "Instruction:\nSummarise it"
    assert split_shared("no framing at all") == ("", "no framing at all")


@pytest.mark.parametrize(
    ("fault", "error", "status"),
    [
        ("429:7", RateLimited, 429),
        ("529", TransientModelError, 529),
        ("500", TransientModelError, 500),
        ("400", PermanentModelError, 400),
        ("401", PermanentModelError, 401),
        ("404", PermanentModelError, 404),
    ],
)
def test_errors_map_onto_the_classes_every_client_raises(
    claude, fake_provider, fault, error, status
):
    fake_provider.configure(script=[fault])
    with pytest.raises(error) as caught:
        claude.complete(_messages("row"), max_tokens=10)
    if status == 429:
        assert caught.value.retry_after_s == 7
    else:
        assert caught.value.http_status == status
    assert "sk-LEAKED" not in str(caught.value), "the provider's text is never ours"


@pytest.mark.parametrize(
    ("fault", "error"),
    [("length", TruncatedAnswer), ("refusal", PermanentModelError), ("empty", TransientModelError)],
)
def test_an_answer_cut_refused_or_empty_is_never_kept(claude, fake_provider, fault, error):
    fake_provider.configure(script=[fault])
    with pytest.raises(error) as caught:
        claude.complete(_messages("row"), max_tokens=10)
    usage = caught.value.usage
    assert (usage.tokens_in, usage.tokens_out) == fake_provider.billed(), "billed: charged"


GOOD = {
    "type": "message",
    "model": "claude-x",
    "content": [{"type": "text", "text": "fine"}],
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 5, "output_tokens": 2},
}


@pytest.mark.parametrize("stop", ["max_tokens", "model_context_window_exceeded"])
def test_an_answer_cut_at_either_limit_is_truncated(stop):
    with pytest.raises(TruncatedAnswer):
        parse_message({**GOOD, "stop_reason": stop}, endpoint="e", model="m", max_tokens=9)
    cached = {"input_tokens": 5, "output_tokens": 9, "cache_read_input_tokens": 100,
              "cache_creation_input_tokens": 20}  # fmt: skip
    with pytest.raises(TruncatedAnswer) as caught:
        parse_message({**GOOD, "stop_reason": stop, "usage": cached}, endpoint="e", model="m")
    assert caught.value.usage == Usage(125, 9, 100, tokens_written=20), "what it was billed"


@pytest.mark.parametrize(
    "change",
    [
        {"type": "completion"},
        {"content": "fine"},
        {"content": [{"type": "text", "text": 7}]},
        {"content": ["fine"]},
        {"stop_reason": 3},
        {"stop_reason": "pause_turn"},
        {"content": [{"type": "tool_use", "name": "other", "input": {}}]},
        {"content": [{"type": "tool_use", "name": TOOL_NAME, "input": "x"}]},
    ],
)
def test_a_messages_answer_of_another_shape_is_invalid(change):
    with pytest.raises(InvalidAnswer):
        parse_message({**GOOD, **change}, endpoint="e", model="m")
    with pytest.raises(InvalidAnswer):
        parse_message([GOOD], endpoint="e", model="m")


def test_usage_of_every_wrong_shape_is_no_report_and_reads_count_as_cached():
    def usage(**u):
        return parse_message({**GOOD, "usage": u}, endpoint="e", model="m").usage

    got = usage(input_tokens=5, output_tokens=2, cache_read_input_tokens=100,
                cache_creation_input_tokens=20)  # fmt: skip
    assert (got.tokens_in, got.tokens_out, got.tokens_cached, got.tokens_written) == (
        125,
        2,
        100,
        20,
    )
    assert usage(input_tokens=True, output_tokens=2).tokens_in is None
    assert usage(input_tokens=10**30, output_tokens=2).tokens_in is None
    assert usage(input_tokens=5, output_tokens=2, cache_read_input_tokens=-1).tokens_cached is None
    assert parse_message({**GOOD, "usage": "lots"}, endpoint="e", model="m").usage.tokens_in is None
    assert parse_message({**GOOD, "model": ["x"]}, endpoint="e", model="m").model == "m"


def test_the_official_sdk_reads_the_fakes_messages_answers(fake_provider):
    import anthropic  # the test extra: the SDK the fake is held to

    sdk = anthropic.Anthropic(
        api_key="sk-ant-test", base_url=fake_provider.base_url.removesuffix("/v1"), max_retries=0
    )
    try:
        body = messages_body("claude-x", _messages("sdk row"), max_tokens=64)
        answer = sdk.messages.create(**body)
        assert answer.content[0].text == expected_answer("sdk row")
        assert answer.stop_reason == "end_turn" and answer.usage.output_tokens > 0
        tool = sdk.messages.create(
            **messages_body("claude-x", _messages("r"), max_tokens=64, json_schema=SCHEMA)
        )
        assert tool.stop_reason == "tool_use" and tool.content[0].input["label"] in ("a", "b")
        fake_provider.configure(script=["429:3"])
        with pytest.raises(anthropic.RateLimitError):
            sdk.messages.create(**body)
        fake_provider.configure(script=["529"])
        with pytest.raises(anthropic.APIStatusError) as caught:
            sdk.messages.create(**body)
        assert caught.value.status_code == 529
    finally:
        sdk.close()
