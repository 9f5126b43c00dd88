"""classify_error against the exception classes ctx.llm really raises in hermes-agent 0.19.0.

Hermes calls providers through openai's SDK, or httpx for Gemini's native API (GeminiAPIError
carries the status), and re-raises what they raise. Each case is a real object of that class.
"""

from __future__ import annotations

import pytest

from hermes_bulk.errors import PermanentModelError, RateLimited, TransientModelError
from hermes_bulk.plugin import hermes

URL = "http://127.0.0.1:9/v1/chat/completions"


def _request():
    import httpx

    return httpx.Request("POST", URL)


def _response(status: int, headers: dict[str, str] | None = None):
    import httpx

    return httpx.Response(status, headers=headers or {}, request=_request())


def _openai_status(cls_name: str, status: int, headers: dict[str, str] | None = None):
    import openai

    return getattr(openai, cls_name)(
        "provider text", response=_response(status, headers), body=None
    )


def _cases():
    """(label, factory of the exception, expected class, a word of the expected message)."""
    import httpx
    import openai
    from agent.gemini_native_adapter import GeminiAPIError

    return [
        (
            "openai timeout",
            lambda: openai.APITimeoutError(request=_request()),
            TransientModelError,
            "timed out",
        ),
        (
            "openai connection",
            lambda: openai.APIConnectionError(request=_request()),
            TransientModelError,
            "connection error (APIConnectionError)",
        ),
        (
            "openai 429",
            lambda: _openai_status("RateLimitError", 429, {"retry-after": "7"}),
            RateLimited,
            None,
        ),
        (
            "openai 401",
            lambda: _openai_status("AuthenticationError", 401),
            PermanentModelError,
            "HTTP 401",
        ),
        (
            "openai 404",
            lambda: _openai_status("NotFoundError", 404),
            PermanentModelError,
            "HTTP 404",
        ),
        (
            "openai 400",
            lambda: _openai_status("BadRequestError", 400),
            PermanentModelError,
            "HTTP 400",
        ),
        (
            "openai 503",
            lambda: _openai_status("InternalServerError", 503),
            TransientModelError,
            "HTTP 503",
        ),
        (
            "openai 408",
            lambda: _openai_status("APIStatusError", 408),
            TransientModelError,
            "HTTP 408",
        ),
        (
            "httpx read timeout",
            lambda: httpx.ReadTimeout("slow", request=_request()),
            TransientModelError,
            "timed out",
        ),
        (
            "httpx connect timeout",
            lambda: httpx.ConnectTimeout("slow", request=_request()),
            TransientModelError,
            "timed out",
        ),
        (
            "httpx refused",
            lambda: httpx.ConnectError("refused", request=_request()),
            TransientModelError,
            "connection error (ConnectError)",
        ),
        (
            "httpx cut off",
            lambda: httpx.RemoteProtocolError("peer closed", request=_request()),
            TransientModelError,
            "connection error (RemoteProtocolError)",
        ),
        (
            "gemini 429",
            lambda: GeminiAPIError(
                "quota", status_code=429, response=_response(429, {"retry-after": "7"})
            ),
            RateLimited,
            None,
        ),
        (
            "gemini 403",
            lambda: GeminiAPIError("denied", status_code=403),
            PermanentModelError,
            "HTTP 403",
        ),
        (
            "gemini 500",
            lambda: GeminiAPIError("boom", status_code=500),
            TransientModelError,
            "HTTP 500",
        ),
        (
            "socket reset",
            lambda: ConnectionResetError(104, "reset"),
            TransientModelError,
            "connection error (ConnectionResetError)",
        ),
        ("socket timeout", lambda: TimeoutError("timed out"), TransientModelError, "timed out"),
    ]


def _from(cause: BaseException, make):
    """make(), raised from cause, as the SDKs raise their connection errors."""
    try:
        try:
            raise cause
        except BaseException as inner:
            raise make() from inner
    except BaseException as outer:
        return outer


def test_only_a_connection_never_made_or_a_call_refused_before_sending_went_unsent():
    """Issue 46, 14: the budget takes back what never reached a provider, and nothing else."""
    import httpx
    import openai
    from agent.plugin_llm import PluginLlmTrustError

    never = {
        "openai, connection refused": _from(
            httpx.ConnectError("refused", request=_request()),
            lambda: openai.APIConnectionError(request=_request()),
        ),
        "openai, connect timeout": _from(
            httpx.ConnectTimeout("slow", request=_request()),
            lambda: openai.APITimeoutError(request=_request()),
        ),
        "httpx refused": httpx.ConnectError("refused", request=_request()),
        "httpx connect timeout": httpx.ConnectTimeout("slow", request=_request()),
        "trust refused": PluginLlmTrustError("not allowed"),
        "no provider": RuntimeError("no provider"),
    }
    sent = {
        "openai, cut off": _from(
            httpx.RemoteProtocolError("peer closed", request=_request()),
            lambda: openai.APIConnectionError(request=_request()),
        ),
        "openai, read timeout": _from(
            httpx.ReadTimeout("slow", request=_request()),
            lambda: openai.APITimeoutError(request=_request()),
        ),
        "openai, no cause": openai.APIConnectionError(request=_request()),
        "httpx read timeout": httpx.ReadTimeout("slow", request=_request()),
        "openai 503": _openai_status("InternalServerError", 503),
        "openai 429": _openai_status("RateLimitError", 429),
        "socket reset": ConnectionResetError(104, "reset"),
    }
    assert {
        k: hermes.classify_error(e).reached_provider for k, e in never.items()
    } == dict.fromkeys(never, False)
    assert {k: hermes.classify_error(e).reached_provider for k, e in sent.items()} == dict.fromkeys(
        sent, True
    )


def test_each_provider_error_class_maps_to_its_bulk_error():
    for label, make, expected, words in _cases():
        error = hermes.classify_error(make())
        assert type(error) is expected, label
        if words:
            assert words in str(error), (label, str(error))
        if expected is RateLimited:
            assert error.retry_after_s == 7.0, label
        assert "provider text" not in str(error), label


@pytest.mark.parametrize("name", ["ReadTimeoutish", "ConnectionPool"])
def test_a_class_name_alone_does_not_make_a_transport_error(name):
    """A Hermes or SDK error whose name merely contains Timeout or Connection, with no status and
    not of a transport class, is an unknown failure: retried, and said to be unknown."""
    odd = type(name, (Exception,), {})("something else")
    error = hermes.classify_error(odd)
    assert type(error) is TransientModelError
    assert str(error).startswith(f"Hermes' model call failed ({name})")


def test_hermes_own_refusals_stay_permanent():
    from agent.plugin_llm import PluginLlmTrustError

    assert type(hermes.classify_error(PluginLlmTrustError("not allowed"))) is PermanentModelError
    assert type(hermes.classify_error(RuntimeError("no provider"))) is PermanentModelError


def test_a_library_error_that_subclasses_runtime_error_is_retried_not_taken_for_a_setup_error():
    """pydantic 2.13's PydanticUserError is a RuntimeError: Hermes raised one from the first
    concurrent calls of a job (CI, 2026-12-03), and the item failed as "check the model setup"."""
    from pydantic.errors import PydanticUserError

    odd = PydanticUserError(
        "BaseModel cannot be instantiated directly", code="base-model-instantiated"
    )
    assert isinstance(odd, RuntimeError)
    error = hermes.classify_error(odd)
    assert type(error) is TransientModelError
    assert str(error).startswith("Hermes' model call failed (PydanticUserError)")
