"""`hermes-bulk doctor` and the check `run` makes first: can the endpoint serve a job?

Three checks, one line each: the endpoint answers, the key is accepted, the model is known.
One request when it can: GET /models answers the first two, and the third when the model is
listed there (OpenAI lists every model a key may use; it costs nothing). Only when /models does
not confirm the model (not listed, or no such path: some compatible servers have none) is a
chat completion of one output token sent, which a provider bills as one tiny request.

What is printed is our own words: the endpoint's public URL (no credentials), HTTP statuses,
the model name. The provider's text goes to the log (masked), never to the screen; the key is
sent as the requests send it and never printed or stored.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..redact import public_url
from . import anthropic, deadline
from .client import endpoint_url

OPENAI, ANTHROPIC = "openai", anthropic.PROTOCOL

log = logging.getLogger("hermes_bulk.providers.doctor")

#: The longest a check waits for an answer: run must stay quick when the endpoint is fine.
CHECK_TIMEOUT_S = 10.0

OK, FAIL, WARN, SKIP = "ok", "FAIL", "warn", "--"


@dataclass(frozen=True, slots=True)
class Check:
    name: str  #: endpoint, key or model
    mark: str  #: OK, FAIL, WARN (could not be confirmed; not a reason to refuse) or SKIP
    text: str

    @property
    def line(self) -> str:
        return f"{self.mark:<4} {self.name:<8} {self.text}"


@dataclass
class Report:
    endpoint: str
    checks: list[Check] = field(default_factory=list)
    seconds: float = 0.0
    #: When the request budget held the check (nothing was sent): the time it reopens, shown
    #: with its zone (budget.windows.ZonedInstant); None when the checks ran.
    held_until: Any = None

    @property
    def usable(self) -> bool:
        return all(c.mark != FAIL for c in self.checks)

    def text(self) -> str:
        return "\n".join(c.line for c in self.checks)

    def add(self, name: str, mark: str, text: str) -> None:
        self.checks.append(Check(name, mark, text))


def check_endpoint(
    base_url: str,
    api_key: str | None,
    model: str | None,
    *,
    timeout_s: float = CHECK_TIMEOUT_S,
    transport: httpx.BaseTransport | None = None,
    protocol: str = OPENAI,
    admit: Callable[[], Any] | None = None,
) -> Report:
    """The three checks against an endpoint of `protocol` (config/provider.py); never raises for
    what it finds. Both protocols list models at GET /models in the same shape. `admit`, asked
    before the 1-token request (the one model request a check may make): None to send it, or
    why it must not go and until when (budget.gate.Hold: `why`, `until`); then nothing is
    sent."""
    shown = public_url(base_url.rstrip("/"))
    report = Report(shown)
    started = time.monotonic()
    if protocol == ANTHROPIC:
        headers = anthropic.auth_headers(api_key)
    else:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 5.0))
    client = httpx.Client(headers=headers, timeout=timeout, transport=transport)
    with client if transport is not None else deadline.bound_client(client) as http:
        _check(http, base_url, shown, api_key, model, report, protocol, admit)
    report.seconds = time.monotonic() - started
    return report


#: Where the user puts the key and the URL, by protocol (after HERMES_BULK_API_KEY/_BASE_URL).
_ENV = {
    OPENAI: ("OPENAI_API_KEY", "OPENAI_BASE_URL"),
    ANTHROPIC: ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"),
}


def _check(
    http: httpx.Client,
    base_url: str,
    shown: str,
    api_key: str | None,
    model: str | None,
    report: Report,
    protocol: str = OPENAI,
    admit: Callable[[], Any] | None = None,
) -> None:
    key_env, url_env = _ENV[protocol]
    listed = _request(http, "GET", endpoint_url(base_url, "models"), shown, report, url_env=url_env)
    if listed is None:  # the endpoint line says why; nothing else can be told
        report.add("key", SKIP, "not checked (no answer)")
        report.add("model", SKIP, "not checked (no answer)")
        return
    status, body = listed
    report.add("endpoint", OK, f"{shown} answers (GET /models: HTTP {status})")
    if status in (401, 403):
        _key_refused(report, status, api_key, key_env)
        return
    if not model:
        report.add("key", OK if status == 200 else WARN, _key_text(api_key, status, key_env))
        report.add("model", FAIL, "none configured: set HERMES_BULK_MODEL, or pass --model")
        return
    if status == 200 and model in _model_ids(body):
        report.add("key", OK, _key_text(api_key, status, key_env))
        report.add("model", OK, f"{model!r} is listed by the endpoint")
        return
    # Not confirmed by /models: ask for one output token.
    why = "not listed by GET /models" if status == 200 else f"GET /models answered HTTP {status}"
    hold = admit() if admit is not None else None
    if hold is not None:  # the request budget keeps what is left of the window for chat
        report.add("key", OK if status == 200 else WARN, _key_text(api_key, status, key_env))
        report.add("model", SKIP, f"not checked ({why}): nothing was sent; {hold.why}")
        report.held_until = hold.until
        return
    answered = _request(
        http,
        "POST",
        endpoint_url(base_url, "messages" if protocol == ANTHROPIC else "chat/completions"),
        shown,
        report,
        url_env=url_env,
        json={
            "model": model,
            "messages": [{"role": "user", "content": "Say OK."}],
            "max_tokens": 1,
        },
    )
    if answered is None:
        return
    status, _ = answered
    if status in (401, 403):
        _key_refused(report, status, api_key, key_env)
    elif status == 404:
        report.add("key", OK if api_key else WARN, _key_text(api_key, 200, key_env))
        report.add(
            "model",
            FAIL,
            f"{model!r} is unknown to the endpoint ({why}; a 1-token request answered HTTP 404): "
            "correct HERMES_BULK_MODEL (or --model), or HERMES_BULK_BASE_URL if it is the wrong "
            "endpoint (OpenAI-compatible ones usually end in /v1)",
        )
    elif status == 200:
        report.add("key", OK, _key_text(api_key, 200, key_env))
        report.add("model", OK, f"{model!r} answered a 1-token request ({why})")
    else:
        report.add(
            "key",
            WARN if status >= 500 or status == 429 else OK,
            _key_text(api_key, status, key_env),
        )
        report.add(
            "model",
            WARN,
            f"{model!r} not confirmed: a 1-token request answered HTTP {status} ({why}; "
            "the provider's text is in the log)",
        )


def _request(
    http: httpx.Client,
    method: str,
    url: str,
    shown: str,
    report: Report,
    *,
    url_env: str = "OPENAI_BASE_URL",
    **kwargs: Any,
) -> tuple[int, Any] | None:
    """(status, JSON body or None); None when no answer came (the endpoint line says why)."""
    try:
        with deadline.until(time.monotonic() + (http.timeout.read or CHECK_TIMEOUT_S)):
            response = http.request(method, url, **kwargs)  # the whole answer within the timeout
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.ProxyError) as exc:
        log.warning("doctor: cannot connect to %s: %r", shown, exc)
        report.add(
            "endpoint",
            FAIL,
            f"{shown} cannot be reached ({type(exc).__name__}): start it, or correct "
            f"HERMES_BULK_BASE_URL (or {url_env})",
        )
        return None
    except httpx.TimeoutException:
        report.add("endpoint", FAIL, f"{shown} did not answer within {http.timeout.read:g} s")
        return None
    except httpx.HTTPError as exc:
        log.warning("doctor: request to %s failed: %r", shown, exc)
        report.add(
            "endpoint",
            FAIL,
            f"{shown}: the request failed ({type(exc).__name__}); the details are in the log",
        )
        return None
    if response.status_code != 200:
        log.warning(
            "doctor: HTTP %s from %s %s: %s",
            response.status_code,
            method,
            shown,
            response.text[:2000],
        )
    try:
        body = response.json()
    except ValueError:
        body = None
    return response.status_code, body


def _model_ids(body: Any) -> set[str]:
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return set()
    return {str(m["id"]) for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)}


def _key_text(api_key: str | None, status: int, key_env: str = "OPENAI_API_KEY") -> str:
    if not api_key:
        return f"none set (HERMES_BULK_API_KEY, {key_env}); the endpoint answered without one"
    return "accepted" if status == 200 else f"not refused (HTTP {status})"


def _key_refused(
    report: Report, status: int, api_key: str | None, key_env: str = "OPENAI_API_KEY"
) -> None:
    if api_key:
        report.add(
            "key", FAIL, f"refused (HTTP {status}): correct HERMES_BULK_API_KEY (or {key_env})"
        )
    else:
        report.add(
            "key",
            FAIL,
            f"none set, and the endpoint wants one (HTTP {status}): set HERMES_BULK_API_KEY "
            f"(or {key_env})",
        )
    report.add("model", SKIP, "not checked (the key was refused)")
