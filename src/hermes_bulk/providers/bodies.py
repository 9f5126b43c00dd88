"""The request for one item, by protocol: the one builder both the send (each client's
request_body, a batch's lines) and create --dry-run use, so the dry run shows what is sent.
It speaks to no provider (the jobs API may import it)."""

from __future__ import annotations

from typing import Any

from . import answers

#: The protocol name of Anthropic's Messages API (config/provider.py's ANTHROPIC: a provider
#: module imports no configuration).
ANTHROPIC = "anthropic"
#: max_tokens is required by the Messages API; without --max-output-tokens this is sent.
DEFAULT_MAX_TOKENS = 4096
#: The tool a --schema answer is asked through (its input is the answer).
TOOL_NAME = answers.SCHEMA_NAME
#: The breakpoint goes after the shared prefix when it is at least this long (estimated): the
#: smallest minimum any Claude model caches (512 to 4,096 tokens by model, and changing with each
#: release). A breakpoint on a prefix below the model's own minimum is ignored by the API at no
#: cost, so a table of minimums kept here could only lose savings when it goes stale.
CACHE_FLOOR_TOKENS = 512


def split_shared(user_text: str) -> tuple[str, str]:
    """The user message as (what every item shares: the instruction, the item's part): cut
    before the "Item … BEGIN ITEM" lines (jobs/prompt.build_messages). Joined, the two are the
    text; where no cut is found, all of it is the item's part."""
    begin = user_text.find("\n----- BEGIN ITEM ")
    cut = user_text.rfind("\n\nItem ", 0, begin) if begin >= 0 else -1
    return (user_text[:cut], user_text[cut:]) if cut > 0 else ("", user_text)


def messages_body(
    model: str,
    messages: list[dict[str, Any]],
    *,
    max_tokens: int | None,
    json_schema: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The Messages request for one item: what complete() sends, and what a Message Batches
    request carries as its params."""
    system = "\n\n".join(str(m["content"]) for m in messages if m.get("role") == "system")
    user = "\n\n".join(str(m["content"]) for m in messages if m.get("role") == "user")
    shared, item = split_shared(user)
    cache = (len(system) + len(shared)) // 4 >= CACHE_FLOOR_TOKENS
    content: list[dict[str, Any]] = []
    if shared:
        block: dict[str, Any] = {"type": "text", "text": shared}
        if cache:  # one breakpoint: system and instruction are the cached prefix
            block["cache_control"] = {"type": "ephemeral"}
        content.append(block)
    content.append({"type": "text", "text": item})
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens or DEFAULT_MAX_TOKENS,
        "messages": [{"role": "user", "content": content}],
        **(options or {}),
    }
    if system:
        body["system"] = [{"type": "text", "text": system}]
    if json_schema is not None:
        body["tools"] = [
            {
                "name": TOOL_NAME,
                "description": "Record the answer for this item.",
                "input_schema": json_schema,
            }
        ]
        body["tool_choice"] = {"type": "tool", "name": TOOL_NAME}
    return body


def chat_body(
    model: str,
    messages: list[dict[str, Any]],
    *,
    max_tokens: int | None,
    json_schema: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The chat-completions request for one item; what create --dry-run shows (bodies.py).
    options never hold the fields set here (model_options.OWN_FIELDS)."""
    body: dict[str, Any] = {"model": model, "messages": messages, **(options or {})}
    if max_tokens:
        body["max_tokens"] = max_tokens
    if json_schema is not None:
        body["response_format"] = answers.response_format(json_schema)
    return body


def request_body(
    protocol: str,
    model: str,
    messages: list[dict[str, Any]],
    *,
    max_tokens: int | None,
    json_schema: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The Messages request (protocol anthropic) or the chat-completions one (any other)."""
    build = messages_body if protocol == ANTHROPIC else chat_body
    return build(model, messages, max_tokens=max_tokens, json_schema=json_schema, options=options)
