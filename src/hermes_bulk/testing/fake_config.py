"""The loopback provider's knobs (FakeConfig) and what it records of each request (RequestRecord).

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

Every chat request is recorded (`requests`): wall time, item digest, status; every line a batch
processes is recorded apart (`batches.lines`), so a test tells batch work from live calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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


def bill(record: RequestRecord, body: dict[str, Any]) -> None:
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
