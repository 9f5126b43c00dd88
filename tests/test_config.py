"""Settings: defaults, where they come from, and one clear line for a bad value."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hermes_bulk.config.settings import Settings, load_settings
from hermes_bulk.errors import ConfigError

README = Path(__file__).resolve().parent.parent / "README.md"


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for key in (
        "HERMES_BULK_HOME",
        "HERMES_HOME",
        "HERMES_BULK_BASE_URL",
        "OPENAI_BASE_URL",
        "HERMES_BULK_API_KEY",
        "OPENAI_API_KEY",
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
    assert s.base_url == "https://api.openai.com/v1" and s.api_key is None


def test_the_data_dir_follows_hermes_home_unless_set(clean_env, tmp_path):
    clean_env.setenv("HERMES_HOME", str(tmp_path / "profile"))
    assert load_settings().home == tmp_path / "profile" / "plugin-data" / "bulk"
    clean_env.setenv("HERMES_BULK_HOME", str(tmp_path / "own"))
    assert load_settings().home == tmp_path / "own"


def test_openai_variables_are_the_fallback(clean_env):
    clean_env.setenv("OPENAI_BASE_URL", "http://openai.example/v1/")
    clean_env.setenv("OPENAI_API_KEY", "sk-openai")
    s = load_settings()
    assert (s.base_url, s.api_key.get_secret_value()) == ("http://openai.example/v1", "sk-openai")
    clean_env.setenv("HERMES_BULK_BASE_URL", "http://bulk.example/v1")
    clean_env.setenv("HERMES_BULK_API_KEY", "sk-bulk")
    s = load_settings()
    assert (s.base_url, s.api_key.get_secret_value()) == ("http://bulk.example/v1", "sk-bulk")
    assert "sk-bulk" not in repr(s)


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


def test_every_setting_is_documented_in_the_readme():
    readme = README.read_text()
    documented = set(re.findall(r"`(HERMES_BULK_[A-Z_]+)`", readme))
    fields = {"HERMES_BULK_" + name.upper() for name in Settings.model_fields}
    assert fields <= documented, f"undocumented settings: {sorted(fields - documented)}"
