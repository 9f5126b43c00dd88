"""What the loopback provider answers: each item's own answer (deterministic, so a test can check
that every result answers its own item), a --schema answer that fits (or breaks) the schema, and
the hostile bodies (HOSTILE) a careful client must refuse."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

_ITEM = re.compile(r"----- BEGIN ITEM (\w+) -----\n(.*)\n----- END ITEM \1 -----", re.S)


def item_text(prompt: str) -> str:
    """The item inside a hermes-bulk prompt (the whole prompt when it is not one)."""
    m = _ITEM.search(prompt)
    return m.group(2) if m else prompt


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def expected_answer(item: str) -> str:
    """What the fake answers for an item: its digest, then its first line (so results read well)."""
    first = item.strip().splitlines()[0][:60] if item.strip() else ""
    return f"ANSWER[{digest(item)}] {first}"


#: Fault kinds answered with HTTP 200 and a body a careful client must refuse.
HOSTILE = {
    "length": "finish_reason length, the text cut in half, all of max_tokens used",
    "length_silent": "no finish_reason, and completion_tokens equal to the request's max_tokens",
    "off_schema": "a --schema answer that breaks the schema (a value outside its enum, or the "
    "wrong type)",
    "prose": "text that is not JSON, for a --schema request",
    "refusal": "content null and a refusal",
    "no_choices": "choices is an empty list",
    "choices_not_list": "choices is an object",
    "choice_not_object": "choices[0] is a string",
    "message_not_object": "message is a string",
    "content_list": "content is a list of parts",
    "content_number": "content is a number",
    "usage_string": "usage is a string",
    "finish_reason_number": "finish_reason is a number",
    "model_list": "model is a list",
    "duplicate_key": "content given twice in one message (parsers disagree on which counts)",
    "html": "an HTML page",
    "deep": "JSON nested 100,000 deep",
    "huge": "a 50 MB body",
}


def content_text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return str(content or "")


def schema_answer(schema: dict[str, Any], item: str, *, off: bool = False) -> dict[str, Any]:
    """A structured answer that fits an object schema (nested objects, lists, enums, consts); with
    `off`, its first property breaks the schema (a value outside the enum, else the wrong type)."""
    out = _fit(schema, item, "")
    props = list((schema.get("properties") or {}).items())
    if off and props:
        name, prop = props[0]
        wrong = "not-in-the-enum" if isinstance(prop, dict) and "enum" in prop else None
        if wrong is None:
            wrong = "a string" if isinstance(prop, dict) and prop.get("type") != "string" else 12345
        out[name] = wrong
    return out


def _fit(schema: Any, item: str, name: str) -> Any:
    if not isinstance(schema, dict):
        return f"{name}:{digest(item)}"
    if "enum" in schema:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    kind = schema.get("type")
    kind = next((k for k in kind if k != "null"), None) if isinstance(kind, list) else kind
    if kind == "object" or "properties" in schema:
        return {
            key: _fit(prop, item, key) for key, prop in (schema.get("properties") or {}).items()
        }
    if kind == "array":
        return [_fit(schema.get("items"), item, name)]
    if kind in ("integer", "number"):
        return len(item)
    if kind == "boolean":
        return bool(item)
    return f"{name}:{digest(item)}"


def hostile_body(fault: str, req: dict[str, Any], body: dict[str, Any]) -> dict[str, Any] | bytes:
    """The answer body for a fault of HOSTILE (the body unchanged for any other fault)."""
    choice = body["choices"][0]
    message = choice["message"]
    limit = req.get("max_tokens") or req.get("max_completion_tokens")  # Hermes sends either
    if fault == "length":
        choice["finish_reason"] = "length"
        message["content"] = message["content"][: len(message["content"]) // 2]
        if isinstance(body.get("usage"), dict) and limit:
            body["usage"]["completion_tokens"] = limit
    elif fault == "length_silent":
        del choice["finish_reason"]
        if isinstance(body.get("usage"), dict):
            body["usage"]["completion_tokens"] = limit or 100
    elif fault == "refusal":
        message.update(content=None, refusal="I can't help with that (sk-LEAKED-1234)")
    elif fault in _RESHAPE:
        _RESHAPE[fault](body)
    elif fault == "duplicate_key":
        text = json.dumps(body)
        return text.replace('"content": ', '"content": "sk-LEAKED-1234", "content": ', 1).encode()
    elif fault == "html":
        return b"<html><body><h1>Welcome to the captive portal</h1> sk-LEAKED-1234</body></html>"
    elif fault == "deep":
        return b"[" * 100_000 + b"]" * 100_000
    elif fault == "huge":
        message["content"] = "x" * (50 * 1024 * 1024)
    return body


_RESHAPE = {
    "no_choices": lambda b: b.update(choices=[]),
    "choices_not_list": lambda b: b.update(choices={"0": b["choices"][0]}),
    "choice_not_object": lambda b: b.update(choices=["sk-LEAKED-1234"]),
    "message_not_object": lambda b: b["choices"][0].update(message="sk-LEAKED-1234"),
    "content_list": lambda b: b["choices"][0]["message"].update(
        content=[{"type": "text", "text": b["choices"][0]["message"]["content"]}]
    ),
    "content_number": lambda b: b["choices"][0]["message"].update(content=42),
    "usage_string": lambda b: b.update(usage="sk-LEAKED-1234"),
    "finish_reason_number": lambda b: b["choices"][0].update(finish_reason=7),
    "model_list": lambda b: b.update(model=["sk-LEAKED-1234"]),
}


def chat_completion(base: dict[str, Any], usage: Any, answer: str) -> dict[str, Any]:
    """A chat-completions answer body: one choice, finished, with its usage."""
    return {
        **base,
        "object": "chat.completion",
        "usage": usage,
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": answer},
            }
        ],
    }
