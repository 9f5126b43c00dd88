"""Which provider a worker and `create` talk to: its protocol, endpoint and key, resolved once.

HERMES_BULK_PROVIDER names the protocol: `openai` (chat completions; any compatible server) or
`anthropic` (the Messages API). Unset, it is `anthropic` when HERMES_BULK_BASE_URL's host is
Anthropic's and `openai` otherwise. Each protocol falls back to its own ecosystem's variables
(OPENAI_BASE_URL and OPENAI_API_KEY; ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY), and
HERMES_BULK_BASE_URL / HERMES_BULK_API_KEY override both, so a shell that holds both providers'
keys sends each key only to its own provider. ANTHROPIC_BASE_URL is taken as its SDK takes it,
without `/v1` (the client adds it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

OPENAI = "openai"
ANTHROPIC = "anthropic"
PROTOCOLS = (OPENAI, ANTHROPIC)
DEFAULT_BASE_URL = {OPENAI: "https://api.openai.com/v1", ANTHROPIC: "https://api.anthropic.com/v1"}


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A provider as the settings configure it."""

    protocol: str
    base_url: str
    api_key: str | None = field(default=None, repr=False)


def check_provider(value: str) -> str:
    value = value.strip().lower()
    if value and value not in PROTOCOLS:
        raise ValueError(f"must be {' or '.join(PROTOCOLS)} (unset: inferred from the base URL)")
    return value


def infer_protocol(base_url: str) -> str:
    """`anthropic` for a URL on Anthropic's domain, else `openai` (compatible servers are many)."""
    host = (urlsplit(base_url).hostname or "").lower()
    return ANTHROPIC if host == "anthropic.com" or host.endswith(".anthropic.com") else OPENAI


def _secret(value: Any) -> str | None:
    if value is None:
        return None
    text = value.get_secret_value() if hasattr(value, "get_secret_value") else str(value)
    return text or None


def resolve(settings: Any) -> Endpoint:
    """The endpoint `settings` configure (Settings or QuickSettings)."""
    protocol = settings.provider or infer_protocol(settings.base_url or "")
    own_url = settings.anthropic_base_url if protocol == ANTHROPIC else settings.openai_base_url
    own_key = settings.anthropic_api_key if protocol == ANTHROPIC else settings.openai_api_key
    base_url = (settings.base_url or own_url or DEFAULT_BASE_URL[protocol]).rstrip("/")
    if protocol == ANTHROPIC:
        base_url = with_version(base_url)
    return Endpoint(protocol, base_url, _secret(settings.api_key) or _secret(own_key))


def with_version(base_url: str) -> str:
    """An Anthropic base URL ending in /v1, as the API's paths begin (its SDK adds the /v1 to
    ANTHROPIC_BASE_URL); a query stays a query."""
    parts = urlsplit(base_url)
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        return base_url
    return urlunsplit(parts._replace(path=path + "/v1"))
