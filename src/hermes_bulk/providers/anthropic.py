"""Anthropic's Messages API, natively: the second protocol beside OpenAI's chat completions.

`AnthropicModelClient` is `HttpModelClient` with Anthropic's request, headers and answer: the
system text as a system block, the item's request as one user message whose shared part (the
instruction) ends in a prompt-cache breakpoint when system and instruction are long enough to be
cached, `--schema` as one tool with that `input_schema` and a forced `tool_choice`, and
`max_tokens`, which the API requires. Errors are classified as every client's
(`client.classify_status`: 429 with Retry-After, 529 "overloaded" and 5xx transient, 400/401/
403/404 permanent); provider text goes to the log only.

Its own client, not the `anthropic` SDK: importing the SDK (pydantic, opentelemetry and an HTTP
stack of its own) costs over a second at start, and this one sends on the same per-thread
kept-alive connection as the OpenAI client (transport.JsonPoster). The tests run the SDK
against the loopback provider, so the fake stays true to the real client.

Nothing the provider answers is trusted: `parse_message` reads a Messages answer (a live
response, or a batch result's `message`) field by field, as `parse_completion` reads a chat
completion.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from ..errors import (
    InvalidAnswer,
    ModelError,
    PermanentModelError,
    TransientModelError,
    with_usage,
)
from ..store.protocol import Usage
from .bodies import (  # the request is built there, for the dry run too
    TOOL_NAME,
    messages_body,
    split_shared,  # noqa: F401 - part of this protocol's surface
)
from .client import Completion, HttpModelClient, token_count, truncated

log = logging.getLogger("hermes_bulk.providers.anthropic")

#: Its name as HERMES_BULK_PROVIDER and a job's record give it (config/provider.py).
PROTOCOL = "anthropic"
#: The Messages API version every request names (the one the API's docs and SDKs send).
API_VERSION = "2023-06-01"
#: stop_reason values of an answer cut short: at max_tokens, or where the context window ended
_CUT = frozenset({"max_tokens", "model_context_window_exceeded"})
#: stop_reason values: the answer ended, or a tool was called, or it was cut at max_tokens.
_ENDED = frozenset({"end_turn", "stop_sequence", "tool_use"})


def auth_headers(api_key: str | None) -> dict[str, str]:
    """What every request to the API carries: its version, and the key (x-api-key, not Bearer)."""
    return {"anthropic-version": API_VERSION, **({"x-api-key": api_key} if api_key else {})}


class AnthropicModelClient(HttpModelClient):
    """The Messages API over HTTP (`POST {base_url}/messages`; base_url ends in /v1)."""

    PATH = "messages"

    def request_headers(self, api_key: str | None) -> dict[str, str]:
        return auth_headers(api_key)

    def request_body(self, messages, *, max_tokens, json_schema=None, options=None):
        return messages_body(
            self.model, messages, max_tokens=max_tokens, json_schema=json_schema, options=options
        )

    def parse(self, data: Any, max_tokens: int | None) -> Completion:
        return parse_message(data, endpoint=self.endpoint, model=self.model, max_tokens=max_tokens)


def parse_message(
    data: Any, *, endpoint: str, model: str, max_tokens: int | None = None
) -> Completion:
    """A Messages answer as a Completion; raises InvalidAnswer (malformed), TruncatedAnswer
    (stop_reason max_tokens), PermanentModelError (a refusal) or TransientModelError (empty).

    Anthropic's input_tokens leaves out what was read from or written to the prompt cache; the
    input recorded is all three, and the reads are the cached part (priced as cached). An answer
    refused here carries the usage it reports (ModelError.usage): the provider billed it."""
    try:
        return _parse_message(data, endpoint=endpoint, model=model, max_tokens=max_tokens)
    except ModelError as exc:
        raise with_usage(exc, message_usage(data)) from None


def message_usage(data: Any) -> Usage:
    """The usage a Messages answer reports (input with the cache's reads and writes, output),
    read leniently; Usage() when it has none."""
    usage = data.get("usage") if isinstance(data, dict) else None
    if not isinstance(usage, dict):
        return Usage()
    fresh, tokens_out = (
        token_count(usage.get("input_tokens")),
        token_count(usage.get("output_tokens")),
    )
    read = token_count(usage.get("cache_read_input_tokens")) or 0
    written = token_count(usage.get("cache_creation_input_tokens")) or 0
    tokens_in = None if fresh is None else fresh + read + written
    return Usage(
        tokens_in,
        tokens_out,
        read if tokens_in is not None and read else None,
        tokens_written=written if tokens_in is not None and written else None,
    )


def _parse_message(data: Any, *, endpoint: str, model: str, max_tokens: int | None) -> Completion:
    if not isinstance(data, dict) or data.get("type") != "message":
        raise _malformed(endpoint, data, "it is not a message")
    content, stop = data.get("content"), data.get("stop_reason")
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise _malformed(endpoint, data, "its content is not a list of blocks")
    if stop is not None and not isinstance(stop, str):
        raise _malformed(endpoint, data, "its stop_reason is not text")
    if stop in _CUT:
        raise truncated(max_tokens)
    if stop == "refusal":
        log.warning("the model refused an item at %s: %s", endpoint, _sample(data))
        raise PermanentModelError(
            "the model refused to answer this item (the refusal is in the log)", http_status=200
        )
    if stop is not None and stop not in _ENDED:
        raise _malformed(endpoint, data, f"its stop_reason is {stop[:40]!r}")
    text = _answer_text(content, endpoint, data)
    if not text.strip():
        raise TransientModelError("the provider returned an empty answer", http_status=200)
    reported_model = data.get("model")
    return Completion(
        text=text,
        usage=message_usage(data),
        provider=endpoint,
        model=reported_model if isinstance(reported_model, str) and reported_model else model,
    )


def _answer_text(content: list[dict[str, Any]], endpoint: str, data: Any) -> str:
    """The text blocks joined, or a --schema answer's tool input as JSON text (the pipeline
    checks it against the schema)."""
    tools = [b for b in content if b.get("type") == "tool_use"]
    if tools:
        given = tools[0].get("input")
        if tools[0].get("name") != TOOL_NAME or not isinstance(given, dict):
            raise _malformed(endpoint, data, "its tool call is not the answer's")
        return json.dumps(given, ensure_ascii=False)
    texts = [b.get("text") for b in content if b.get("type") == "text"]
    if not all(isinstance(t, str) for t in texts):
        raise _malformed(endpoint, data, "a text block holds no text")
    return "".join(texts)


def _malformed(endpoint: str, data: Any, what: str) -> InvalidAnswer:
    log.warning("malformed answer from %s: %s", endpoint, _sample(data))
    return InvalidAnswer(f"the provider's answer is not a Messages answer: {what}", http_status=200)


def _sample(data: Any) -> str:
    try:
        return json.dumps(data, ensure_ascii=False)[:2000]
    except (TypeError, ValueError, RecursionError):
        return "(not printable)"
