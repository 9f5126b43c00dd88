"""quick_settings reads what Settings reads, or says it cannot be sure.

The read commands take their settings from quick_settings when it answers, so it must never
accept what Settings refuses, nor read a value otherwise. Hypothesis draws environments: every
setting's names (its own and the OPENAI_* fallbacks) in random cases, with values near each
bound and of every shape a person or a script may write, and compares the two readers.
"""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

from hypothesis import HealthCheck, example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from hermes_bulk.config import quick as quick_settings
from hermes_bulk.config.fields import BY_NAME, SETTINGS
from hermes_bulk.config.settings import Settings, load_settings
from hermes_bulk.errors import ConfigError

SHAPES = [
    "",
    " ",
    "0",
    "1",
    "-1",
    "+5",
    "007",
    "1_000",
    "1e3",
    "nan",
    "inf",
    "-inf",
    "0.5",
    ".5",
    "5.",
    " 7",
    "7 ",
    "0x10",
    "١٢",
    "true",
    "True",
    "TRUE",
    "false",
    "yes",
    "no",
    "on",
    "off",
    "t",
    "f",
    "y",
    "n",
    "none",
    "null",
    "sqlite:///tmp/x/bulk.db",
    "SQLITE:///tmp/y.db",
    "redis://h:1/0",
    "rediss://u:p@h/0",
    "ftp://x",
    "http://a.example/v1/",
    "https://b.example",
    "localhost:8000",
    "24h",
    " 2d ",
    "90",
    "0s",
    "1.5h",
    "abc",
    "sk-x",
    "~/x",
    "/tmp/h",
    "relative/dir",
    "\t1",
    "1\n",
]
#: What an environment value can hold: any text but NUL (the kernel's terminator) and lone
#: surrogates.
ENV_TEXT = st.text(
    st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=8
)


def _near_bounds(name: str) -> list[str]:
    s = BY_NAME[name]
    values: list[str] = []
    for bound in (s.ge, s.gt, s.le):
        if bound is not None:
            for delta in (-1, -0.01, 0, 0.01, 1):
                number = bound + delta
                values += [str(number), str(int(number))] if number >= 0 else [str(number)]
    return values


def _case(name: str):
    return st.sampled_from([name, name.lower(), name.upper(), name.swapcase(), name.title()])


@st.composite
def environments(draw):
    env = {"HOME": "/home/tester", "PATH": "/usr/bin:/bin"}
    if draw(st.booleans()):
        env["HERMES_HOME"] = draw(st.sampled_from(["/srv/hermes", "~/profile", ""]))
    for setting in draw(st.lists(st.sampled_from(SETTINGS), max_size=6, unique=True)):
        names = draw(
            st.lists(st.sampled_from(setting.env_names), min_size=1, max_size=2, unique=True)
        )
        for name in names:
            value = draw(
                st.one_of(
                    st.sampled_from(SHAPES),
                    st.sampled_from(_near_bounds(setting.name) or ["1"]),
                    st.integers(-5, 2 * 10**9).map(str),
                    st.floats(allow_nan=True, allow_infinity=True).map(str),
                    ENV_TEXT,
                )
            )
            env[draw(_case(name))] = value
    return env


def _settings(env: dict[str, str]) -> tuple[Settings | None, quick_settings.QuickSettings | None]:
    with mock.patch.dict(os.environ, env, clear=True):
        quick = quick_settings.read(os.environ)
        try:
            full = load_settings()
        except (ConfigError, ValueError):
            full = None
    return full, quick


def _plain(value):
    return value.get_secret_value() if hasattr(value, "get_secret_value") else value


def _assert_equal(full: Settings, quick: quick_settings.QuickSettings) -> None:
    for setting in SETTINGS:
        ours, theirs = _plain(getattr(quick, setting.name)), _plain(getattr(full, setting.name))
        assert (type(ours), ours) == (type(theirs), theirs), setting.name
    assert (quick.backend_url, quick.jobs_dir) == (full.backend_url, full.jobs_dir)


@hypothesis_settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(environments())
@example({"HOME": "/h", "hermes_bulk_rpm": "5", "HERMES_BULK_RPM": "6"})  # one name in two cases
@example({"HOME": "/h", "OPENAI_API_KEY": "sk-a", "api_key": "sk-b"})  # the fallback order
@example(
    {"HOME": "/h", "HERMES_BULK_LEASE_SECONDS": "0.5", "HERMES_BULK_REQUEST_TIMEOUT_SECONDS": "0"}
)
def test_quick_settings_never_disagree_with_settings(env):
    full, quick = _settings(env)
    if quick is not None:
        assert full is not None, f"quick_settings accepted what Settings refuses: {env}"
        _assert_equal(full, quick)


@st.composite
def plain_environments(draw):
    """Values as the docs and a user write them: quick_settings must answer these itself."""
    env = {"HOME": "/home/tester"}
    for setting in draw(st.lists(st.sampled_from(SETTINGS), max_size=8, unique=True)):
        if setting.kind == "int":
            value = str(draw(st.integers(int(setting.ge or 0), int(setting.le))))
        elif setting.kind == "float":
            value = str(draw(st.integers(max(1, int(setting.ge or 1)), int(setting.le))))
        elif setting.kind == "bool":
            value = draw(st.sampled_from(["true", "false", "1", "0"]))
        elif setting.kind == "path":
            value = draw(st.sampled_from(["/srv/bulk", "data/bulk", "~/bulk"]))
        elif setting.name == "backend":
            value = draw(
                st.sampled_from(
                    [
                        "",
                        "sqlite:////srv/bulk.db",
                        "redis://:pw@127.0.0.1:6379/0",
                        "rediss://cache.example:6380/2?prefix=team",
                    ]
                )
            )
        elif setting.name.endswith("base_url"):
            value = draw(
                st.sampled_from(["http://127.0.0.1:8000/v1", "https://api.example.com/v1/", ""])
            )
        elif setting.name == "provider":
            value = draw(st.sampled_from(["", "openai", " Anthropic"]))
        elif setting.name == "price":
            value = draw(st.sampled_from(["0.15,0.60", "2, 8, 0.5", "/srv/prices.json", ""]))
        elif setting.name == "batch_window":
            value = draw(st.sampled_from(["24h", "2d", "3600"]))
        else:
            value = draw(
                st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=20)
            )
        env[setting.env_names[0]] = value
    return env


@hypothesis_settings(max_examples=200, deadline=None)
@given(plain_environments())
def test_quick_settings_answer_plain_environments_themselves(env):
    full, quick = _settings(env)
    assert full is not None and quick is not None, env
    _assert_equal(full, quick)


def test_the_table_is_every_setting_and_nothing_else():
    assert set(Settings.model_fields) == set(BY_NAME)


def test_a_key_read_quickly_is_never_shown(tmp_path):
    with mock.patch.dict(
        os.environ, {"HOME": str(tmp_path), "OPENAI_API_KEY": "sk-quick-secret-123"}, clear=True
    ):
        quick = quick_settings.read(os.environ)
    assert quick is not None and quick.endpoint.api_key == "sk-quick-secret-123"
    assert "sk-quick" not in repr(quick.openai_api_key) + repr(quick.endpoint)
    assert quick.home == Path(tmp_path) / ".hermes" / "plugin-data" / "bulk"
