"""The settings of a command that must start fast, read from the environment without pydantic.

`path`, `list` and `status` do little, yet importing pydantic-settings takes longer on this
machine than the whole command may (benchmarks, row 7). So the command line first reads the
environment here, by settings_fields' table: every setting, by the names Settings reads (case
ignored, as pydantic-settings ignores it), with its default and bounds. It takes only values
whose meaning is beyond doubt: digits within the bounds, a plain decimal, one of the usual
words for true and false, any text where any text goes (after the check Settings runs too).
Anything else (a sign, an exponent, an underscore, a blank, a value out of range, one name
set in two cases) is a doubt: `read` returns None and the command loads Settings, which
takes the value or says, in its own words, what is wrong with it. So a command never accepts
here what Settings refuses, nor reads a value otherwise: tests/test_quick_settings.py holds
the two readers equal over random environments.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .fields import SETTINGS, Places, Setting

_DIGITS = re.compile(r"[0-9]{1,15}")
_DECIMAL = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,9})?")
_BOOLEANS = {"true": True, "false": False, "1": True, "0": False}
_READ_NAMES = {name.lower() for setting in SETTINGS for name in setting.env_names}


class _Doubt(Exception):
    """A value only Settings can judge."""


class Secret:
    """A key held as Settings holds it (pydantic's SecretStr): never in a repr."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')"


class QuickSettings(Places):
    """The values Settings would hold, under the same names; read-only like Settings."""

    def __init__(self, values: dict[str, Any]) -> None:
        object.__setattr__(self, "_values", values)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("settings are read-only")


def read(environ: Mapping[str, str]) -> QuickSettings | None:
    """Every setting from `environ` (no Hermes plugin settings, no overrides), or None if any
    value is one only Settings can judge."""
    given: dict[str, str] = {}
    for key, value in environ.items():
        name = key.lower()
        if name in _READ_NAMES:
            if (
                name in given
            ):  # the same name in two cases: which one pydantic-settings takes is its business
                return None
            given[name] = value
    try:
        return QuickSettings({setting.name: _value(setting, given) for setting in SETTINGS})
    except _Doubt:
        return None


def _value(setting: Setting, given: dict[str, str]) -> Any:
    raw = next((given[name.lower()] for name in setting.env_names if name.lower() in given), None)
    if raw is None:
        return setting.default_factory() if setting.default_factory else setting.default
    if setting.kind in ("int", "float"):
        if not (_DIGITS if setting.kind == "int" else _DECIMAL).fullmatch(raw):
            raise _Doubt
        number = int(raw) if setting.kind == "int" else float(raw)
        if (
            (setting.ge is not None and number < setting.ge)
            or (setting.gt is not None and number <= setting.gt)
            or (setting.le is not None and number > setting.le)
        ):
            raise _Doubt
        return number
    if setting.kind == "bool":
        if raw not in _BOOLEANS:
            raise _Doubt
        return _BOOLEANS[raw]
    if setting.kind == "path":
        if not raw.strip():
            raise _Doubt
        return Path(raw)
    if setting.kind == "secret":
        return Secret(raw)
    if setting.check:
        try:
            return setting.check(raw)
        except ValueError:
            raise _Doubt from None
    return raw
