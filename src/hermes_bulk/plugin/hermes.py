"""Bulk's door to Hermes: ctx.llm as a ModelClient, posting into a session, and (read in
hermes_config.py, exposed here too) the profile's homes, settings and configured model.

Each Hermes API Bulk relies on sits behind one function here or in hermes_config.py, and
tests/plugin/test_hermes_api.py pins its behaviour against hermes-agent 0.19.0, so a Hermes
upgrade that changes one shows up as one failing test. Hermes is imported inside functions only:
importing this module (or the plugin) needs nothing but hermes-bulk itself.

Errors from ctx.llm reach us after Hermes' own retries and fallbacks, as the provider SDK's
exceptions (openai's for every OpenAI-compatible provider, httpx's for Gemini's native API). They
are told apart by status_code and by class, never by name: `classify_error` maps them onto the
same classes, and so the same policies, as the HTTP client: RateLimited (with Retry-After),
TransientModelError, PermanentModelError. Their text goes to the Hermes log only.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ..config.settings import Settings
from ..errors import (
    ClientUnavailable,
    InvalidAnswer,
    ModelError,
    PermanentModelError,
    TransientModelError,
    not_sent,
    with_usage,
)
from ..providers.client import Completion, classify_status, token_count, truncated
from ..store.protocol import JobRecord, Usage
from .hermes_config import (
    CLIENT,
    PLUGIN_ID,
    HermesModel,
    api_mode,
    configured_model,
    data_dir,
    in_profile,
    plugin_settings,
    profile_home,
    profile_name,
    profile_of,
    provider_of,
    register_model_secrets,
    request_route,
    working_directory,
)

__all__ = [
    "CLIENT",
    "PLUGIN_ID",
    "PURPOSE",
    "SETUP_FIX",
    "ClientFactory",
    "HermesLlmClient",
    "HermesModel",
    "api_mode",
    "can_post_to_session",
    "classify_error",
    "client_factory",
    "configured_model",
    "data_dir",
    "in_profile",
    "never_sent",
    "one_attempt",
    "plugin_settings",
    "post_to_session",
    "profile_home",
    "profile_name",
    "profile_of",
    "provider_of",
    "register_model_secrets",
    "request_route",
    "session_key",
    "standalone_llm",
    "worker_clients",
    "working_directory",
]

log = logging.getLogger("hermes_bulk.plugin")

PURPOSE = "bulk item"  #: what Hermes' log records as the purpose of each call
SETUP_FIX = "check the model setup in Hermes (hermes model)"


def classify_error(exc: BaseException) -> ModelError:
    """An exception from ctx.llm as Bulk's error class; its text goes to the log, never further.

    ctx.llm calls providers through openai's SDK (every OpenAI-compatible provider, Codex) or
    httpx (Gemini's native API, whose GeminiAPIError carries status_code); Hermes re-raises what
    they raise. An HTTP answer is told by its status_code, a transport failure by its class.
    """
    log.warning("Hermes' model call failed: %s: %s", type(exc).__name__, exc)
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and 400 <= status <= 599:
        return classify_status(status, _headers(exc), setup_fix=SETUP_FIX)
    timeouts, connection_errors = _transport_errors()
    if isinstance(exc, timeouts):  # before connection errors: openai's timeout is one of them
        error = TransientModelError("the request timed out")
        return not_sent(error) if never_sent(exc) else error
    if isinstance(exc, connection_errors):
        # no connection made: a provider received nothing to bill or to count
        error = TransientModelError(f"connection error ({type(exc).__name__})")
        return not_sent(error) if never_sent(exc) else error
    if isinstance(exc, PermissionError):  # agent.plugin_llm.PluginLlmTrustError, before sending
        return not_sent(
            PermanentModelError(
                "Hermes refused the call (plugins.entries.bulk.llm); the details are in the "
                "Hermes log"
            )
        )
    # call_llm raises a plain RuntimeError when no provider is configured or it has no key
    # (before anything is sent). A library's subclass of it is no such verdict: pydantic's
    # PydanticUserError, which threads making their first calls at once inside Hermes can raise,
    # is retried like any other.
    if type(exc) is RuntimeError:
        return not_sent(
            PermanentModelError(
                f"Hermes could not call a model: {SETUP_FIX}; the details are in the Hermes log"
            )
        )
    if isinstance(exc, ValueError):  # complete_structured: the answer does not match --schema
        return InvalidAnswer("the answer does not match --schema", http_status=200)
    return TransientModelError(
        f"Hermes' model call failed ({type(exc).__name__}); the details are in the Hermes log"
    )


def never_sent(exc: BaseException) -> bool:
    """Whether a provider SDK's exception says no connection was made (refused, no route, DNS, a
    connect timeout, a TLS handshake refused): httpx's ConnectError or ConnectTimeout is its
    cause, as openai's and anthropic's APIConnectionError carry it. A connection lost after the
    request went out (a read error, a read timeout) may have reached the provider: not this."""
    try:
        import httpx
    except ImportError:
        return False
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        if isinstance(link, httpx.ConnectError | httpx.ConnectTimeout):
            return True
        seen.add(id(link))
        link = link.__cause__ or link.__context__
    return False


@functools.cache
def _transport_errors() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """(timeout classes, connection-failure classes) of the clients Hermes calls providers with.

    Imported here, on the first failure, so importing this module needs neither package.
    """
    timeouts: list[type[BaseException]] = [TimeoutError]
    connection_errors: list[type[BaseException]] = [ConnectionError]
    with contextlib.suppress(ImportError):
        import openai

        timeouts.append(openai.APITimeoutError)
        connection_errors.append(openai.APIConnectionError)
    with contextlib.suppress(ImportError):
        import httpx

        timeouts.append(httpx.TimeoutException)
        connection_errors.append(httpx.TransportError)
    return tuple(timeouts), tuple(connection_errors)


def _name(value: Any) -> str | None:
    """A provider or model name Hermes reports, if it can be one."""
    return value[:200] if isinstance(value, str) and value.strip() else None


def _headers(exc: BaseException) -> Mapping[str, str] | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    return headers if isinstance(headers, Mapping) else None


class HermesLlmClient:
    """model.ModelClient over ctx.llm: the user's provider, model, credentials and fallbacks.

    No API key passes through Bulk. Items with --schema go through complete_structured; the
    answer is returned as JSON text, and pipeline.structured() holds it to the job's schema.
    """

    def __init__(
        self, llm: Any, *, provider_key: str, timeout_s: float, home: Path | None = None
    ) -> None:
        self.llm, self.provider_key, self.timeout_s, self.home = llm, provider_key, timeout_s, home

    def complete(
        self,
        messages: list[dict[str, str]],
        *,
        max_tokens: int | None,
        json_schema: dict[str, Any] | None = None,
        options: dict[str, Any] | None = None,
    ) -> Completion:
        # ctx.llm passes on the temperature alone (model_options.HERMES_OPTIONS, held at create).
        temperature = (options or {}).get("temperature")
        try:
            with in_profile(self.home):
                result = self._call(messages, max_tokens, json_schema, temperature)
        except Exception as exc:
            raise classify_error(exc) from None
        return self._completion(result, max_tokens, json_schema)

    def _completion(
        self, result: Any, max_tokens: int | None, json_schema: dict[str, Any] | None
    ) -> Completion:
        """What ctx.llm returned, held to what model.parse_completion asks of an HTTP answer where
        Hermes passes the facts on: the text is a string, the counts are counts. Hermes 0.19.0
        gives no finish_reason and sends the output limit to a few providers only (Anthropic-
        compatible, NVIDIA NIM), so an answer of exactly max_tokens is taken as cut there; a
        longer one was not capped, so not cut."""
        text = getattr(result, "text", None)
        if text is not None and not isinstance(text, str):
            raise InvalidAnswer("Hermes' answer text is not a string", http_status=200)
        text = text or ""
        if json_schema is not None and isinstance(getattr(result, "parsed", None), dict):
            text = json.dumps(result.parsed, ensure_ascii=False)
        usage = getattr(result, "usage", None)
        tokens_in = token_count(getattr(usage, "input_tokens", 0))
        tokens_out = token_count(getattr(usage, "output_tokens", 0))
        if max_tokens and tokens_out == max_tokens:  # billed: the usage goes with the error
            raise with_usage(truncated(max_tokens), Usage(tokens_in, tokens_out))
        if not text.strip():
            raise TransientModelError("the provider returned an empty answer", http_status=200)
        reported = bool(
            tokens_in or tokens_out
        )  # Hermes reports 0/0 when the provider said nothing
        cached = token_count(getattr(usage, "cache_read_tokens", 0))
        if not reported or cached is None or tokens_in is None or cached > tokens_in:
            cached = None
        return Completion(
            text=text,
            usage=Usage(tokens_in if reported else None, tokens_out if reported else None, cached),
            provider=_name(getattr(result, "provider", None)),
            model=_name(getattr(result, "model", None)),
        )

    def _call(
        self,
        messages: list[dict[str, str]],
        max_tokens: int | None,
        json_schema: dict[str, Any] | None,
        temperature: float | None,
    ):
        with (
            one_attempt()
        ):  # Bulk retries (and charges) each attempt itself: Hermes must not retry unseen
            return self._call_once(messages, max_tokens, json_schema, temperature)

    def _call_once(
        self,
        messages: list[dict[str, str]],
        max_tokens: int | None,
        json_schema: dict[str, Any] | None,
        temperature: float | None,
    ):
        if json_schema is None:
            return self.llm.complete(
                messages,
                max_tokens=max_tokens,
                temperature=temperature,
                timeout=self.timeout_s,
                purpose=PURPOSE,
            )
        system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
        user = "\n\n".join(m["content"] for m in messages if m["role"] == "user")
        return self.llm.complete_structured(
            instructions=user,
            input=[{"type": "text", "text": "Answer for this item with one JSON object."}],
            json_schema=json_schema,
            system_prompt=system or None,
            max_tokens=max_tokens,
            temperature=temperature,
            timeout=self.timeout_s,
            purpose=PURPOSE,
        )

    def close(self) -> None:
        """Nothing to release: Hermes owns the connections."""


ClientFactory = Callable[[JobRecord], HermesLlmClient]


# One HTTP request per ctx.llm call -------------------------------------------------------------

_one_attempt = threading.local()
_retries_wrapped = False
_retries_lock = threading.Lock()


@contextlib.contextmanager
def one_attempt() -> Iterator[None]:
    """On this thread, Hermes makes no same-provider retries of a transient error (5xx, 408, a
    dropped connection): the budget charges each ctx.llm call once, so each must be one request.

    Private API (Hermes 0.19.0): call_llm asks agent.auxiliary_client._transient_retry_count()
    how often to retry; it is wrapped once per process to answer 0 inside this block only.
    Where it is missing (another Hermes), calls run unwrapped and Hermes' retries go
    uncounted.
    """
    _wrap_transient_retries()
    before = getattr(_one_attempt, "active", False)
    _one_attempt.active = True
    try:
        yield
    finally:
        _one_attempt.active = before


def _wrap_transient_retries() -> bool:
    global _retries_wrapped
    with _retries_lock:
        if _retries_wrapped:
            return True
        try:
            import agent.auxiliary_client as aux
        except Exception:
            return False
        original = getattr(aux, "_transient_retry_count", None)
        if not callable(original):
            log.info(
                "bulk: this Hermes has no _transient_retry_count; its own retries of ctx.llm calls "
                "are not counted by the request budget"
            )
            return False

        def transient_retry_count() -> int:
            return 0 if getattr(_one_attempt, "active", False) else original()

        aux._transient_retry_count = transient_retry_count
        _retries_wrapped = True
        return True


def client_factory(
    make_llm: Callable[[], Any], *, settings: Settings, profile: str, home: Path | None
) -> ClientFactory:
    """The model client for each job created in Hermes that this process may serve.

    A job is served only by a process running the profile it was created in: another profile
    has another model and other credentials. One client per provider key. `make_llm` gives
    ctx.llm; it is called when the first job needs it, so a fleet worker loads Hermes only then.
    """
    clients: dict[str, HermesLlmClient] = {}
    lock = threading.Lock()
    made: list[Any] = []

    def client_for(job: JobRecord) -> HermesLlmClient:
        created_in = profile_of(job.spec.provider_key)
        if created_in != profile:
            raise ClientUnavailable(
                f"it was created in Hermes profile {created_in!r} and this worker runs "
                f"profile {profile!r}; run it where HERMES_HOME is that profile"
            )
        with lock:
            client = clients.get(job.spec.provider_key)
            if client is None:
                if not made:
                    made.append(make_llm())
                    register_model_secrets()
                client = clients[job.spec.provider_key] = HermesLlmClient(
                    made[0],
                    provider_key=job.spec.provider_key,
                    timeout_s=settings.request_timeout_seconds,
                    home=home,
                )
            return client

    return client_for


# Outside Hermes: `hermes-bulk worker` serving jobs created in Hermes -----------------------------


def standalone_llm() -> Any:
    """Hermes' plugin LLM facade in a process that is not Hermes (a fleet worker).

    The same object Hermes hands the plugin as ctx.llm: the trust gate reads
    plugins.entries.bulk.llm and calls go through Hermes' call_llm, with the profile's
    provider, credentials and fallbacks. Hermes' CLI and cron load the profile's .env before
    any model call; a worker has to do the same.
    """
    from agent.plugin_llm import PluginLlm
    from hermes_cli.env_loader import load_hermes_dotenv

    load_hermes_dotenv(hermes_home=profile_home())
    return PluginLlm(plugin_id=PLUGIN_ID)


def worker_clients(settings: Settings) -> tuple[dict[str, ClientFactory], str]:
    """For `hermes-bulk worker`: {"hermes": factory} when this machine can call Hermes' model.

    That needs hermes-agent importable here and a model configured in the profile HERMES_HOME
    points at (else ~/.hermes). Nothing of Hermes' is loaded until a job created in Hermes
    arrives. The second value says which, for the worker's log.
    """
    if importlib.util.find_spec("agent") is None or importlib.util.find_spec("hermes_cli") is None:
        return (
            {},
            "does not serve jobs created in Hermes: hermes-agent is not installed in this Python",
        )
    home = profile_home()
    if not (home / "config.yaml").is_file():  # checked first: Hermes' load_config creates a home
        return {}, f"does not serve jobs created in Hermes: no Hermes configuration at {home}"
    model = configured_model()
    if not model.configured:
        return {}, (
            f"does not serve jobs created in Hermes: Hermes profile {model.profile!r} at {home} "
            "has no model configured"
        )
    factory = client_factory(standalone_llm, settings=settings, profile=model.profile, home=home)
    return {CLIENT: factory}, (
        f"serves jobs created in Hermes profile {model.profile!r} through Hermes' model "
        f"configuration ({model.provider or 'auto'} / {model.model or 'default'})"
    )


# Posting into a session ------------------------------------------------------------------------


def session_key() -> str:
    """The gateway session this turn belongs to ("" outside a gateway session)."""
    try:
        from gateway.session_context import get_session_env
    except ImportError:
        return ""
    try:
        return str(get_session_env("HERMES_SESSION_KEY", "") or "")
    except Exception:
        return ""


def can_post_to_session(ctx: Any) -> bool:
    """True where this Hermes lets a plugin post into a given session: a newer gateway's
    `ctx.inject_message(..., session_key=)`. 0.19.0's inject_message has no session_key (and
    returns False in the gateway), so there job ends wait for the next /bulk reply."""
    inject = getattr(ctx, "inject_message", None)
    if not callable(inject):
        return False
    try:
        return "session_key" in inspect.signature(inject).parameters
    except (TypeError, ValueError):
        return False


def post_to_session(ctx: Any, text: str, key: str) -> bool:
    """Posts text into the session `key`; False if Hermes refused it (the notice waits then)."""
    try:
        return bool(ctx.inject_message(text, session_key=key))
    except Exception:
        log.warning("bulk: Hermes refused a message into session %s", key, exc_info=True)
        return False
