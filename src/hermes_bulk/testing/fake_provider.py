"""A loopback server of the OpenAI chat-completions and Anthropic Messages protocols, with
injectable faults.

Used by the tests, the benchmarks and the demo (when no endpoint is configured). It speaks
HTTP/1.1 with keep-alive on asyncio, so thousands of concurrent requests cost little, and
answers each item deterministically (`expected_answer`), so a test can check that every result
is the answer to its own item.

Its knobs and faults (FakeConfig, set at start or live through `configure()` / `POST /_control`)
and the gate are described in fake_config.py; the parts live beside this module: fake_http.py
(the HTTP plumbing), fake_faults.py (what a request meets before its answer), fake_answers.py
(what is answered), fake_anthropic.py (the Messages protocol), fake_batches.py and
fake_message_batches.py (the Batch API and Message Batches).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import threading
import time
from typing import Any

from .fake_answers import (
    HOSTILE,
    chat_completion,
    content_text,
    digest,
    expected_answer,
    hostile_body,
    item_text,
    schema_answer,
)
from .fake_anthropic import MessagesAnswers, anthropic_error, as_chat_request
from .fake_batches import FakeBatches
from .fake_config import FakeConfig, RequestRecord, bill
from .fake_faults import Faults
from .fake_http import LoopbackServer, reset_connection

#: What tests, benchmarks and scripts import from here (the loopback provider's front door).
__all__ = [
    "HOSTILE",
    "FakeConfig",
    "FakeProvider",
    "RequestRecord",
    "anthropic_error",
    "as_chat_request",
    "digest",
    "expected_answer",
    "item_text",
    "main",
]


class FakeProvider(LoopbackServer, Faults, MessagesAnswers):
    """Run with start() (a background thread) or serve_forever(); base_url ends in /v1."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, **config: Any) -> None:
        super().__init__(host, port)
        self.config = FakeConfig(**config)
        self.requests: list[RequestRecord] = []
        self._rng = random.Random(self.config.seed)
        self._lock = threading.Lock()
        self._prefixes: set[str] = set()  # prompt prefixes seen (prompt_cache_min_tokens)
        self._tokens = 0.0
        self._tokens_at = time.monotonic()
        self.in_flight = 0  # chat requests being answered now
        self.max_in_flight = 0
        self.batches = FakeBatches(self)
        self._arrived = threading.Condition(self._lock)  # notified as each chat request is recorded
        self._gate_open: asyncio.Event | None = None  # made on the server's loop; set = open
        self._hold_at_start = False
        self._let_through = 0  # requests the closed gate still lets pass (hold(let_through=n))
        self.held = 0  # chat requests waiting at the closed gate now
        self._answered = 0  # answers given so far: FakeConfig.output_tokens's n

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    # Control -------------------------------------------------------------------------------
    def configure(self, **changes: Any) -> None:
        with self._lock:
            for key, value in changes.items():
                if not hasattr(self.config, key):
                    raise ValueError(f"unknown fake-provider setting {key!r}")
                setattr(self.config, key, value)
            if "seed" in changes:
                self._rng = random.Random(self.config.seed)
            if "rate_per_s" in changes:
                self._tokens, self._tokens_at = (self.config.rate_per_s or 0.0), time.monotonic()

    def wait_requests(self, n: int, timeout: float = 60.0) -> list[RequestRecord]:
        """Block until at least n chat requests have arrived (answered or held); their records."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: len(self.requests) >= n, timeout):
                raise AssertionError(
                    f"{len(self.requests)} requests reached the fake provider in {timeout}s, "
                    f"not {n}"
                )
            return list(self.requests)

    def reset_records(self) -> None:
        with self._lock:
            self.requests.clear()
            self.batches.lines.clear()
            self.batches.busy.clear()
            self.max_in_flight = self.in_flight
            self._answered = 0

    def billed(self) -> tuple[int, int]:
        """(input, output) tokens billed so far, live and in batches: every answer sent with a
        usage counts, whether or not the client keeps it (a cut or off-schema answer too)."""
        with self._lock:
            records = [*self.requests, *self.batches.lines]
        return sum(r.billed_in for r in records), sum(r.billed_out for r in records)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            by_status: dict[str, int] = {}
            for r in self.requests:
                by_status[str(r.status)] = by_status.get(str(r.status), 0) + 1
            stats = {
                "requests": len(self.requests),
                "by_status": by_status,
                "max_in_flight": self.max_in_flight,
                "batches": len(self.batches.created),
                "batch_lines": len(self.batches.lines),
            }
        stats["batch_busy_s"] = self.batches.busy_s()
        stats["billed"] = dict(zip(("input", "output"), self.billed(), strict=True))
        return stats

    async def _route(
        self,
        method: str,
        target: str,
        body: bytes,
        writer: asyncio.StreamWriter,
        headers: dict[str, str] | None = None,
    ) -> bool:
        path = target.split("?", 1)[0]  # a base URL may carry a query (…/v1?api-key=…)
        refused = self._refused(path, body, headers or {})
        if refused is not None:
            return self._send(writer, *refused)
        if method == "GET" and path.endswith("/models"):
            known = self.config.models if self.config.models is not None else ["fake-model"]
            return self._send(
                writer,
                200,
                {"object": "list", "data": [{"id": m, "object": "model"} for m in known]},
            )
        if method == "GET" and path == "/_stats":
            return self._send(writer, 200, self.stats())
        if method == "POST" and path == "/_control":
            payload = json.loads(body or b"{}")
            if payload.pop("reset_records", False):
                self.reset_records()
            gate, let_through = payload.pop("gate", None), int(payload.pop("let_through", 0))
            if gate == "hold":  # as hold() and release(), here on the server's own loop
                with self._lock:
                    self._let_through = let_through
                self._gate_open.clear()
            elif gate == "release":
                self._gate_open.set()
            self.configure(**payload)
            return self._send(writer, 200, {"ok": True})
        if method == "GET" and path == "/_requests":
            with self._lock:
                return self._send(writer, 200, [r.__dict__ for r in self.requests])
        if method == "POST" and path.endswith(("/chat/completions", "/v1/messages")):
            return await self._chat(
                json.loads(body or b"{}"),
                writer,
                self._echo(target, headers or {}),
                anthropic=path.endswith("/messages"),
            )
        if "/files" in path or "/batches" in path:
            status, obj = self.batches.route(method, path, target, body, headers or {})
            delay = (
                {
                    "files": self.config.batch_upload_delay_s,
                    "batches": self.config.batch_create_delay_s,
                }.get(path.rstrip("/").rsplit("/", 1)[-1], 0.0)
                if method == "POST"
                else 0.0
            )
            if delay:
                await asyncio.sleep(delay)
            return await self._send_batch_answer(writer, status, obj)
        return self._send(writer, 404, {"error": {"message": "not found"}})

    async def _chat(
        self,
        req: dict[str, Any],
        writer: asyncio.StreamWriter,
        echo: str = "",
        anthropic: bool = False,
    ) -> bool:
        self.in_flight += 1  # the event loop is one thread: no lock needed
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if anthropic:
                return await self._answer(as_chat_request(req), writer, echo, req)
            return await self._answer(req, writer, echo)
        finally:
            self.in_flight -= 1

    async def _answer(
        self,
        req: dict[str, Any],
        writer: asyncio.StreamWriter,
        echo: str = "",
        messages_req: dict[str, Any] | None = None,
    ) -> bool:
        """Answer a chat request; messages_req: the Anthropic request it stands for, answered
        in that protocol's shape."""
        messages = req.get("messages") or []
        prompt = "\n".join(
            content_text(m.get("content")) for m in messages if m.get("role") == "user"
        )
        item = item_text(prompt)
        fault, record = self._decide(item, req=req)
        record.body = req if messages_req is None else messages_req
        if messages_req is not None:
            record.protocol = "anthropic"
        await self._wait_at_gate()
        if self.config.latency_s:
            await asyncio.sleep(self.config.latency_s)
        if fault == "reset":
            reset_connection(writer)
            return False
        if fault == "timeout":
            await asyncio.sleep(self.config.hang_s)
            reset_connection(writer)
            return False
        if fault == "drip":
            return await self._drip(writer)
        if fault.startswith("429"):
            record.status = 429
            return self._send_429(writer, fault, echo, anthropic=messages_req is not None)
        if fault.isdigit():
            record.status = int(fault)
            message = f"fake {fault}: key sk-LEAKED-1234 invalid{echo}"
            limits = self.limit_headers(anthropic=messages_req is not None)
            if messages_req is not None:
                return self._send(writer, int(fault), anthropic_error(int(fault), message), limits)
            return self._send(writer, int(fault), {"error": {"message": message}}, limits)
        record.status = 200
        return await self._send_answer(req, writer, record, (item, prompt, fault), messages_req)

    async def _send_answer(
        self,
        req: dict[str, Any],
        writer: asyncio.StreamWriter,
        record: RequestRecord,
        asked: tuple[str, str, str],
        messages_req: dict[str, Any] | None,
    ) -> bool:
        """The answer to a request let through (fault "ok", "empty" or one of HOSTILE), in the
        protocol asked, streamed when asked; asked: (item, prompt, fault)."""
        item, prompt, fault = asked
        answer, usage, base = self.answer_parts(req, item, prompt, fault)
        limits = self.limit_headers(anthropic=messages_req is not None)
        if messages_req is not None:
            message = self._message_body(messages_req, answer, usage, fault)
            bill(record, message)
            if messages_req.get("stream"):  # Hermes' Anthropic client streams
                return await self._stream_message(writer, message)
            return self._send(writer, 200, message, limits)
        if req.get("stream"):
            bill(record, {"usage": usage})
            return await self._stream(writer, base, answer, usage)
        body = hostile_body(fault, req, chat_completion(base, usage, answer))
        if isinstance(body, bytes):
            return self._send_bytes(
                writer, 200, body, "text/html" if fault == "html" else "application/json"
            )
        bill(record, body)
        return self._send(writer, 200, body, limits)

    @staticmethod
    def item_of(req: dict[str, Any]) -> str:
        """The item a chat-completions request body asks about."""
        messages = req.get("messages") or []
        return item_text(
            "\n".join(content_text(m.get("content")) for m in messages if m.get("role") == "user")
        )

    def line_answer(
        self, req: dict[str, Any], records: list[RequestRecord]
    ) -> tuple[int, dict[str, Any]]:
        """A batch line's response, (status code, body), with the faults a live call would get;
        0 for a line that failed without a response (a timeout or reset live)."""
        messages = req.get("messages") or []
        prompt = "\n".join(
            content_text(m.get("content")) for m in messages if m.get("role") == "user"
        )
        item = item_text(prompt)
        fault, record = self._decide(item, records, req)
        if fault.startswith("429"):
            record.status = 429
            return 429, {
                "error": {
                    "message": "Rate limit reached (secret sk-LEAKED-1234)",
                    "type": "rate_limit",
                }
            }
        if fault.isdigit():
            record.status = int(fault)
            return int(fault), {"error": {"message": f"fake {fault}: key sk-LEAKED-1234 invalid"}}
        if fault in ("timeout", "reset"):
            return 0, {}
        record.status = 200
        answer, usage, base = self.answer_parts(req, item, prompt, fault)
        body = hostile_body(fault, req, chat_completion(base, usage, answer))
        if isinstance(body, bytes):
            return 200, body.decode("utf-8", "replace")[:1000]
        bill(record, body)
        return 200, body

    def _cached_tokens(self, req: dict[str, Any], prompt: str) -> int:
        """The prefix of this request served from the cache: the system text and the user text
        before the item (its "Item <name>" line), once an earlier request sent the same (counted
        as prompt_tokens is). A provider caches the longest prefix it saw; ours ends there."""
        system = "\n".join(
            content_text(m.get("content"))
            for m in req.get("messages") or []
            if isinstance(m, dict) and m.get("role") == "system"
        )
        prefix = system + "\n" + prompt.split("\n\nItem ", 1)[0]
        tokens = min(len(prefix) // 4, max(1, len(prompt) // 4))
        with self._lock:
            seen = prefix in self._prefixes
            self._prefixes.add(prefix)
        if not seen or tokens < self.config.prompt_cache_min_tokens:
            return 0
        return tokens // 128 * 128

    def _honest(self, req: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
        """usage as the worst an honest provider bills (output_tokens, input_as_bytes)."""
        if self.config.input_as_bytes:
            usage["prompt_tokens"] = sum(
                len(content_text(m.get("content")).encode("utf-8"))
                for m in req.get("messages") or []
            )
        if self.config.output_tokens:
            with self._lock:
                n, self._answered = self._answered, self._answered + 1
            planned = self.config.output_tokens[min(n, len(self.config.output_tokens) - 1)]
            cap = req.get("max_tokens")
            usage["completion_tokens"] = min(planned, cap) if isinstance(cap, int) else planned
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return usage

    def answer_parts(self, req: dict[str, Any], item: str, prompt: str, fault: str):
        """The answer to a request that is answered (fault "ok" or "empty"): text, usage, base
        fields."""
        answer = "" if fault == "empty" else expected_answer(item)
        if (
            req.get("response_format", {}).get("type") == "json_schema"
            and answer
            and fault != "prose"
        ):
            schema = req["response_format"]["json_schema"].get("schema", {})
            answer = json.dumps(schema_answer(schema, item, off=fault == "off_schema"))
        cap = req.get("max_tokens") or req.get("max_completion_tokens")
        out = max(1, len(answer) // 4)
        usage = {
            "prompt_tokens": max(1, len(prompt) // 4),
            # an honest provider bills no more than the request's max_tokens
            "completion_tokens": min(out, cap) if isinstance(cap, int) else out,
            "prompt_tokens_details": {"cached_tokens": self._cached_tokens(req, prompt)},
        }
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        usage = self.config.usage if self.config.usage is not None else self._honest(req, usage)
        base = {
            "id": f"chatcmpl-{digest(item)}",
            "created": int(time.time()),
            "model": req.get("model") or "fake-model",
        }
        return answer, usage, base

    async def _serve(self) -> None:
        self._gate_open = asyncio.Event()  # on the server's own loop, before the first request
        if not self._hold_at_start:
            self._gate_open.set()
        await super()._serve()

    def stop(self) -> None:
        super().stop()
        self.batches.close()

    async def _stream(self, writer, base, answer, usage) -> bool:
        chunks = [
            [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": answer},
                    "finish_reason": None,
                }
            ],
            [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            [],
        ]
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
        )
        for choices in chunks:
            chunk = {
                **base,
                "object": "chat.completion.chunk",
                "choices": choices,
                **({} if choices else {"usage": usage}),
            }
            writer.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        writer.write(b"data: [DONE]\n\n")
        await writer.drain()
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument(
        "--rate", type=float, default=None, help="provider limit, requests per second"
    )
    args = parser.parse_args()
    server = FakeProvider(
        args.host, args.port, latency_s=args.latency, rate_per_s=args.rate
    ).start()
    print(server.base_url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
