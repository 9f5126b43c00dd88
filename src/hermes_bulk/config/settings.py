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

from ..errors import ConfigError
from ..redact import public_url
from .fields import (
    BY_NAME,
    ENV_PREFIX,
    Places,
    check_backend,
    check_base_url,
    check_batch_window,
    check_price_setting,
    check_provider,
    env_name,
    register_settings_secrets,
)


def _field(name: str) -> Any:
    """The pydantic Field of a setting, from its row in settings_fields.SETTINGS."""
    setting = BY_NAME[name]
    options: dict[str, Any] = {
        key: getattr(setting, key)
        for key in ("ge", "gt", "le")
        if getattr(setting, key) is not None
    }
    if setting.aliases:
        options["validation_alias"] = AliasChoices(*setting.aliases)
    if setting.default_factory:
        options["default_factory"] = setting.default_factory
    else:
        options["default"] = setting.default
    return Field(**options, description=setting.description)


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


class Settings(BaseSettings, Places):
    """Everything hermes-bulk can be told. Field names are the env names without the prefix; each
    field's default, bounds, environment names and description are its row in settings_fields."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="ignore",
        populate_by_name=True,
        frozen=True,
    )

    home: Path = _field("home")
    backend: str = _field("backend")
    provider: str = _field("provider")
    base_url: str = _field("base_url")
    api_key: SecretStr | None = _field("api_key")
    openai_base_url: str = _field("openai_base_url")
    openai_api_key: SecretStr | None = _field("openai_api_key")
    anthropic_base_url: str = _field("anthropic_base_url")
    anthropic_api_key: SecretStr | None = _field("anthropic_api_key")
    model: str | None = _field("model")
    max_retries: int = _field("max_retries")
    max_concurrency: int = _field("max_concurrency")
    default_concurrency: int = _field("default_concurrency")
    rpm: int | None = _field("rpm")
    tpm: int | None = _field("tpm")
    lease_seconds: float = _field("lease_seconds")
    request_timeout_seconds: float = _field("request_timeout_seconds")
    output_tokens_estimate: int = _field("output_tokens_estimate")
    reuse: bool = _field("reuse")
    max_output_tokens: int = _field("max_output_tokens")
    resume_interrupted: bool = _field("resume_interrupted")
    batch_max_items: int = _field("batch_max_items")
    batch_poll_seconds: float = _field("batch_poll_seconds")
    batch_window: str = _field("batch_window")
    price: str = _field("price")
    batch_max_line_bytes: int = _field("batch_max_line_bytes")
    dashboard_token: SecretStr | None = _field("dashboard_token")
    max_item_bytes: int = _field("max_item_bytes")
    breaker_failures: int = _field("breaker_failures")

    @field_validator("backend")
    @classmethod
    def _backend(cls, value: str) -> str:
        return check_backend(value)

    @field_validator("base_url", "openai_base_url", "anthropic_base_url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        return check_base_url(value)

    @field_validator("provider")
    @classmethod
    def _provider(cls, value: str) -> str:
        return check_provider(value)

    @field_validator("price")
    @classmethod
    def _price(cls, value: str) -> str:
        return check_price_setting(value)

    @field_validator("batch_window")
    @classmethod
    def _batch_window(cls, value: str) -> str:
        return check_batch_window(value)

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ):
        plugin = _MappingSource(settings_cls, _plugin_settings_for_load.get() or {})
        return (init_settings, env_settings, plugin)


# Hermes' plugin settings are handed to the source through a context variable because
# pydantic-settings builds sources from the class, not the instance; load_settings sets it. Each
# thread has its own context, so a gateway loading two profiles' settings at once keeps them apart.
_plugin_settings_for_load: ContextVar[dict[str, Any] | None] = ContextVar(
    "plugin_settings_for_load", default=None
)


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
        # an alias that was read (OPENAI_BASE_URL) is its own name; a field's is HERMES_BULK_<NAME>
        name = field if field.isupper() else env_name(field)
        if field in plugin_settings and field not in overrides and name not in os.environ:
            name = f"plugins.entries.bulk.settings.{field}"
        got = err.get("input")
        got = (
            public_url(got) if isinstance(got, str) else got
        )  # a rejected URL may still hold a password
        shown = "" if "api_key" in field.lower() or isinstance(got, dict) else f" (got {got!r})"
        raise ConfigError(f"Invalid setting {name}: {err['msg']}{shown}.") from None
    finally:
        _plugin_settings_for_load.reset(token)
    register_settings_secrets(settings)
    return settings
