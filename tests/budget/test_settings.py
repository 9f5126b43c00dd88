"""Budget settings: defaults, validation errors that are one clear line, budget.json, locations."""

from __future__ import annotations

import datetime as dt
import json
import os
import threading

import pytest

from hermes_bulk.budget import settings as bs
from hermes_bulk.budget.settings import BudgetSettings, SettingsFile, parse_value, with_value
from hermes_bulk.errors import ConfigError


def test_the_defaults_are_the_seeds():
    s = BudgetSettings()
    assert (
        s.mode,
        s.daily_limit,
        s.chat_reserve,
        s.job_limit,
        s.reset,
        s.timezone,
        s.models,
        s.ledger,
    ) == ("observe", 1000, 300, None, dt.time(0, 0), None, ("*",), "")
    assert s.background_cap == 700


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("mode", "enforce", "enforce"),
        ("daily_limit", " 50 ", 50),
        ("chat_reserve", "0", 0),
        ("job_limit", "off", None),
        ("job_limit", "25", 25),
        ("reset", "9:30", dt.time(9, 30)),
        ("reset", "23:59", dt.time(23, 59)),
        ("timezone", "Asia/Tokyo", "Asia/Tokyo"),
        ("timezone", "machine", None),
        ("models", "*:free, gpt-*", ("*:free", "gpt-*")),
        ("ledger", "redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ],
)
def test_values_are_parsed_from_what_set_is_given(key, value, expected):
    assert parse_value(key, value) == expected


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("colour", "blue", "Unknown setting 'colour'; the settings are: mode, daily_limit"),
        (
            "timezone",
            "Mars/Olympus_Mons",
            "timezone 'Mars/Olympus_Mons' is not an IANA zone name; use one like Europe/Berlin",
        ),
        ("timezone", "../../etc/passwd", "is not an IANA zone name"),
        ("reset", "25:00", "reset '25:00' is not a time of day; use HH:MM on a 24-hour clock"),
        ("reset", "9am", "is not a time of day"),
        ("mode", "strict", "mode 'strict' is not observe or enforce"),
        ("daily_limit", "lots", "daily_limit 'lots' is not a whole number"),
        ("daily_limit", "0", "daily_limit must be at least 1 (got 0)"),
        ("chat_reserve", "-1", "chat_reserve must be at least 0"),
        ("job_limit", "0", "job_limit must be at least 1"),
        ("models", " , ", "models is empty"),
        ("ledger", "postgres://db/x", "ledger postgres:// is not supported"),
    ],
)
def test_a_bad_value_is_one_line_that_says_what_to_do(key, value, says):
    with pytest.raises(ConfigError) as err:
        parse_value(key, value)
    message = str(err.value)
    assert says in message
    assert "\n" not in message


def test_a_reserve_above_the_limit_is_refused_in_either_order():
    with pytest.raises(
        ConfigError,
        match=r"^chat_reserve \(300\) is above daily_limit \(200\); lower chat_reserve "
        r"or raise daily_limit first\.$",
    ):
        with_value(BudgetSettings(), "daily_limit", "200")
    with pytest.raises(ConfigError, match=r"chat_reserve \(1001\) is above daily_limit \(1000\)"):
        with_value(BudgetSettings(), "chat_reserve", "1001")


def test_set_stores_only_the_keys_that_were_set_and_load_reads_them_back(tmp_path):
    f = SettingsFile(tmp_path / "cron-budget")
    f.set("mode", "enforce")
    f.set("reset", "09:00")
    f.set("models", "*:free,gpt-*")
    assert json.loads(f.path.read_text()) == {
        "mode": "enforce",
        "reset": "09:00",
        "models": ["*:free", "gpt-*"],
    }
    s = f.load()
    assert (s.mode, s.reset, s.models, s.daily_limit, s.timezone) == (
        "enforce",
        dt.time(9, 0),
        ("*:free", "gpt-*"),
        1000,
        None,
    )
    assert oct(f.path.stat().st_mode & 0o777) == "0o600"


def test_a_refused_set_leaves_the_file_as_it_was(tmp_path):
    f = SettingsFile(tmp_path)
    f.set("daily_limit", "500")
    before = f.path.read_text()
    with pytest.raises(ConfigError):
        f.set("chat_reserve", "600")
    assert f.path.read_text() == before


def test_concurrent_sets_of_different_keys_keep_both(tmp_path):
    f = SettingsFile(tmp_path)
    keys = [
        ("daily_limit", str(500 + i)) if i % 2 else ("job_limit", str(1 + i)) for i in range(20)
    ]
    threads = [threading.Thread(target=f.set, args=kv) for kv in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(json.loads(f.path.read_text())) == {"daily_limit", "job_limit"}


def test_a_hand_edited_file_with_a_bad_value_names_the_file_and_the_problem(tmp_path):
    f = SettingsFile(tmp_path)
    f.path.write_text(json.dumps({"timezone": "Nowhere/Land"}))
    with pytest.raises(
        ConfigError, match=r"budget\.json: timezone 'Nowhere/Land' is not an IANA zone name"
    ):
        f.load()
    f.path.write_text("[1, 2]")
    with pytest.raises(
        ConfigError, match=r"is not a JSON object; fix it by hand, or delete it \(rm "
    ):
        f.load()


def test_a_redis_password_is_never_shown():
    s = with_value(BudgetSettings(), "ledger", "redis://:s3cret@cache.internal:6379/0")
    assert s.shown("ledger") == "redis://:***@cache.internal:6379/0"


@pytest.mark.parametrize(
    "hermes_home, root",
    [
        (None, "~/.hermes"),
        ("~/.hermes/profiles/work", "~/.hermes"),
        ("/opt/data", "/opt/data"),
        ("/opt/data/profiles/work", "/opt/data"),
    ],
)
def test_the_root_home_is_resolved_as_hermes_resolves_it(monkeypatch, tmp_path, hermes_home, root):
    monkeypatch.setenv("HOME", str(tmp_path))
    if hermes_home is None:
        monkeypatch.delenv("HERMES_HOME", raising=False)
    else:
        monkeypatch.setenv("HERMES_HOME", os.path.expanduser(hermes_home))
    assert bs.root_home() == bs.Path(os.path.expanduser(root))
    assert bs.budget_dir() == bs.Path(os.path.expanduser(root)) / "plugin-data" / "cron-budget"


def test_the_ledger_is_the_local_sqlite_file_unless_a_setting_or_the_environment_says_otherwise(
    monkeypatch, tmp_path
):
    monkeypatch.delenv(bs.LEDGER_ENV, raising=False)
    assert bs.ledger_location(BudgetSettings(), tmp_path) == str(tmp_path / "ledger.db")
    s = with_value(BudgetSettings(), "ledger", "redis://a:1/0")
    assert bs.ledger_location(s, tmp_path) == "redis://a:1/0"
    monkeypatch.setenv(bs.LEDGER_ENV, "redis://b:2/0")
    assert bs.ledger_location(s, tmp_path) == "redis://b:2/0"


def test_the_machine_zone_is_an_iana_name(monkeypatch):
    monkeypatch.setenv("TZ", "America/Chicago")
    assert bs.machine_zone() == "America/Chicago"
    monkeypatch.setenv("TZ", "not-a-zone")
    assert bs.ZoneInfo(bs.machine_zone())  # falls back to the system's zone, or UTC


def test_the_machine_zone_is_kept_until_tz_or_the_zone_files_change(monkeypatch, tmp_path):
    name_file, link = tmp_path / "timezone", tmp_path / "localtime"
    monkeypatch.setattr(bs, "ZONE_NAME_FILE", str(name_file))
    monkeypatch.setattr(bs, "LOCALTIME_FILE", str(link))
    monkeypatch.delenv("TZ", raising=False)
    name_file.write_text("Asia/Tokyo\n")
    assert bs.machine_zone() == "Asia/Tokyo"
    monkeypatch.setenv("TZ", "Europe/Berlin")
    assert bs.machine_zone() == "Europe/Berlin"
    monkeypatch.delenv("TZ")
    assert bs.machine_zone() == "Asia/Tokyo"
    # The way tools change it: a new file (or link) renamed over the old one.
    replacement = tmp_path / "timezone.new"
    replacement.write_text("America/Denver\n")
    replacement.replace(name_file)
    assert bs.machine_zone() == "America/Denver"
    name_file.unlink()
    link.symlink_to("/usr/share/zoneinfo/Australia/Perth")
    assert bs.machine_zone() == "Australia/Perth"


@pytest.mark.parametrize("stored", [True, 1.5, 1e300, "٣", [1000], {"n": 1}, None])
def test_a_count_in_budget_json_that_is_not_a_whole_number_is_named(tmp_path, stored):
    """JSON can hold what `set` never writes; pydantic would take true as 1, and 1e300 is not a
    count."""
    f = SettingsFile(tmp_path)
    f.path.write_text(json.dumps({"daily_limit": stored}))
    with pytest.raises(ConfigError) as err:
        f.load()
    assert f"daily_limit {stored!r} is not a whole number" in str(err.value)
    assert str(err.value).endswith("; fix it with: hermes cron-budget set daily_limit VALUE.")


def test_a_whole_number_written_with_a_point_is_taken():
    assert parse_value("daily_limit", "500.0") == 500 and parse_value("job_limit", 7.0) == 7


def test_only_the_settings_are_keys_of_budget_json(tmp_path):
    """The keys that were set are pydantic's own record, not a field that the file could set."""
    f = SettingsFile(tmp_path)
    for key in ("explicit", "model_fields_set", "zone", "background_cap"):
        f.path.write_text(json.dumps({key: ["mode"]}))
        with pytest.raises(
            ConfigError, match=rf"Unknown setting '{key}'; .*; remove '{key}' from the file\.$"
        ):
            f.load()


def test_a_value_set_is_stored_as_set_takes_it_and_reads_back_equal(tmp_path):
    f = SettingsFile(tmp_path)
    for key, text in [
        ("reset", "7:05"),
        ("job_limit", "off"),
        ("timezone", "machine"),
        ("models", "a, b"),
    ]:
        s = f.set(key, text)
        assert s.shown(key) == f.load().shown(key)
    assert json.loads(f.path.read_text()) == {
        "reset": "07:05",
        "job_limit": None,
        "timezone": None,
        "models": ["a", "b"],
    }
    assert f.load() == with_value(with_value(BudgetSettings(), "reset", "07:05"), "models", "a,b")
