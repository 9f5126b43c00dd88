"""Settings: defaults, where they come from, and one clear line for a bad value."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hermes_bulk.config.fields import BY_NAME
from hermes_bulk.config.provider import Endpoint
from hermes_bulk.config.settings import Settings, load_settings
from hermes_bulk.errors import ConfigError

#: The page whose table documents every setting.
CONFIGURATION_DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for key in (
        "HERMES_BULK_HOME",
        "HERMES_HOME",
        "HERMES_BULK_BASE_URL",
        "OPENAI_BASE_URL",
        "ANTHROPIC_BASE_URL",
        "HERMES_BULK_API_KEY",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "HERMES_BULK_PROVIDER",
        "HERMES_BULK_MODEL",
        "HERMES_BULK_BACKEND",
        "HERMES_BULK_MAX_CONCURRENCY",
        "HERMES_BULK_MAX_RETRIES",
    ):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return monkeypatch


def test_defaults(clean_env, tmp_path):
    s = load_settings()
    assert (s.max_retries, s.max_concurrency, s.default_concurrency) == (2, 16, 4)
    assert s.home == tmp_path / ".hermes" / "plugin-data" / "bulk"
    assert s.backend_url == f"sqlite:///{tmp_path}/.hermes/plugin-data/bulk/bulk.db"
    assert s.endpoint == Endpoint("openai", "https://api.openai.com/v1", None)


def test_the_data_dir_follows_hermes_home_unless_set(clean_env, tmp_path):
    clean_env.setenv("HERMES_HOME", str(tmp_path / "profile"))
    assert load_settings().home == tmp_path / "profile" / "plugin-data" / "bulk"
    clean_env.setenv("HERMES_BULK_HOME", str(tmp_path / "own"))
    assert load_settings().home == tmp_path / "own"


def test_openai_variables_are_the_fallback(clean_env):
    clean_env.setenv("OPENAI_BASE_URL", "http://openai.example/v1/")
    clean_env.setenv("OPENAI_API_KEY", "sk-openai")
    clean_env.setenv("ANTHROPIC_API_KEY", "sk-ant-never-sent-to-openai")
    s = load_settings()
    assert s.endpoint == Endpoint("openai", "http://openai.example/v1", "sk-openai")
    clean_env.setenv("HERMES_BULK_BASE_URL", "http://bulk.example/v1")
    clean_env.setenv("HERMES_BULK_API_KEY", "sk-bulk")
    s = load_settings()
    assert s.endpoint == Endpoint("openai", "http://bulk.example/v1", "sk-bulk")
    assert "sk-bulk" not in repr(s) + repr(s.endpoint)


def test_each_provider_takes_only_its_own_variables(clean_env):
    """A shell holding both providers' keys sends each key only to its own provider."""
    for name, value in {
        "OPENAI_BASE_URL": "http://openai.example/v1",
        "OPENAI_API_KEY": "sk-openai",
        "ANTHROPIC_BASE_URL": "http://claude.example",
        "ANTHROPIC_API_KEY": "sk-ant",
    }.items():
        clean_env.setenv(name, value)
    assert load_settings().endpoint == Endpoint("openai", "http://openai.example/v1", "sk-openai")
    clean_env.setenv("HERMES_BULK_PROVIDER", " Anthropic")
    # ANTHROPIC_BASE_URL is the SDK's: without /v1, which the API's paths begin with
    assert load_settings().endpoint == Endpoint("anthropic", "http://claude.example/v1", "sk-ant")
    assert load_settings(provider="openai").endpoint.api_key == "sk-openai"


def test_the_provider_is_inferred_from_the_base_url(clean_env):
    clean_env.setenv("ANTHROPIC_API_KEY", "sk-ant")
    clean_env.setenv("OPENAI_API_KEY", "sk-openai")
    clean_env.setenv("HERMES_BULK_BASE_URL", "https://api.anthropic.com")
    assert load_settings().endpoint == Endpoint(
        "anthropic", "https://api.anthropic.com/v1", "sk-ant"
    )
    clean_env.setenv("HERMES_BULK_BASE_URL", "https://evil-anthropic.com.example/v1")
    assert load_settings().endpoint.protocol == "openai"
    clean_env.setenv("HERMES_BULK_BASE_URL", "http://proxy.example/openai")
    assert load_settings().endpoint.base_url == "http://proxy.example/openai", "no /v1 added"
    clean_env.delenv("HERMES_BULK_BASE_URL")
    assert load_settings().endpoint.protocol == "openai", "the default without a URL"
    with pytest.raises(AttributeError):  # resolved once and shared: never changed
        load_settings().endpoint.api_key = "sk-other"  # type: ignore[misc]
    assert load_settings(provider="anthropic").endpoint == Endpoint(
        "anthropic", "https://api.anthropic.com/v1", "sk-ant"
    )


@pytest.mark.parametrize(
    "name, value",
    [
        ("HERMES_BULK_PROVIDER", "claude"),
        ("ANTHROPIC_BASE_URL", "api.anthropic.com"),
        ("OPENAI_BASE_URL", "ftp://x"),
    ],
)
def test_a_bad_provider_setting_is_named(clean_env, name, value):
    clean_env.setenv(name, value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    message = str(info.value)
    assert message.startswith(f"Invalid setting {name}:") and value in message


def test_precedence_flags_over_env_over_plugin_settings(clean_env):
    plugin = {"max_concurrency": 3, "max_retries": 5, "unknown_key": 1}
    assert load_settings(plugin_settings=plugin).max_concurrency == 3
    clean_env.setenv("HERMES_BULK_MAX_CONCURRENCY", "7")
    s = load_settings(plugin_settings=plugin)
    assert (s.max_concurrency, s.max_retries) == (7, 5)
    assert load_settings(plugin_settings=plugin, max_concurrency=9).max_concurrency == 9
    assert load_settings().max_retries == 2, "plugin settings do not leak into later loads"


@pytest.mark.parametrize(
    "source, value, name",
    [
        ("env", "abc", "HERMES_BULK_MAX_CONCURRENCY"),
        ("env", "0", "HERMES_BULK_MAX_CONCURRENCY"),
        ("plugin", "many", "plugins.entries.bulk.settings.max_concurrency"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_setting(clean_env, source, value, name):
    if source == "env":
        clean_env.setenv(name, value)
        call = load_settings
    else:

        def call():
            return load_settings(plugin_settings={"max_concurrency": value})

    with pytest.raises(ConfigError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and name in message and value in message


def test_every_setting_is_documented_in_the_configuration_page():
    page = CONFIGURATION_DOC.read_text()
    documented = set(re.findall(r"`([A-Z][A-Z_]+)`", page))
    fields = {BY_NAME[name].env_names[0] for name in Settings.model_fields}
    assert fields <= documented, f"undocumented settings: {sorted(fields - documented)}"
