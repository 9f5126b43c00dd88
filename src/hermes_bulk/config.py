"""The one Settings object: environment (HERMES_BULK_*, OPENAI_*), Hermes plugin settings, flags.

Precedence, highest first: keyword overrides (command-line flags, tests) > environment >
`plugins.entries.bulk.settings` from Hermes' config.yaml > defaults. A bad value fails at load
with one line that names the setting (`ConfigError`).
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from .errors import ConfigError
from .redact import public_url, register_secret, register_url

ENV_PREFIX = "HERMES_BULK_"
BACKEND_SCHEMES = ("sqlite", "redis", "rediss")


def default_home() -> Path:
    """`$HERMES_HOME/plugin-data/bulk`, else `~/.hermes/plugin-data/bulk`: where Hermes keeps it too."""
    hermes_home = os.environ.get("HERMES_HOME")
    base = Path(hermes_home).expanduser() if hermes_home else Path.home() / ".hermes"
    return base / "plugin-data" / "bulk"


class _MappingSource(PydanticBaseSettingsSource):
    """Settings from a plain mapping (Hermes' `plugins.entries.bulk.settings`)."""

    def __init__(self, settings_cls: type[BaseSettings], values: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self._values = values

    def get_field_value(self, field, field_name):  # pragma: no cover - unused by __call__
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        known = set(self.settings_cls.model_fields)
        return {k: v for k, v in self._values.items() if k in known and v is not None}


class Settings(BaseSettings):
    """Everything hermes-bulk can be told. Field names are the env names without the prefix."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="ignore", populate_by_name=True, frozen=True,
    )

    home: Path = Field(default_factory=default_home, description="Data directory (HERMES_BULK_HOME).")
    backend: str = Field("", description="sqlite:///path, redis://… or rediss://…; default: SQLite in the data dir.")
    base_url: str = Field(
        "https://api.openai.com/v1",
        validation_alias=AliasChoices("HERMES_BULK_BASE_URL", "OPENAI_BASE_URL", "base_url"),
        description="OpenAI-compatible endpoint (falls back to OPENAI_BASE_URL).",
    )
    api_key: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("HERMES_BULK_API_KEY", "OPENAI_API_KEY", "api_key"),
        description="API key (falls back to OPENAI_API_KEY). Never stored or printed.",
    )
    model: str | None = Field(None, description="Model name sent with each request (HERMES_BULK_MODEL).")
    max_retries: int = Field(2, ge=0, le=20, description="Default automatic retries per item.")
    max_concurrency: int = Field(16, ge=1, le=1024, description="The most items one job may run at once.")
    default_concurrency: int = Field(4, ge=1, le=1024, description="--concurrency when not given.")
    rpm: int | None = Field(None, ge=1, le=1_000_000, description="Default requests per minute for pacing (none: no pacing).")
    tpm: int | None = Field(None, ge=1, le=1_000_000_000, description="Default tokens per minute for pacing (none: no pacing).")
    lease_seconds: float = Field(30.0, ge=0.5, le=3600, description="How long a claimed item stays owned without renewal.")
    request_timeout_seconds: float = Field(120.0, gt=0, le=3600, description="Timeout of one model request.")
    output_tokens_estimate: int = Field(512, ge=0, le=1_000_000, description="Output allowance in token reservations.")
    reuse: bool = Field(True, description="Reuse answers of earlier jobs in this store (false: every create is --fresh).")
    max_output_tokens: int | None = Field(None, ge=1, le=1_000_000, description="max_tokens sent with each request (none: provider default).")
    resume_interrupted: bool = Field(False, description="hermes-bulk worker: at start, continue the jobs a graceful "
                                     "worker stop cut off (worker --resume-interrupted), not only after run.")
    batch_max_items: int = Field(50_000, ge=1, le=50_000, description="create --batch: the most items in one "
                                 "provider batch (the provider's limit is 50,000 requests and 200 MB).")
    batch_poll_seconds: float = Field(30.0, ge=0.05, le=3600, description="create --batch: how often a worker "
                                      "asks the provider how a batch is doing.")
    batch_window: str = Field("24h", description="create --batch: the completion window asked of the provider.")
    dashboard_token: SecretStr | None = Field(None, description="hermes-bulk dashboard: the access token (default: "
                                              "a new random one at each start, on a loopback address only).")
    max_item_bytes: int = Field(4 * 1024 * 1024, ge=1, le=1024 * 1024 * 1024, description="Larger files in a directory are left out, with an event.")

    @field_validator("backend")
    @classmethod
    def _backend_scheme(cls, value: str) -> str:
        if value and value.split("://", 1)[0].lower() not in BACKEND_SCHEMES:
            raise ValueError("must start with sqlite://, redis:// or rediss://")
        return value

    @field_validator("batch_window")
    @classmethod
    def _batch_window(cls, value: str) -> str:
        from .durations import parse_duration

        if not parse_duration(value):
            raise ValueError("must be a duration such as 24h")
        return value.strip()

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value.rstrip("/")

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings,
                                   dotenv_settings, file_secret_settings):
        plugin = _MappingSource(settings_cls, _plugin_settings_for_load.get() or {})
        return (init_settings, env_settings, plugin)

    @property
    def backend_url(self) -> str:
        return self.backend or f"sqlite:///{self.home / 'bulk.db'}"

    @property
    def jobs_dir(self) -> Path:
        return self.home / "jobs"


# Hermes' plugin settings are handed to the source through a context variable because
# pydantic-settings builds sources from the class, not the instance; load_settings sets it. Each
# thread has its own context, so a gateway loading two profiles' settings at once keeps them apart.
_plugin_settings_for_load: ContextVar[dict[str, Any] | None] = ContextVar("plugin_settings_for_load", default=None)


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def load_settings(plugin_settings: dict[str, Any] | None = None, **overrides: Any) -> Settings:
    """Build Settings, turning a validation failure into one line that names the setting."""
    overrides = {k: v for k, v in overrides.items() if v is not None}
    plugin_settings = dict(plugin_settings or {})
    token = _plugin_settings_for_load.set(plugin_settings)
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else "?"
        name = field if field.startswith(ENV_PREFIX) else env_name(field)
        if field in plugin_settings and field not in overrides and name not in os.environ:
            name = f"plugins.entries.bulk.settings.{field}"
        got = err.get("input")
        got = public_url(got) if isinstance(got, str) else got  # a rejected URL may still hold a password
        shown = "" if field in ("api_key", "OPENAI_API_KEY") or isinstance(got, dict) else f" (got {got!r})"
        raise ConfigError(f"Invalid setting {name}: {err['msg']}{shown}.") from None
    finally:
        _plugin_settings_for_load.reset(token)
    register_settings_secrets(settings)
    return settings


def register_settings_secrets(settings: Settings) -> None:
    """The key and the credentials in the endpoint and backend URLs: masked by value in every log."""
    register_secret(settings.api_key.get_secret_value() if settings.api_key else None)
    register_secret(settings.dashboard_token.get_secret_value() if settings.dashboard_token else None)
    register_url(settings.base_url)
    register_url(settings.backend)
