"""Every setting hermes-bulk reads, once: its name, kind, default, bounds and environment names.

Two readers take their rules from this table: `config.Settings` (pydantic-settings: every
command, the plugin, the workers) and `quick_settings` (the environment alone, without loading
pydantic, for the read commands that must start fast). So a bound, a default or a name is
written here and nowhere else. What a value means beyond its kind is a check function below,
which Settings' validators call too.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..durations import parse_duration
from ..redact import register_secret, register_url
from .provider import Endpoint, check_provider, resolve

ENV_PREFIX = "HERMES_BULK_"
BACKEND_SCHEMES = ("sqlite", "redis", "rediss", "redis+sentinel", "rediss+sentinel")


def default_home() -> Path:
    """`$HERMES_HOME/plugin-data/bulk`, else `~/.hermes/plugin-data/bulk`: where Hermes keeps it
    too."""
    hermes_home = os.environ.get("HERMES_HOME")
    base = Path(hermes_home).expanduser() if hermes_home else Path.home() / ".hermes"
    return base / "plugin-data" / "bulk"


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


# What a value means beyond its kind: a ValueError's text is the message after the setting's name.


def check_backend(value: str) -> str:
    if value and value.split("://", 1)[0].lower() not in BACKEND_SCHEMES:
        raise ValueError("must start with sqlite://, redis://, rediss:// or redis+sentinel://")
    return value


def check_base_url(value: str) -> str:
    if value and not value.startswith(("http://", "https://")):
        raise ValueError("must be an http:// or https:// URL")
    return value.rstrip("/")


#: The completion windows a Batch API is asked for, in whole hours: OpenAI takes only 24h;
#: compatible servers offer hours to a week. The value is sent as `<hours>h` whatever its spelling.
BATCH_WINDOW_HOURS = (1, 168)


#: The highest price per million tokens HERMES_BULK_PRICE takes: above any model's, below a typo's.
MAX_PRICE_PER_MTOK = 10_000.0


def names_a_price(value: str) -> bool:
    """Whether HERMES_BULK_PRICE's value is a price (else it names a file of prices)."""
    return "," in value or value.replace(".", "", 1).isdigit()


#: A price as people write one: digits with an optional fraction. Not what float() also takes
#: (1_000, 1e3, inf, nan, +1, a thousands comma is a field separator here): no guessing.
_DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+", re.ASCII)


def parse_price(text: str) -> tuple[float, float, float, float | None]:
    """`input,output[,cached_input[,cache_write]]` USD per million tokens (cached_input defaults
    to input; cache_write, what a prompt-cache write costs, to None: the input price), or
    ValueError saying what to write."""
    parts = [part.strip() for part in text.split(",")]
    values = [float(part) for part in parts if _DECIMAL.fullmatch(part)]
    if (
        len(values) != len(parts)
        or len(values) not in (2, 3, 4)
        or not all(math.isfinite(v) and 0 <= v <= MAX_PRICE_PER_MTOK for v in values)
    ):
        raise ValueError(
            f"{text!r} is not a price; give input,output[,cached_input[,cache_write]] in USD per "
            f"million tokens, each 0 to {MAX_PRICE_PER_MTOK:,.0f}, e.g. 0.15,0.60"
        )
    cached = values[2] if len(values) >= 3 else values[0]
    return values[0], values[1], cached, values[3] if len(values) == 4 else None


def check_price_setting(value: str) -> str:
    """HERMES_BULK_PRICE: a price's syntax now; a file's models are read at create."""
    if value and names_a_price(value):
        parse_price(value)
    return value


def check_batch_window(value: str) -> str:
    seconds = parse_duration(value)
    low, high = BATCH_WINDOW_HOURS
    if seconds is None or seconds % 3600 or not low <= seconds / 3600 <= high:
        raise ValueError(f"must be whole hours from {low}h to {high}h (7d), such as 24h")
    return f"{int(seconds // 3600)}h"


@dataclass(frozen=True)
class Setting:
    """One setting. `kind` is how its text is read: int, float, bool, str, path or secret."""

    name: str
    kind: str
    default: Any = None
    description: str = ""
    optional: bool = False  #: None is a value (unset: no limit, no key)
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    aliases: tuple[
        str, ...
    ] = ()  #: environment names read instead of HERMES_BULK_<NAME>, first found wins
    default_factory: Callable[[], Any] | None = None
    check: Callable[[str], str] | None = None

    @property
    def env_names(self) -> tuple[str, ...]:
        return self.aliases or (env_name(self.name),)


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "home",
        "path",
        default_factory=default_home,
        description="Data directory (HERMES_BULK_HOME).",
    ),
    Setting(
        "backend",
        "str",
        "",
        check=check_backend,
        description=(
            "sqlite:///path, redis://…, rediss://… or redis+sentinel://…; default: SQLite in "
            "the data dir."
        ),
    ),
    Setting(
        "provider",
        "str",
        "",
        check=check_provider,
        description="openai (chat completions, any compatible server) or anthropic (Messages "
        "API); unset: anthropic for an anthropic.com base URL, else openai.",
    ),
    Setting(
        "base_url",
        "str",
        "",
        check=check_base_url,
        aliases=("HERMES_BULK_BASE_URL", "base_url"),
        description="The provider's endpoint (unset: OPENAI_BASE_URL or ANTHROPIC_BASE_URL, "
        "by provider, else the provider's own).",
    ),
    Setting(
        "api_key",
        "secret",
        optional=True,
        aliases=("HERMES_BULK_API_KEY", "api_key"),
        description="API key (unset: OPENAI_API_KEY or ANTHROPIC_API_KEY, by provider). Never "
        "stored or printed.",
    ),
    Setting(
        "openai_base_url",
        "str",
        "",
        check=check_base_url,
        aliases=("OPENAI_BASE_URL",),
        description="The openai provider's endpoint when HERMES_BULK_BASE_URL is unset.",
    ),
    Setting(
        "openai_api_key",
        "secret",
        optional=True,
        aliases=("OPENAI_API_KEY",),
        description="The openai provider's key when HERMES_BULK_API_KEY is unset.",
    ),
    Setting(
        "anthropic_base_url",
        "str",
        "",
        check=check_base_url,
        aliases=("ANTHROPIC_BASE_URL",),
        description="The anthropic provider's endpoint when HERMES_BULK_BASE_URL is unset "
        "(with or without /v1).",
    ),
    Setting(
        "anthropic_api_key",
        "secret",
        optional=True,
        aliases=("ANTHROPIC_API_KEY",),
        description="The anthropic provider's key when HERMES_BULK_API_KEY is unset.",
    ),
    Setting(
        "model",
        "str",
        optional=True,
        description="Model name sent with each request (HERMES_BULK_MODEL).",
    ),
    Setting(
        "max_retries", "int", 2, ge=0, le=20, description="Default automatic retries per item."
    ),
    Setting(
        "max_concurrency",
        "int",
        16,
        ge=1,
        le=1024,
        description="The most items one job may run at once.",
    ),
    Setting(
        "default_concurrency", "int", 4, ge=1, le=1024, description="--concurrency when not given."
    ),
    Setting(
        "rpm",
        "int",
        optional=True,
        ge=1,
        le=1_000_000,
        description="Default requests per minute for pacing (none: no pacing).",
    ),
    Setting(
        "tpm",
        "int",
        optional=True,
        ge=1,
        le=1_000_000_000,
        description="Default tokens per minute for pacing (none: no pacing).",
    ),
    Setting(
        "lease_seconds",
        "float",
        30.0,
        ge=0.5,
        le=3600,
        description="How long a claimed item stays owned without renewal.",
    ),
    Setting(
        "request_timeout_seconds",
        "float",
        120.0,
        gt=0,
        le=3600,
        description="The most one request to the provider may take, whole (connect, send, "
        "headers, body).",
    ),
    Setting(
        "output_tokens_estimate",
        "int",
        512,
        ge=0,
        le=1_000_000,
        description="Output tokens an answer is expected to have, for estimates (until a "
        "job learns its own); claims reserve max_output_tokens.",
    ),
    Setting(
        "reuse",
        "bool",
        True,
        description="Reuse answers of earlier jobs in this store (false: every create is --fresh).",
    ),
    Setting(
        "max_output_tokens",
        "int",
        4096,
        ge=1,
        le=1_000_000,
        description="max_tokens sent with each request: the most output an item may bill, "
        "which --max-tokens and --max-cost reserve.",
    ),
    Setting(
        "resume_interrupted",
        "bool",
        False,
        description="hermes-bulk worker: at start, continue the jobs a graceful worker stop cut "
        "off "
        "(worker --resume-interrupted), not only after run.",
    ),
    Setting(
        "batch_max_items",
        "int",
        50_000,
        ge=1,
        le=50_000,
        description="create --batch: the most items in one provider batch (the provider's limit is "
        "50,000 requests and 200 MB).",
    ),
    Setting(
        "batch_poll_seconds",
        "float",
        30.0,
        ge=0.05,
        le=3600,
        description="create --batch: how often a worker asks the provider how a batch is doing.",
    ),
    Setting(
        "price",
        "str",
        "",
        check=check_price_setting,
        description="USD per million tokens as input,output[,cached_input] (e.g. 0.15,0.60), or a "
        'JSON file of model -> "input,output": the price of a model genai-prices does not know, '
        "or the one you pay instead.",
    ),
    Setting(
        "batch_window",
        "str",
        "24h",
        check=check_batch_window,
        description="create --batch: the completion window asked of the provider.",
    ),
    Setting(
        "batch_max_line_bytes",
        "int",
        8 * 1024 * 1024,
        ge=1024,
        le=1024 * 1024 * 1024,
        description="create --batch: the longest line of a provider's output or error file that is "
        "read; a longer one is an invalid answer.",
    ),
    Setting(
        "dashboard_token",
        "secret",
        optional=True,
        description="hermes-bulk dashboard: the access token (default: a new random one at each "
        "start, "
        "on a loopback address only).",
    ),
    Setting(
        "max_item_bytes",
        "int",
        4 * 1024 * 1024,
        ge=1,
        le=1024 * 1024 * 1024,
        description="Larger files in a directory are left out, with an event.",
    ),
    Setting(
        "breaker_failures",
        "int",
        5,
        ge=1,
        le=10_000,
        description="Failures to connect to the endpoint in a row (requests in flight together "
        "count "
        "once) that pause a job instead of failing its items.",
    ),
)

BY_NAME = {setting.name: setting for setting in SETTINGS}


class Places:
    """Where a settings object's data lives; Settings and QuickSettings both have these."""

    @property
    def backend_url(self) -> str:
        return self.backend or f"sqlite:///{self.home / 'bulk.db'}"  # type: ignore[attr-defined]

    @property
    def jobs_dir(self) -> Path:
        return self.home / "jobs"  # type: ignore[attr-defined]

    @property
    def endpoint(self) -> Endpoint:
        """The provider's protocol, URL and key (config/provider.py)."""
        return resolve(self)


def register_settings_secrets(settings: Any) -> None:
    """The key, the dashboard token and the credentials in the endpoint and backend URLs:
    masked by value in every log, whichever reader made `settings`."""
    for secret in (
        settings.api_key,
        settings.openai_api_key,
        settings.anthropic_api_key,
        settings.dashboard_token,
    ):
        register_secret(secret.get_secret_value() if secret else None)
    for url in (settings.base_url, settings.openai_base_url, settings.anthropic_base_url):
        register_url(url)
    register_url(settings.backend)
