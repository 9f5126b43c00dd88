"""A loopback server of the OpenAI chat-completions and Anthropic Messages protocols, with
injectable faults.

Used by the tests, the benchmarks and the demo (when no endpoint is configured). It speaks
HTTP/1.1 with keep-alive on asyncio, so thousands of concurrent requests cost little, and
answers each item deterministically (`expected_answer`), so a test can check that every result
is the answer to its own item.

Faults, set at start or live through `configure()` / `POST /_control`:
  latency_s        delay before every answer
  rate_per_s       provider-side limit (token bucket, one second of burst): excess gets 429
  rate_headers     with rate_per_s, every chat answer says the limit as providers do (default
                   on): x-ratelimit-{limit,remaining,reset}-requests (a Go duration) to a chat
                   request, anthropic-ratelimit-requests-* (an RFC 3339 time) to a Messages one;
                   the limit per minute, what is left in the bucket, when it is full again
  fail_rate        probability of a transient failure, drawn from fail_kinds
  fail_kinds       any of 500 502 503 408 409 425 timeout reset empty drip, or a 3xx status
  script           the next responses, in order: "ok", "429:3" (Retry-After 3), "429" (none),
                   "500", "400", "401", "timeout", "reset", "empty"
  item_faults      {substring of an item: fault}, e.g. {"PERMANENT-400": "400"}
  hang_s           how long a "timeout" fault stays silent (and a "drip" fault drips)
  drip_s           the "drip" fault: the headers, then a byte of the body every drip_s seconds
  echo_credentials error bodies quote the request's Authorization header and target (its query),
                   as careless providers do: what a leak test needs
  error_echo       a string every error body quotes (e.g. a key of some shape)
  fail_once        {substring of an item: fault}: that fault the first time only (then answered)
  hostile answers  fault kinds answered with HTTP 200 and a body that is not what was asked
                   (HOSTILE): cut at the output limit, off the schema, malformed, huge …
  batch_*          the Batch API (fake_batches.py): processing delay, time per line, expiry
  require_key      every /v1 request without `Authorization: Bearer <it>` gets 401 (a wrong key)
  models           the models it knows: GET /models lists them, a chat request for another gets 404
                   (None: any model, and /models lists fake-model)
A gate, for tests that must know what reached the provider and when: `hold()` closes it (chat
requests that arrive are recorded, then wait unanswered; `hold(let_through=n)` answers the next
n first), `release()` opens it (the waiting ones are answered), `wait_requests(n)` blocks until
n chat requests have arrived (answered or held), `wait_held(n)` until n wait at the gate, and
`held` counts those waiting now. `POST /_control {"gate": "hold"|"release", "let_through": n}`
does the same from another process.
Anthropic's `POST /v1/messages` is served by the same code: a request is read as the chat request
it stands for (`as_chat_request`), so every fault, the gate and the records apply, and answered
in the Messages shape (content blocks, stop_reason, usage with cache reads and writes; a --schema
request's tool called; errors as {"type": "error", "error": {...}}, 529 overloaded included). Its
prompt cache is Anthropic's: a prefix up to a `cache_control` breakpoint of at least
`prompt_cache_min_tokens` is written on first sight and read after. `x-api-key` is the key there.
Message Batches (`/v1/messages/batches`: create with the requests inline, get, list, cancel,
results) are the same batches underneath (fake_batches.py), answered in Anthropic's shapes.
Every chat request is recorded (`requests`): wall time, item digest, status; every line a batch
processes is recorded apart (`batches.lines`), so a test tells batch work from live calls.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import random
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .fake_batches import Endless, FakeBatches, Redirect

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


def _blocks(content: Any) -> list[dict[str, Any]]:
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
    system = "".join(str(b.get("text", "")) for b in _blocks(req.get("system")))
    chat["messages"] = [{"role": "system", "content": system}] if system else []
    for m in req.get("messages") or []:
        if isinstance(m, dict):
            text = "".join(str(b.get("text", "")) for b in _blocks(m.get("content")))
            chat["messages"].append({"role": m.get("role"), "content": text})
    tools = [t for t in req.get("tools") or [] if isinstance(t, dict)]
    if tools:
        chat["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": tools[0].get("name"), "schema": tools[0].get("input_schema")},
        }
    return chat


@dataclass
class RequestRecord:
    at: float  # wall clock when the request arrived
    item: str  # digest of the item text
    status: int  # what was answered (0 for reset / hang)
    fault: str | None = None
    #: The request body's fields but model and messages (temperature, max_tokens, -o options)
    options: dict[str, Any] = field(default_factory=dict)
    system: str = ""  # the system messages' text
    protocol: str = "openai"  # or "anthropic": the Messages API was asked
    #: The request body as it arrived, in its own protocol
    body: dict[str, Any] = field(default_factory=dict)
    #: What the answer bills (its usage as sent: input with the cache's reads and writes, and
    #: output), answer kept by the client or not; 0 for an answer without usage
    billed_in: int = 0
    billed_out: int = 0


@dataclass
class FakeConfig:
    latency_s: float = 0.0
    rate_per_s: float | None = None
    rate_headers: bool = True
    fail_rate: float = 0.0
    fail_kinds: list[str] = field(default_factory=lambda: ["500"])
    script: list[str] = field(default_factory=list)
    item_faults: dict[str, str] = field(default_factory=dict)
    hang_s: float = 30.0
    drip_s: float = 0.1  # the "drip" fault: a byte of the answer every drip_s seconds
    echo_credentials: bool = False
    error_echo: str = ""
    seed: int = 1234
    usage: dict[str, Any] | None = None  # reported instead of the computed usage (a bad provider)
    #: Prefix caching as OpenAI does it: a request whose text before the item (system and user,
    #: about len // 4 tokens) is at least this long and was seen before reports it as cached
    #: input, in whole 128-token blocks (usage.prompt_tokens_details.cached_tokens)
    prompt_cache_min_tokens: int = 1024
    fail_once: dict[str, str] = field(default_factory=dict)
    batch_delay_s: float = 0.0  # before a batch starts processing (validating)
    batch_line_s: float = 0.0  # processing time per line
    batch_expire_after: int | None = (
        None  # lines after which a batch expires (the rest: batch_expired)
    )
    batch_hold: bool = (
        False  # batches stay in_progress without processing (until released or cancelled)
    )
    batch_upload_delay_s: float = (
        0.0  # an upload is stored, then answered this late (a kill mid-upload)
    )
    batch_create_delay_s: float = (
        0.0  # a batch is created, then answered this late (a kill before it is recorded)
    )
    #: An honest provider's worst case: the n-th answer bills output_tokens[n] tokens (the last
    #: repeats), never more than the request's max_tokens; None: a quarter of its characters
    output_tokens: list[int] | None = None
    #: Input billed as the UTF-8 bytes of every message's text, the most an honest tokenizer
    #: counts; False: a quarter of the user text's characters
    input_as_bytes: bool = False
    require_key: str | None = None  # the only API key accepted (else 401)
    models: list[str] | None = None  # the models known (else 404 for a chat request); None: any


class FakeProvider:
    """Run with start() (a background thread) or serve_forever(); base_url ends in /v1."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, **config: Any) -> None:
        self.host, self.port = host, port
        self.config = FakeConfig(**config)
        self.requests: list[RequestRecord] = []
        self._rng = random.Random(self.config.seed)
        self._lock = threading.Lock()
        self._prefixes: set[str] = set()  # prompt prefixes seen (prompt_cache_min_tokens)
        self._tokens = 0.0
        self._tokens_at = time.monotonic()
        self.in_flight = 0  # chat requests being answered now
        self.max_in_flight = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._open: dict[asyncio.StreamWriter, asyncio.Task] = {}  # connections to drop on stop()
        self._stopping = False
        self._ready = threading.Event()
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

    # Gate ----------------------------------------------------------------------------------
    def hold(self, let_through: int = 0) -> None:
        """Close the gate: chat requests from now on are recorded, then wait until release();
        the first `let_through` of them are answered as if it were open."""
        with self._lock:
            self._let_through = let_through
        self._set_gate(False)

    def release(self) -> None:
        """Open the gate: the requests waiting at it are answered, and so are the next ones."""
        self._set_gate(True)

    def _set_gate(self, is_open: bool) -> None:
        if self._loop is None:
            self._hold_at_start = not is_open
            return
        done = threading.Event()

        def flip() -> None:
            assert self._gate_open is not None
            self._gate_open.set() if is_open else self._gate_open.clear()
            done.set()

        self._loop.call_soon_threadsafe(flip)
        if not done.wait(10):
            raise RuntimeError("the fake provider's loop did not answer")

    def _passes_closed_gate(self) -> bool:
        with self._lock:
            if self._let_through <= 0:
                return False
            self._let_through -= 1
            return True

    def wait_requests(self, n: int, timeout: float = 60.0) -> list[RequestRecord]:
        """Block until at least n chat requests have arrived (answered or held); their records."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: len(self.requests) >= n, timeout):
                raise AssertionError(
                    f"{len(self.requests)} requests reached the fake provider in {timeout}s, "
                    f"not {n}"
                )
            return list(self.requests)

    def wait_held(self, n: int, timeout: float = 60.0) -> None:
        """Block until n chat requests wait at the closed gate."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: self.held >= n, timeout):
                raise AssertionError(
                    f"{self.held} requests wait at the fake provider's gate after {timeout}s, "
                    f"not {n}"
                )

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

    # Decisions -----------------------------------------------------------------------------
    def _decide(
        self, item: str, records: list[RequestRecord] | None = None, req: dict | None = None
    ) -> tuple[str, RequestRecord]:
        """The fault (or "ok") for this request, and its record (in records: requests by default),
        under the lock."""
        cfg = self.config
        with self._lock:
            fault = "ok"
            for marker, kind in cfg.item_faults.items():
                if marker in item:
                    fault = kind
            for marker in [m for m in cfg.fail_once if m in item]:
                fault = cfg.fail_once.pop(marker)
            if fault == "ok" and cfg.script:
                fault = cfg.script.pop(0)
            if fault == "ok" and cfg.rate_per_s:
                now = time.monotonic()
                self._tokens = min(
                    cfg.rate_per_s, self._tokens + (now - self._tokens_at) * cfg.rate_per_s
                )
                self._tokens_at = now
                if self._tokens >= 1.0:
                    self._tokens -= 1.0
                else:
                    wait_ms = int((1.0 - self._tokens) / cfg.rate_per_s * 1000) + 1
                    fault = f"429:ms={wait_ms}"
            if fault == "ok" and cfg.fail_rate and self._rng.random() < cfg.fail_rate:
                fault = self._rng.choice(cfg.fail_kinds)
            req = req or {}
            record = RequestRecord(
                at=time.time(),
                item=digest(item),
                status=0,
                fault=None if fault == "ok" else fault,
                options={k: v for k, v in req.items() if k not in ("model", "messages")},
                system="\n".join(
                    _content_text(m.get("content"))
                    for m in req.get("messages") or []
                    if isinstance(m, dict) and m.get("role") == "system"
                ),
            )
            (self.requests if records is None else records).append(record)
            self._arrived.notify_all()
            return fault, record

    # HTTP ----------------------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._stopping:  # accepted in the same turn as stop(): nothing to answer
            writer.transport.abort()
            return
        self._open[writer] = asyncio.current_task()
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {
                    k.strip().lower(): v.strip()
                    for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)
                }
                body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
                keep_going = await self._route(method, path, body, writer, headers)
                if not keep_going or headers.get("connection", "").lower() == "close":
                    break
        except (
            asyncio.IncompleteReadError,
            ConnectionError,
            asyncio.LimitOverrunError,
            ValueError,
        ):
            pass
        except asyncio.CancelledError:
            pass  # stop() cancels open connections; a cancelled handler would be logged as an error
        finally:
            self._open.pop(writer, None)
            if not writer.is_closing():
                writer.close()

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

    def _refused(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict] | None:
        """(401, body) for a wrong key (require_key), (404, body) for an unknown model (models)."""
        if not path.startswith("/v1"):
            return None
        key = self.config.require_key
        given = headers.get("x-api-key")  # Anthropic's header, on every path of its API
        if key is not None and headers.get("authorization", "") != f"Bearer {key}" and given != key:
            with self._lock:
                self.requests.append(
                    RequestRecord(at=time.time(), item="", status=401, fault="401")
                )
                self._arrived.notify_all()
            return 401, {
                "error": {
                    "message": "Incorrect API key provided: sk-LEAKED-1234",
                    "code": "invalid_api_key",
                }
            }
        if self.config.models is not None and path.endswith(("/chat/completions", "/messages")):
            try:
                model = json.loads(body or b"{}").get("model")
            except (ValueError, AttributeError):
                model = None
            if model not in self.config.models:
                with self._lock:
                    self.requests.append(
                        RequestRecord(at=time.time(), item="", status=404, fault="404")
                    )
                    self._arrived.notify_all()
                return 404, {
                    "error": {
                        "message": f"The model {model} does not exist (key sk-LEAKED-1234)",
                        "code": "model_not_found",
                    }
                }
        return None

    def _echo(self, target: str, headers: dict[str, str]) -> str:
        """What error bodies quote besides the usual text (echo_credentials, error_echo)."""
        parts = (
            [f"request {target} with Authorization: {headers.get('authorization', '')}"]
            if self.config.echo_credentials
            else []
        )
        return "".join(f"; {part}" for part in [*parts, self.config.error_echo] if part)

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
            _content_text(m.get("content")) for m in messages if m.get("role") == "user"
        )
        item = item_text(prompt)
        fault, record = self._decide(item, req=req)
        record.body = req if messages_req is None else messages_req
        if messages_req is not None:
            record.protocol = "anthropic"
        assert self._gate_open is not None
        if not self._gate_open.is_set() and not self._passes_closed_gate():
            with self._lock:
                self.held += 1
                self._arrived.notify_all()
            try:
                await self._gate_open.wait()
            finally:
                with self._lock:
                    self.held -= 1
        if self.config.latency_s:
            await asyncio.sleep(self.config.latency_s)
        if fault == "reset":
            _reset(writer)
            return False
        if fault == "timeout":
            await asyncio.sleep(self.config.hang_s)
            _reset(writer)
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
        answer, usage, base = self.answer_parts(req, item, prompt, fault)
        limits = self.limit_headers(anthropic=messages_req is not None)
        if messages_req is not None:
            message = self._message_body(messages_req, answer, usage, fault)
            _bill(record, message)
            if messages_req.get("stream"):  # Hermes' Anthropic client streams
                return await self._stream_message(writer, message)
            return self._send(writer, 200, message, limits)
        if req.get("stream"):
            _bill(record, {"usage": usage})
            return await self._stream(writer, base, answer, usage)
        body = hostile_body(
            fault,
            req,
            {
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
            },
        )
        if isinstance(body, bytes):
            return self._send_bytes(
                writer, 200, body, "text/html" if fault == "html" else "application/json"
            )
        _bill(record, body)
        return self._send(writer, 200, body, limits)

    def limit_headers(self, *, anthropic: bool) -> list[tuple[str, str]]:
        """The bucket as the provider's headers say it (rate_headers), or none."""
        cfg = self.config
        if not (cfg.rate_per_s and cfg.rate_headers):
            return []
        with self._lock:
            elapsed = time.monotonic() - self._tokens_at
            left = min(cfg.rate_per_s, self._tokens + elapsed * cfg.rate_per_s)
        full_in_s = (cfg.rate_per_s - left) / cfg.rate_per_s
        limit, remaining = str(round(cfg.rate_per_s * 60)), str(int(left))
        if anthropic:
            at = time.time() + full_in_s
            reset = (
                time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1000):03d}Z"
            )
            prefix = "anthropic-ratelimit-requests-"
            return [
                (prefix + "limit", limit),
                (prefix + "remaining", remaining),
                (prefix + "reset", reset),
            ]
        return [
            ("x-ratelimit-limit-requests", limit),
            ("x-ratelimit-remaining-requests", remaining),
            ("x-ratelimit-reset-requests", f"{round(full_in_s * 1000)}ms"),
        ]

    def _send_429(
        self, writer: asyncio.StreamWriter, fault: str, echo: str, *, anthropic: bool
    ) -> bool:
        """A 429 in the protocol asked, with the wait the fault names (429:<s>, 429:ms=<ms>)."""
        headers = []
        if fault.startswith("429:ms="):
            ms = int(fault.split("=", 1)[1])
            headers = [
                ("retry-after-ms", str(ms)),
                ("Retry-After", str(max(1, -(-ms // 1000)))),
            ]
        elif ":" in fault:
            headers = [("Retry-After", fault.split(":", 1)[1])]
        headers += self.limit_headers(anthropic=anthropic)
        if anthropic:
            return self._send(writer, 429, anthropic_error(429, f"Rate limited{echo}"), headers)
        return self._send(
            writer,
            429,
            {
                "error": {
                    "message": f"Rate limit reached for fake-model (secret sk-LEAKED-1234){echo}",
                    "type": "rate_limit_exceeded",
                }
            },
            headers,
        )

    @staticmethod
    def item_of(req: dict[str, Any]) -> str:
        """The item a chat-completions request body asks about."""
        messages = req.get("messages") or []
        return item_text(
            "\n".join(_content_text(m.get("content")) for m in messages if m.get("role") == "user")
        )

    def line_answer(
        self, req: dict[str, Any], records: list[RequestRecord]
    ) -> tuple[int, dict[str, Any]]:
        """A batch line's response, (status code, body), with the faults a live call would get;
        0 for a line that failed without a response (a timeout or reset live)."""
        messages = req.get("messages") or []
        prompt = "\n".join(
            _content_text(m.get("content")) for m in messages if m.get("role") == "user"
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
        body = hostile_body(
            fault,
            req,
            {
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
            },
        )
        if isinstance(body, bytes):
            return 200, body.decode("utf-8", "replace")[:1000]
        _bill(record, body)
        return 200, body

    #: The shapes fake_batches answers Message Batches in (it cannot import this module back).
    as_chat_request = staticmethod(as_chat_request)
    anthropic_error = staticmethod(anthropic_error)

    def message_line_answer(
        self, params: dict[str, Any], records: list[RequestRecord]
    ) -> tuple[int, dict[str, Any]]:
        """A Message Batches request's result, (status code, message or error object), with the
        faults a live call would get; 0 for a request that failed without an answer."""
        req = as_chat_request(params)
        messages = req.get("messages") or []
        prompt = "\n".join(
            _content_text(m.get("content")) for m in messages if m.get("role") == "user"
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
        _bill(record, message)
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
        blocks = _blocks(req.get("system")) + [
            b
            for m in req.get("messages") or []
            if isinstance(m, dict)
            for b in _blocks(m.get("content"))
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

    def _cached_tokens(self, req: dict[str, Any], prompt: str) -> int:
        """The prefix of this request served from the cache: the system text and the user text
        before the item (its "Item <name>" line), once an earlier request sent the same (counted
        as prompt_tokens is). A provider caches the longest prefix it saw; ours ends there."""
        system = "\n".join(
            _content_text(m.get("content"))
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
                len(_content_text(m.get("content")).encode("utf-8"))
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
            answer = json.dumps(_schema_answer(schema, item, off=fault == "off_schema"))
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

    @staticmethod
    def _send(writer: asyncio.StreamWriter, status: int, obj: Any, headers=()) -> bool:
        body = json.dumps(obj).encode()
        lines = [
            f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            *(f"{k}: {v}" for k, v in headers),
        ]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        return True

    @staticmethod
    def _send_bytes(
        writer: asyncio.StreamWriter,
        status: int,
        body: bytes,
        content_type: str = "application/jsonl",
    ) -> bool:
        head = (
            f"HTTP/1.1 {status} OK\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        writer.write(head + body)
        return True

    @staticmethod
    async def _send_file(writer: asyncio.StreamWriter, status: int, path: Path) -> bool:
        """A file's content, streamed from disk a MiB at a time."""
        writer.write(
            (
                f"HTTP/1.1 {status} OK\r\nContent-Type: application/jsonl\r\n"
                f"Content-Length: {path.stat().st_size}\r\n\r\n"
            ).encode()
        )
        with path.open("rb") as handle:
            while chunk := handle.read(1024 * 1024):
                writer.write(chunk)
                await writer.drain()
        return True

    async def _drip(self, writer: asyncio.StreamWriter) -> bool:
        """An answer that never ends: its headers, then a byte of its body every drip_s seconds
        for as long as the client reads (or hang_s passes)."""
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
        writer.write(b"Content-Length: 1000000\r\n\r\n{")
        ends = time.monotonic() + self.config.hang_s
        while not self._stopping and time.monotonic() < ends:
            await asyncio.sleep(self.config.drip_s)
            writer.write(b" ")
            await writer.drain()
        return False

    async def _send_batch_answer(self, writer: asyncio.StreamWriter, status: int, obj: Any) -> bool:
        if isinstance(obj, Redirect):
            return self._send(writer, status, {}, [("Location", obj.location)])
        if isinstance(obj, Endless):
            return await self._send_endless(writer, obj)
        if isinstance(obj, bytes):
            return self._send_bytes(writer, status, obj)
        if isinstance(obj, Path):
            return await self._send_file(writer, status, obj)
        return self._send(writer, status, obj)

    async def _send_endless(self, writer: asyncio.StreamWriter, endless: Endless) -> bool:
        """A file's content, then its fill for as long as the client reads (64 KiB every 5 ms:
        what a loopback client reads past any bound in moments, on a machine others share)."""
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/jsonl\r\nConnection: close\r\n\r\n"
        )
        writer.write(endless.path.read_bytes())
        fill = Endless.FILL[endless.kind]
        while not self._stopping:
            writer.write(fill)
            await writer.drain()
            await asyncio.sleep(0.005)
        return False

    # Running -------------------------------------------------------------------------------
    async def _serve(self) -> None:
        self._gate_open = asyncio.Event()
        if not self._hold_at_start:
            self._gate_open.set()
        self._loop = asyncio.get_running_loop()
        self._loop.set_exception_handler(_quiet_about_cancelled)
        self._server = await asyncio.start_server(
            self._handle, self.host, self.port, backlog=2048, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        async with self._server:
            await self._server.serve_forever()

    def start(self) -> FakeProvider:
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._serve_quietly()), daemon=True, name="fake-provider"
        )
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake provider did not start")
        return self

    async def _serve_quietly(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self._serve()
        # Wind down every connection before asyncio.run() closes the loop, so no socket outlives it:
        # handlers still answering are cancelled (they close their own socket), handlers accepted in
        # the turn of stop() start, see _stopping and drop theirs.
        me = asyncio.current_task()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            for task in self._open.values():
                task.cancel()
            if not [t for t in asyncio.all_tasks() if t is not me]:
                break
            await asyncio.sleep(0.01)
        for _ in range(3):  # a closed transport lets go of its socket a turn later
            await asyncio.sleep(0)

    def stop(self) -> None:
        loop, server = self._loop, self._server
        if loop and server:

            def shut_down() -> None:  # runs on the server's own loop, so the sets are its own
                self._stopping = True
                server.close()
                for writer in list(self._open):
                    # a handler still waiting is cancelled as the loop ends
                    writer.transport.abort()

            # Closing the server can end asyncio.run() (and close the loop) before this call:
            # then there is nothing left to stop.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(shut_down)
        if self._thread:
            self._thread.join(5)
        self.batches.close()

    def serve_forever(self) -> None:
        asyncio.run(self._serve())


def _bill(record: RequestRecord, body: dict[str, Any]) -> None:
    """Record what an answer body bills: its usage's counts (chat completions' prompt and
    completion tokens; Messages' input, cache reads and writes, and output)."""
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return

    def count(*names: str) -> int:
        found = [usage.get(n) for n in names]
        return sum(v for v in found if isinstance(v, int) and not isinstance(v, bool))

    record.billed_in = count(
        "prompt_tokens", "input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"
    )
    record.billed_out = count("completion_tokens", "output_tokens")


def _quiet_about_cancelled(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    # Python 3.11's stream protocol asks a connection task cancelled before its first step for its
    # exception, which raises CancelledError into the loop's handler: that is a stop, not a fault.
    if not isinstance(context.get("exception"), asyncio.CancelledError):
        loop.default_exception_handler(context)


def _content_text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return str(content or "")


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a dropped connection looks to the client."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _schema_answer(schema: dict[str, Any], item: str, *, off: bool = False) -> dict[str, Any]:
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
