"""What one item may cost at most (jobs/bounds.py), as pure functions: the input bound is the
bytes of every text the request carries plus what a provider adds around them, the output bound
the request's max_tokens; a usage past either is one no honest provider bills. Each figure at
equality and one over; ASCII beside multi-byte text; a --schema in each protocol. The contract
suite holds the stores to reserving these (tests/contract/test_reservation_rule.py)."""

from __future__ import annotations

import json

from hermes_bulk.jobs import bounds, prompt
from hermes_bulk.providers import answers
from hermes_bulk.store.records import JobSpec, Usage

SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "string"}}})


def _spec(**kw) -> JobSpec:
    return JobSpec(
        job_id="j",
        instruction=kw.pop("instruction", "Summarise"),
        source="/s",
        source_kind="file",
        concurrency=1,
        retries=0,
        **kw,
    )


def _bytes(messages) -> int:
    return sum(len(m["content"].encode("utf-8")) for m in messages)


def test_the_constants_are_what_the_module_says():
    """Generous on purpose (bounds.py says why): 16 a request, 8 a message, 1,100 for
    Anthropic's tool use, 64 for OpenAI's response_format."""
    assert (bounds.PER_REQUEST_TOKENS, bounds.PER_MESSAGE_TOKENS) == (16, 8)
    assert (bounds.TOOL_USE_TOKENS, bounds.RESPONSE_FORMAT_TOKENS) == (1_100, 64)


def test_the_input_bound_is_every_byte_sent_plus_a_providers_framing():
    spec = _spec()
    for messages in (
        [{"role": "user", "content": "hello"}],
        [{"role": "system", "content": "sys"}, {"role": "user", "content": "héllo ✓"}],
        [],
        [
            {"role": "user", "content": ""},
            {"role": "user", "content": ""},
            {"role": "u", "content": "x"},
        ],
    ):
        assert bounds.input_bound(spec, messages) == 16 + 8 * len(messages) + _bytes(messages)
    # Bytes, not characters: a character of four bytes counts four.
    one = bounds.input_bound(spec, [{"role": "user", "content": "a"}])
    assert bounds.input_bound(spec, [{"role": "user", "content": "𝄞"}]) == one + 3
    assert bounds.input_bound(spec, [{"role": "user", "content": "é"}]) == one + 1


def test_a_schema_adds_its_bytes_as_sent_and_the_protocols_framing():
    messages = [{"role": "user", "content": "x"}]
    plain = bounds.input_bound(_spec(), messages)
    claude = bounds.input_bound(_spec(schema=SCHEMA, protocol="anthropic"), messages)
    assert claude == plain + len(SCHEMA.encode()) + 1_100
    openai = bounds.input_bound(_spec(schema=SCHEMA, protocol="openai"), messages)
    sent = json.dumps(answers.response_format(json.loads(SCHEMA)), ensure_ascii=False)
    assert openai == plain + len(sent.encode()) + 64
    assert len(sent) > len(SCHEMA), "OpenAI's strict form is longer than the user's schema"
    # Non-ASCII in the schema: bytes as sent (not escaped to \\uXXXX, which would be longer)
    wide = json.dumps({"type": "object", "properties": {"é": {"type": "string"}}})
    sent_wide = json.dumps(answers.response_format(json.loads(wide)), ensure_ascii=False)
    assert "é" in sent_wide
    assert bounds.input_bound(_spec(schema=wide), messages) == plain + len(sent_wide.encode()) + 64
    assert (
        bounds.input_bound(_spec(schema=wide, protocol="anthropic"), messages)
        == plain + len(wide.encode()) + 1_100
    )


def test_an_items_worst_case_is_its_input_bound_plus_the_requests_max_tokens():
    spec = _spec(system="Be brief.", max_output_tokens=300)
    text, digest = "the item's text ✓", "b2:0123456789abcdef"
    messages = prompt.build_messages(spec.instruction, "item 1", text, digest, spec.system)
    worst = bounds.worst_case_tokens(spec, "item 1", text, digest)
    assert worst == bounds.input_bound(spec, messages) + 300
    # a job made before every request carried max_tokens: its output estimate
    old = _spec(output_tokens_estimate=77)
    assert (
        bounds.worst_case_tokens(old, "n", "t", "b2:00")
        == bounds.input_bound(old, prompt.build_messages(old.instruction, "n", "t", "b2:00", None))
        + 77
    )


def _item_bound(spec: JobSpec, name: str, content: str, digest: str) -> int:
    text, sent_digest = prompt.item_text(spec, content, digest)
    return bounds.input_bound(
        spec, prompt.build_messages(spec.instruction, name, text, sent_digest, spec.system)
    )


def test_usage_within_both_bounds_is_believed_at_equality():
    spec = _spec(max_output_tokens=100)
    bound = _item_bound(spec, "3", "content", "b2:ff")
    for usage in (
        Usage(bound, 100),
        Usage(0, 0),
        Usage(None, 100),
        Usage(bound, None),
        Usage(None, None),  # nothing reported: nothing to hold
    ):
        assert bounds.beyond_bound(spec, "3", "content", "b2:ff", usage) is None, usage


def test_one_output_token_over_max_tokens_is_beyond_the_bound():
    spec = _spec(max_output_tokens=100)
    why = bounds.beyond_bound(spec, "3", "content", "b2:ff", Usage(1, 101))
    assert why == (
        "the provider billed 101 output tokens for item 3, above the request's max_tokens of "
        "100: the job's limits assume it does not"
    )
    big = _spec(max_output_tokens=1_000)
    assert "billed 1,001 output tokens for item 3, above the request's max_tokens of 1,000" in (
        bounds.beyond_bound(big, "3", None, "", Usage(None, 1_001))
    ), "the output bound needs no content (a batch's result line)"


def test_a_job_without_max_tokens_has_no_output_bound_to_hold():
    spec = _spec(output_tokens_estimate=10)
    assert bounds.beyond_bound(spec, "3", "content", "b2:ff", Usage(1, 10**6)) is None


def test_one_input_token_over_the_bytes_is_beyond_the_bound():
    spec = _spec(max_output_tokens=100, system="Be brief.")
    bound = _item_bound(spec, "7", "contént", "b2:ab")
    assert bounds.beyond_bound(spec, "7", "contént", "b2:ab", Usage(bound, 1)) is None
    why = bounds.beyond_bound(spec, "7", "contént", "b2:ab", Usage(bound + 1, 1))
    assert why == (
        f"the provider billed {bound + 1:,} input tokens for item 7, above the {bound:,} that "
        "its bytes allow: the job's limits assume it does not"
    )
    # without content (a batch line) the input is not held, the output still is
    assert bounds.beyond_bound(spec, "7", None, "", Usage(10**6, 1)) is None


def test_the_input_bound_of_a_templated_item_is_of_what_is_sent():
    """--template: the rendered text is sent, not the record as stored."""
    spec = _spec(max_output_tokens=10, template="Title: {title}")
    record = json.dumps({"title": "T", "body": "x" * 5000})
    bound = _item_bound(spec, "1", record, "b2:00")
    assert bound < 1000, "the body is not sent"
    assert bounds.beyond_bound(spec, "1", record, "b2:00", Usage(bound, 1)) is None
    assert bounds.beyond_bound(spec, "1", record, "b2:00", Usage(bound + 1, 1)) is not None
