"""Anthropic's Messages protocol on the loopback provider.

`POST /v1/messages` is served by the same code as chat completions: a request is read as the
chat request it stands for (`as_chat_request`), so every fault, the gate and the records apply,
and answered in the Messages shape (content blocks, stop_reason, usage with cache reads and
writes; a --schema request's tool called; errors as {"type": "error", "error": {...}}, 529
overloaded included). Its prompt cache is Anthropic's: a prefix up to a `cache_control`
breakpoint of at least `prompt_cache_min_tokens` is written on first sight and read after.
`x-api-key` is the key there. Message Batches (`/v1/messages/batches`: create with the requests
inline, get, list, cancel, results) are the same batches underneath (fake_batches.py), answered
in Anthropic's shapes (fake_message_batches.py).
"""

from __future__ import annotations

import json
from typing import Any

from .fake_answers import content_text, digest, item_text
from .fake_config import RequestRecord, bill

#: Anthropic's error type for each status (its API's error shapes).
ANTHROPIC_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    return {
        "type": "error",
        "error": {"type": ANTHROPIC_ERRORS.get(status, "api_error"), "message": message},
    }


def text_blocks(content: Any) -> list[dict[str, Any]]:
    """A Messages system or content field as its text blocks (a string is one)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [b for b in content if isinstance(b, dict) and b.get("type") == "text"]
    return []


def as_chat_request(req: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions request a Messages request stands for: its system and user text as
    messages, a --schema tool as response_format, the other fields as they are."""
    chat = {k: v for k, v in req.items() if k not in ("system", "messages", "tools", "tool_choice")}
    system = "".join(str(b.get("text", "")) for b in text_blocks(req.get("system")))
    chat["messages"] = [{"role": "system", "content": system}] if system else []
    for m in req.get("messages") or []:
        if isinstance(m, dict):
            text = "".join(str(b.get("text", "")) for b in text_blocks(m.get("content")))
            chat["messages"].append({"role": m.get("role"), "content": text})
    tools = [t for t in req.get("tools") or [] if isinstance(t, dict)]
    if tools:
        chat["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": tools[0].get("name"), "schema": tools[0].get("input_schema")},
        }
    return chat


class MessagesAnswers:
    """The Messages answers of FakeProvider (mixed into it: its config, lock, decisions and
    prompt-cache prefixes are the ones used here)."""

    def message_line_answer(
        self, params: dict[str, Any], records: list[RequestRecord]
    ) -> tuple[int, dict[str, Any]]:
        """A Message Batches request's result, (status code, message or error object), with the
        faults a live call would get; 0 for a request that failed without an answer."""
        req = as_chat_request(params)
        messages = req.get("messages") or []
        prompt = "\n".join(
            content_text(m.get("content")) for m in messages if m.get("role") == "user"
        )
        item = item_text(prompt)
        fault, record = self._decide(item, records, req)
        record.protocol = "anthropic"
        if fault.startswith("429"):
            record.status = 429
            return 429, anthropic_error(429, "Rate limited (secret sk-LEAKED-1234)")
        if fault.isdigit():
            record.status = int(fault)
            return int(fault), anthropic_error(int(fault), f"fake {fault}: key sk-LEAKED-1234")
        if fault in ("timeout", "reset"):
            return 0, {}
        record.status = 200
        answer, usage, _ = self.answer_parts(req, item, prompt, fault)
        message = self._message_body(params, answer, usage, fault)
        bill(record, message)
        return 200, message

    def _message_body(
        self, req: dict[str, Any], answer: str, usage: dict[str, Any], fault: str
    ) -> dict[str, Any]:
        """A Messages answer: the text (or the --schema tool's call), stop_reason, and usage with
        the prompt cache's reads and writes taken out of input_tokens, as Anthropic counts."""
        prompt_tokens = usage.get("prompt_tokens", 0) if self.config.usage is None else 0
        read, written = self._anthropic_cache(req)
        read, written = (
            min(read, prompt_tokens),
            min(written, prompt_tokens - min(read, prompt_tokens)),
        )
        reported = (
            self.config.usage
            if self.config.usage is not None
            else {
                "input_tokens": prompt_tokens - read - written,
                "output_tokens": usage.get("completion_tokens", 0),
                "cache_creation_input_tokens": written,
                "cache_read_input_tokens": read,
            }
        )
        tools = req.get("tools") or []
        if tools and answer and fault != "prose":
            content = [
                {
                    "type": "tool_use",
                    "id": "toolu_" + digest(answer),
                    "name": tools[0].get("name"),
                    "input": json.loads(answer),
                }
            ]
            stop = "tool_use"
        else:
            content = [{"type": "text", "text": answer}] if answer else []
            stop = "end_turn"
        if fault == "length":
            content, stop = [{"type": "text", "text": answer[: len(answer) // 2]}], "max_tokens"
        elif fault == "refusal":
            content, stop = [], "refusal"
        return {
            "id": "msg_" + digest(answer or "empty"),
            "type": "message",
            "role": "assistant",
            "model": req.get("model") or "fake-model",
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": reported,
        }

    def _anthropic_cache(self, req: dict[str, Any]) -> tuple[int, int]:
        """(read, written) tokens of the prompt cache: the text up to the last cache_control
        breakpoint (system, then the user's blocks), about len // 4 tokens, written the first time
        it is seen and read after, when at least prompt_cache_min_tokens long."""
        blocks = text_blocks(req.get("system")) + [
            b
            for m in req.get("messages") or []
            if isinstance(m, dict)
            for b in text_blocks(m.get("content"))
        ]
        marked = [i for i, b in enumerate(blocks) if b.get("cache_control")]
        if not marked:
            return 0, 0
        prefix = "\x00".join(str(b.get("text", "")) for b in blocks[: marked[-1] + 1])
        tokens = len(prefix) // 4
        if tokens < self.config.prompt_cache_min_tokens:
            return 0, 0
        key = "anthropic\x00" + prefix
        with self._lock:
            seen = key in self._prefixes
            self._prefixes.add(key)
        return (tokens, 0) if seen else (0, tokens)

    @staticmethod
    async def _stream_message(writer, message: dict[str, Any]) -> bool:
        """A Messages answer as the streaming API sends it: its events, one block at a time."""
        usage = message.get("usage") or {}
        events: list[dict[str, Any]] = [
            {
                "type": "message_start",
                "message": {
                    **message,
                    "content": [],
                    "stop_reason": None,
                    "usage": {**usage, "output_tokens": 0},
                },
            }
        ]
        for i, block in enumerate(message["content"]):
            if block["type"] == "tool_use":
                start = {**block, "input": {}}
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            else:
                start = {"type": "text", "text": ""}
                delta = {"type": "text_delta", "text": block["text"]}
            events += [
                {"type": "content_block_start", "index": i, "content_block": start},
                {"type": "content_block_delta", "index": i, "delta": delta},
                {"type": "content_block_stop", "index": i},
            ]
        events += [
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": usage.get("output_tokens", 0)},
            },
            {"type": "message_stop"},
        ]
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
        )
        for event in events:
            writer.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
        await writer.drain()
        return False
