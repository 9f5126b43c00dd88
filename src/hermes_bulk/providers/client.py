"""Model clients: one small protocol, and errors classified once at its boundary.

`HttpModelClient` speaks the OpenAI chat-completions protocol to any compatible endpoint (the
CLI and the fleet); the Hermes plugin provides a second client backed by `ctx.llm`. Both raise
only the classes in `errors.py`: RateLimited (with Retry-After), TransientModelError,
PermanentModelError. Provider error text goes to the log, never into a job record.
"""

from __future__ import annotations

import datetime
import email.utils
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from ..errors import (
    EndpointRedirects,
    InvalidAnswer,
    ModelError,
    PermanentModelError,
    RateLimited,
    TransientModelError,
    TruncatedAnswer,
    with_usage,
)
from ..redact import public_url
from ..store.protocol import MAX_USAGE_TOKENS, Usage
from . import answers, pacing, rate_headers
from .bodies import chat_body
from .rate_headers import RateHeaders
from .transport import JsonPoster

log = logging.getLogger("hermes_bulk.providers.client")

TRANSIENT_STATUS = frozenset({408, 409, 425})  # plus every 5xx
#: The largest answer body read (decoded): 128k output tokens are well under 2 MiB of text, so
#: more is a broken or hostile server, and memory stays bounded per request.
MAX_ANSWER_BYTES = 16 * 1024 * 1024
#: How much of an error body is read, for the log.
MAX_ERROR_BYTES = 64 * 1024
#: finish_reason values that mean the answer stopped at the output limit (Anthropic-style
#: gateways pass "max_tokens" through).
TRUNCATED = frozenset({"length", "max_tokens"})


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    usage: Usage
    provider: str | None = None
    model: str | None = None


class ModelClient(Protocol):
    """Sends one request for one item."""

    #: Identifies the provider quota this client draws on (a hash; never the key itself).
    provider_key: str
    #: The rate-limit headers of its latest answer (providers/rate_headers.py), None until one
    #: came or when the provider sends none; a client that reads no headers need not have it,
    #: nor `announced()`, which returns it before each request's turn.
    rate: RateHeaders | None

    def complete(
        self,
        messages: list[dict[str, str]],
        *,
        max_tokens: int | None,
        json_schema: dict[str, Any] | None = None,
        options: dict[str, Any] | None = None,
    ) -> Completion:
        """One model call; raises RateLimited, TransientModelError or PermanentModelError.
        options: the job's request fields (JobSpec.options), checked at create."""

    def close(self) -> None:
        """Release connections."""


def retry_after_seconds(
    headers: Mapping[str, str] | None, now: datetime.datetime | None = None
) -> float | None:
    """A provider's wait: `retry-after-ms`, else `Retry-After` in seconds or as an HTTP date."""
    if not headers:
        return None
    lowered = {k.lower(): v for k, v in headers.items()}
    if "retry-after-ms" in lowered:
        try:
            return max(0.0, float(lowered["retry-after-ms"]) / 1000.0)
        except ValueError:
            pass
    value = lowered.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    now = now or datetime.datetime.now(datetime.UTC)
    return max(0.0, (when - now).total_seconds())


def classify_status(
    status: int, headers: Mapping[str, str] | None, *, setup_fix: str | None = None
) -> ModelError:
    """The error class for an HTTP error status (shared by every client).

    setup_fix: where the user fixes credentials or the model name, when it is not HERMES_BULK_*
    (inside Hermes it is Hermes' own model setup).
    """
    if status == 429:
        return RateLimited(retry_after_s=retry_after_seconds(headers))
    if status in TRANSIENT_STATUS or status >= 500:
        return TransientModelError(f"the provider answered HTTP {status}", http_status=status)
    if status in (401, 403):
        return PermanentModelError(
            f"the provider refused the credentials (HTTP {status}); "
            f"{setup_fix or 'check HERMES_BULK_API_KEY or OPENAI_API_KEY'}",
            http_status=status,
        )
    if status == 404:
        return PermanentModelError(
            "the provider does not know this endpoint or model (HTTP 404); "
            f"{setup_fix or 'check HERMES_BULK_BASE_URL and HERMES_BULK_MODEL'}",
            http_status=status,
        )
    return PermanentModelError(
        f"the provider rejected the request (HTTP {status}); the details are in the log",
        http_status=status,
    )


class HttpModelClient:
    """OpenAI-compatible chat completions over HTTP, one kept-alive connection per worker thread
    (transport.JsonPoster). A subclass speaks another protocol by its PATH, request headers,
    request body and parse (anthropic.AnthropicModelClient)."""

    #: Where requests go, below base_url.
    PATH = "chat/completions"

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str | None,
        model: str,
        timeout_s: float,
        max_connections: int = 16,
        provider_key: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        #: The endpoint as logged and stored with each result: no password, no secret query values.
        self.endpoint = public_url(self.base_url)
        self._chat_url = endpoint_url(self.base_url, self.PATH)
        self.model = model
        #: Given by a worker (with its store's salt); computed with the fixed salt elsewhere.
        self.provider_key = provider_key or pacing.provider_key(self.base_url, api_key)
        self._poster = JsonPoster(
            self._chat_url,
            endpoint=self.endpoint,
            headers=self.request_headers(api_key),
            timeout_s=timeout_s,
            max_connections=max_connections,
        )
        self.rate: RateHeaders | None = None

    def request_headers(self, api_key: str | None) -> dict[str, str]:
        """What every request carries besides its JSON body: the key."""
        return {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def request_body(
        self, messages, *, max_tokens, json_schema=None, options=None
    ) -> dict[str, Any]:
        """The chat-completions request for one item (chat_body): what complete() sends, and
        what a line of a provider batch carries (batch_api)."""
        return chat_body(
            self.model, messages, max_tokens=max_tokens, json_schema=json_schema, options=options
        )

    def complete(self, messages, *, max_tokens, json_schema=None, options=None) -> Completion:
        body = self.request_body(
            messages, max_tokens=max_tokens, json_schema=json_schema, options=options
        )
        response = self._poster.post(
            body, limit=lambda status: MAX_ANSWER_BYTES if status == 200 else MAX_ERROR_BYTES
        )
        raw, whole = response.body, response.whole
        seen = rate_headers.read(response.headers)
        if seen is not None:  # the latest answer's word on the limits, for every thread
            self.rate = seen
        if 300 <= response.status < 400 or response.status < 200:
            log.warning("HTTP %s (not followed) from %s", response.status, self.endpoint)
            raise EndpointRedirects(
                f"{self.endpoint} answered with a redirect (HTTP {response.status}), which is not "
                "followed",
                http_status=response.status,
            )
        if response.status != 200:
            log.warning(
                "HTTP %s from %s: %s",
                response.status,
                self.endpoint,
                raw[:2000].decode("utf-8", "replace"),
            )
            raise classify_status(response.status, response.headers)
        if not whole:
            log.warning(
                "an answer of more than %d bytes from %s: not read", MAX_ANSWER_BYTES, self.endpoint
            )
            raise InvalidAnswer(
                f"the provider's answer is larger than {MAX_ANSWER_BYTES // 2**20} MiB",
                http_status=200,
            )
        try:  # HTML from a proxy, a cut body, nesting no answer has, a key given twice
            data = answers.loads(raw, "the provider's answer")
        except InvalidAnswer:
            log.warning(
                "unreadable answer from %s: %s",
                self.endpoint,
                raw[:2000].decode("utf-8", "replace"),
            )
            raise
        return self.parse(data, max_tokens)

    def announced(self) -> RateHeaders | None:
        """The latest answer's rate-limit headers, asked before each request's turn (pacing.
        ProviderGate). Before the first answer there are none: the process's first request to
        the key goes alone and the others wait for its answer (pacing.FIRST_ANSWERS)."""
        return self.rate

    def parse(self, data: Any, max_tokens: int | None) -> Completion:
        """The answer body as a Completion (the protocol's own reading: parse_completion)."""
        return parse_completion(
            data, endpoint=self.endpoint, model=self.model, max_tokens=max_tokens
        )

    def close(self) -> None:
        self._poster.close()


def parse_completion(
    data: Any, *, endpoint: str, model: str, max_tokens: int | None = None
) -> Completion:
    """A chat-completions answer body (a live response's, or a batch output line's) as a Completion,
    once it passes answers.CHAT_COMPLETION; raises InvalidAnswer (malformed), TruncatedAnswer,
    PermanentModelError (content filter, refusal) or TransientModelError (empty).

    max_tokens: the output limit the request carried; an answer that reports no finish_reason
    and used all of it is taken as truncated. An answer refused here carries the usage it
    reports (ModelError.usage): the provider billed it."""
    try:
        return _parse_completion(data, endpoint=endpoint, model=model, max_tokens=max_tokens)
    except ModelError as exc:
        raise with_usage(exc, chat_usage(data)) from None


def chat_usage(data: Any) -> Usage:
    """The usage a chat-completions body reports, read leniently (a count that cannot be one is
    no count); Usage() when it has none."""
    usage = data.get("usage") if isinstance(data, dict) else None
    if not isinstance(usage, dict):
        return Usage()
    tokens_in = token_count(usage.get("prompt_tokens"))
    return Usage(
        tokens_in,
        token_count(usage.get("completion_tokens")),
        cached_count(usage.get("prompt_tokens_details"), tokens_in),
    )


def _parse_completion(
    data: Any, *, endpoint: str, model: str, max_tokens: int | None
) -> Completion:
    try:
        answers.check_completion_body(data)
    except InvalidAnswer:
        log.warning("malformed answer from %s: %s", endpoint, _sample(data))
        raise
    choice = data["choices"][0]
    message, finish = choice["message"], choice.get("finish_reason")
    usage = chat_usage(data)
    tokens_out = usage.tokens_out
    if finish == "content_filter":
        raise PermanentModelError(
            "the provider's content filter withheld the answer", http_status=200
        )
    if finish in TRUNCATED or (
        finish is None and max_tokens and tokens_out is not None and tokens_out >= max_tokens
    ):
        raise truncated(max_tokens)
    text = message.get("content")
    if message.get("refusal") and not (text or "").strip():
        log.warning("the model refused an item at %s: %s", endpoint, str(message["refusal"])[:2000])
        raise PermanentModelError(
            "the model refused to answer this item (the refusal is in the log)", http_status=200
        )
    if not isinstance(text, str) or not text.strip():
        raise TransientModelError("the provider returned an empty answer", http_status=200)
    return Completion(
        text=text,
        usage=usage,
        provider=endpoint,
        model=data.get("model") or model,
    )


def truncated(max_tokens: int | None) -> TruncatedAnswer:
    """The error of an answer cut at the output limit, saying which limit to raise."""
    limit = (
        f"the output limit of {max_tokens} tokens; raise the max_output_tokens setting"
        if max_tokens
        else "the model's own output limit; ask for less per item"
    )
    return TruncatedAnswer(
        f"truncated: the answer stopped at {limit} and create the job again "
        "(a cut answer is never kept or reused)",
        http_status=200,
    )


def endpoint_url(base_url: str, path: str) -> str:
    """base_url with path appended to its path, its query kept (`…/v1?api-key=…` stays a query)."""
    parts = urlsplit(base_url)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/" + path))


def token_count(value: Any) -> int | None:
    """A reported token count, or None for anything that cannot be one (JSON true, a negative
    or absurd number: the store cannot save 10**30, and that would fail an answered item)."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_USAGE_TOKENS
    return value if ok else None


def cached_count(details: Any, tokens_in: int | None) -> int | None:
    """prompt_tokens_details.cached_tokens: the input the provider read from its prompt cache,
    or None when it is not a count within the reported input (a count beyond it would price
    more input as cached than was sent)."""
    cached = token_count(details.get("cached_tokens")) if isinstance(details, dict) else None
    return cached if cached is not None and tokens_in is not None and cached <= tokens_in else None


def _sample(data: Any) -> str:
    """The start of a body, for the log (never a record)."""
    try:
        return json.dumps(data, ensure_ascii=False)[:2000]
    except (TypeError, ValueError, RecursionError):
        return "(not printable)"
