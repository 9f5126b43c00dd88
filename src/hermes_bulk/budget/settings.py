"""The budget's settings: defaults, validation, and `budget.json` next to the ledger.

Every profile and every process reads the same file, `<root Hermes home>/plugin-data/
cron-budget/budget.json`, which holds only the keys someone set (an unset timezone keeps
following the machine's zone). `set` validates one key at a time and writes the file whole
and atomically under a lock, so two `set`s at once cannot lose one another. A bad value is
one line that says what to do (ConfigError).

The ledger's location is the `ledger` key, overridden by HERMES_BULK_BUDGET_LEDGER: empty means
the SQLite file `ledger.db` beside budget.json; a redis:// or rediss:// URL shares the ledger
between machines (each machine keeps its own budget.json, so give them the same settings).
A SQLite ledger's path is absolute: a relative one (from `set`, an older budget.json or the
environment) is taken against the root Hermes home, never a process's working directory, so
every process counts in the same file.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ..config.backend_url import REDIS_SCHEMES, SqliteUrl, parse_ledger_url
from ..errors import ConfigError
from ..files import private_dir, write_private
from ..redact import public_url
from .policy import OBSERVE

SETTINGS_FILE = "budget.json"
LEDGER_FILE = "ledger.db"
LEDGER_ENV = "HERMES_BULK_BUDGET_LEDGER"
KEYS = ("mode", "daily_limit", "chat_reserve", "job_limit", "reset", "timezone", "models", "ledger")

_TIME = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)$")
_ALONE = "alone"  # validation context: one key on its own, without the rules between keys


class BudgetSettings(BaseModel):
    """What the budget is told. `timezone` None follows the machine's zone.

    The keys given (pydantic's `model_fields_set`) are what budget.json stores; equality ignores
    them."""

    model_config = {"frozen": True, "extra": "forbid"}

    mode: Literal["observe", "enforce"] = OBSERVE
    daily_limit: int = Field(1000, ge=1)  # provider requests per window, every profile together
    chat_reserve: int = Field(
        300, ge=0
    )  # requests kept for chat: background work stops at the difference
    job_limit: int | None = Field(None, ge=1)  # requests one cron job may make per window
    reset: dt.time = dt.time(0, 0)  # local time at which the provider's window reopens
    timezone: str | None = None
    models: tuple[str, ...] = ("*",)  # model-name globs that count
    ledger: str = ""  # "" = SQLite beside budget.json; or a redis:// URL

    @field_validator("daily_limit", "chat_reserve", "job_limit", mode="before")
    @classmethod
    def _whole(cls, raw: Any, info) -> Any:
        if info.field_name == "job_limit" and (
            raw is None or str(raw).lower() in ("off", "none", "")
        ):
            return None
        if isinstance(raw, bool):  # pydantic takes true as 1; a count of requests is never true
            raise PydanticCustomError("int_type", "not a whole number")
        return raw

    @field_validator("reset", mode="before")
    @classmethod
    def _clock_time(cls, raw: Any) -> dt.time:
        if isinstance(raw, dt.time):
            return raw
        m = _TIME.match(str(raw))
        if not m:
            raise ValueError(
                f"reset {raw!r} is not a time of day; use HH:MM on a 24-hour clock, e.g. 09:00."
            )
        return dt.time(int(m.group(1)), int(m.group(2)))

    @field_validator("timezone", mode="before")
    @classmethod
    def _zone_name(cls, raw: Any) -> str | None:
        if raw is None or str(raw).lower() in ("", "machine", "local"):
            return None
        name = str(raw)
        try:
            if ".." in name or name.startswith("/"):  # a zone name, never a path
                raise ValueError
            ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"timezone {name!r} is not an IANA zone name; use one like Europe/Berlin, "
                "America/New_York or UTC."
            ) from None
        return name

    @field_validator("models", mode="before")
    @classmethod
    def _globs(cls, raw: Any) -> tuple[str, ...]:
        globs = raw if isinstance(raw, list | tuple) else str(raw).split(",")
        globs = tuple(str(g).strip() for g in globs if str(g).strip())
        if not globs:
            raise ValueError(
                'models is empty; give model-name globs separated by commas, e.g. "*:free,gpt-*" '
                'or "*" for every model.'
            )
        return globs

    @field_validator("ledger", mode="before")
    @classmethod
    def _ledger_url(cls, raw: Any) -> str:
        value = str(raw or "")
        scheme = value.split("://", 1)[0].lower() if "://" in value else ""
        if scheme and scheme not in (*REDIS_SCHEMES, "sqlite"):
            raise ValueError(
                f"ledger {scheme}:// is not supported; give a redis:// or redis+sentinel:// "
                "URL, a SQLite file path, or an empty value for the local default."
            )
        return value

    @model_validator(mode="after")
    def _reserve_within_limit(self, info) -> BudgetSettings:
        if not (info.context or {}).get(_ALONE) and self.chat_reserve > self.daily_limit:
            raise ValueError(
                f"chat_reserve ({self.chat_reserve}) is above daily_limit ({self.daily_limit}); "
                "lower chat_reserve or raise daily_limit first."
            )
        return self

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone or machine_zone())

    @property
    def background_cap(self) -> int:
        return max(0, self.daily_limit - self.chat_reserve)

    def shown(self, key: str) -> str:
        """A value as `set` takes it and `status` shows it."""
        value = getattr(self, key)
        if key == "reset":
            return value.strftime("%H:%M")
        if key == "models":
            return ",".join(value)
        if key == "job_limit":
            return "off" if value is None else str(value)
        if key == "timezone":
            return value or f"{machine_zone()} (machine zone)"
        if key == "ledger":
            return public_url(value) if value else "local SQLite"
        return str(value)

    @field_serializer("reset")
    def _hh_mm(self, value: dt.time) -> str:
        return value.strftime("%H:%M")

    def as_json(self) -> dict:
        """The keys that were set, as budget.json stores them."""
        return self.model_dump(mode="json", include=self.model_fields_set)


# Validating -----------------------------------------------------------------------------------


class _Refused(ConfigError):
    """A value refused, and the key it belongs to (None: a rule between keys)."""

    def __init__(self, line: str, key: str | None) -> None:
        super().__init__(line)
        self.key = key


def _validated(values: dict, *, alone: bool = False) -> BudgetSettings:
    """Settings from keys as `set` takes them or budget.json stores them; _Refused names the first
    problem."""
    values = {k: v.strip() if isinstance(v, str) else v for k, v in values.items()}
    try:
        return BudgetSettings.model_validate(values, context={_ALONE: alone})
    except ValidationError as exc:
        error = exc.errors()[0]
        key = str(error["loc"][0]) if error["loc"] else None
        raise _Refused(_one_line(key, error), key) from None


def _one_line(key: str | None, error: Any) -> str:
    """pydantic's error as the line the user reads: what is wrong and what to do."""
    kind, raw = error["type"], error["input"]
    if kind == "extra_forbidden":
        return f"Unknown setting {key!r}; the settings are: {', '.join(KEYS)}."
    if key in ("daily_limit", "chat_reserve", "job_limit") and kind != "greater_than_equal":
        return (
            f"{key} {raw!r} is not a whole number; give a number of requests, e.g. "
            f"hermes cron-budget set {key} 1000."
        )
    if kind == "greater_than_equal":
        return f"{key} must be at least {error['ctx']['ge']} (got {raw})."
    if kind == "literal_error":
        return (
            f"mode {raw!r} is not observe or enforce; observe records what would be held, "
            "enforce holds it."
        )
    if kind == "value_error":
        return str(error["ctx"]["error"])
    return f"{key} {raw!r} is not valid ({error['msg']}); see hermes cron-budget --help."


def parse_value(key: str, text: object):
    """One setting's value from text (or a JSON value from budget.json); ConfigError if bad."""
    return getattr(_validated({key: text}, alone=True), key)


def with_value(settings: BudgetSettings, key: str, text: object) -> BudgetSettings:
    return _validated({**settings.as_json(), key: text})


def from_mapping(values: dict, *, source: str = SETTINGS_FILE) -> BudgetSettings:
    """Settings from budget.json's keys; a bad key is named with its fix, and the file with both."""
    try:
        return _validated(values)
    except _Refused as exc:
        raise ConfigError(f"{source}: {_with_fix(exc)}") from None


def _with_fix(refused: _Refused) -> str:
    if refused.key is None:
        return str(refused)
    how = (
        f"remove {refused.key!r} from the file"
        if refused.key not in KEYS
        else f"fix it with: hermes cron-budget set {refused.key} VALUE"
    )
    return f"{str(refused).rstrip('.')}; {how}."


# Where things live ----------------------------------------------------------------------------


def root_home() -> Path:
    """The root Hermes home outside Hermes, resolved as hermes_constants.get_default_hermes_root
    does.

    ~/.hermes when HERMES_HOME is under it; `<root>` when HERMES_HOME is `<root>/profiles/<name>`;
    else HERMES_HOME itself; ~/.hermes when it is unset. Inside Hermes the plugin asks Hermes.
    """
    native = Path.home() / ".hermes"
    env_home = os.environ.get("HERMES_HOME", "")
    if not env_home:
        return native
    env_path = Path(env_home)
    with contextlib.suppress(ValueError):
        env_path.resolve().relative_to(native.resolve())
        return native
    if env_path.parent.name == "profiles":
        return env_path.parent.parent
    return env_path


def budget_dir(root: Path | None = None) -> Path:
    """Where budget.json, the SQLite ledger and the fail-open warning live: shared by every
    profile."""
    return (root or root_home()) / "plugin-data" / "cron-budget"


def root_of(directory: Path) -> Path:
    """The root Hermes home a budget directory belongs to (budget_dir's inverse); a directory
    that is not `<root>/plugin-data/cron-budget` stands for itself."""
    if directory.parent.name == "plugin-data":
        return directory.parent.parent
    return directory


def absolute_ledger(value: str, root: Path) -> str:
    """A ledger location with a relative SQLite path made absolute against the root Hermes home
    (`~` is the user's home); URLs of Redis and absolute paths are kept as given."""
    if not value or "://" in value and not value.lower().startswith("sqlite://"):
        return value
    parsed = parse_ledger_url(value)
    if not isinstance(parsed, SqliteUrl) or parsed.path.is_absolute():
        return value
    return str(root / parsed.path)


def ledger_location(settings: BudgetSettings, directory: Path) -> str:
    """HERMES_BULK_BUDGET_LEDGER, else the `ledger` setting, else ledger.db in the budget dir;
    a relative SQLite path is taken against the root Hermes home."""
    env = os.environ.get(LEDGER_ENV, "").strip()
    if env:
        parse_value("ledger", env)
        return absolute_ledger(env, root_of(directory))
    return absolute_ledger(settings.ledger, root_of(directory)) or str(directory / LEDGER_FILE)


def _stamp(path: str) -> tuple[int, int] | None:
    with contextlib.suppress(OSError):
        st = os.stat(path, follow_symlinks=False)
        return st.st_ino, st.st_mtime_ns
    return None


ZONE_NAME_FILE = "/etc/timezone"  # Debian's zone name
LOCALTIME_FILE = "/etc/localtime"  # a link into the zoneinfo tree
_machine_zone_seen: tuple[tuple, str] | None = None  # (what it was worked out from, the zone)


def machine_zone() -> str:
    """The machine's IANA zone name: $TZ, /etc/timezone, the /etc/localtime link; else UTC.

    Every admission asks (a window opens at a local time), so the answer is kept until $TZ or
    either file changes: two stat calls instead of a read, a realpath and a zone lookup.
    """
    global _machine_zone_seen
    basis = (os.environ.get("TZ"), _stamp(ZONE_NAME_FILE), _stamp(LOCALTIME_FILE))
    seen = _machine_zone_seen
    if seen is not None and seen[0] == basis:
        return seen[1]
    zone = _read_machine_zone()
    _machine_zone_seen = (basis, zone)
    return zone


def _read_machine_zone() -> str:
    candidates = [os.environ.get("TZ", "").lstrip(":")]
    with contextlib.suppress(OSError):
        candidates.append(Path(ZONE_NAME_FILE).read_text(encoding="utf-8").strip())
    with contextlib.suppress(OSError):
        target = os.path.realpath(LOCALTIME_FILE)
        if "zoneinfo/" in target:
            candidates.append(target.split("zoneinfo/", 1)[1])
    for name in candidates:
        if name and ".." not in name and not name.startswith("/"):
            with contextlib.suppress(ZoneInfoNotFoundError, ValueError):
                ZoneInfo(name)
                return name
    return "UTC"


# The file -------------------------------------------------------------------------------------


class SettingsFile:
    """budget.json in one directory: read it, or change one key under a lock."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / SETTINGS_FILE

    def exists(self) -> bool:
        return self.path.exists()

    def mtime_ns(self) -> int:
        try:
            return self.path.stat().st_mtime_ns
        except FileNotFoundError:
            return 0

    def load(self) -> BudgetSettings:
        return from_mapping(self._values(), source=str(self.path))

    def _values(self) -> dict:
        """The file's keys as stored ({} when there is no file), a relative ledger path made
        absolute (`set` stores it so; a file written otherwise may not); ConfigError when it is
        not JSON."""
        values = self._stored()
        if isinstance(values.get("ledger"), str):
            with contextlib.suppress(ConfigError):  # a bad ledger value is named by validation
                values["ledger"] = absolute_ledger(
                    values["ledger"].strip(), root_of(self.directory)
                )
        return values

    def _stored(self) -> dict:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise ConfigError(
                f"Cannot read {self.path} ({exc.strerror}); check its permissions."
            ) from None
        try:
            values = json.loads(text)
        except ValueError as exc:
            where = (
                f" ({exc.msg} at line {exc.lineno}, column {exc.colno})"
                if isinstance(exc, json.JSONDecodeError)
                else ""
            )
            raise ConfigError(
                f"{self.path} is not valid JSON{where}; fix it by hand, or delete it "
                f"(rm {self.path}) to start from the defaults and set your keys again."
            ) from None
        if not isinstance(values, dict):
            raise ConfigError(
                f"{self.path} is not a JSON object; fix it by hand, or delete it "
                f"(rm {self.path}) to start from the defaults and set your keys again."
            )
        return values

    def set(self, key: str, text: str) -> BudgetSettings:
        """Validate and store one key; returns the new settings.

        The other keys are taken as the file stores them, so setting a key whose stored value is
        bad repairs the file; a bad value of another key is named, with the command that fixes it.
        """
        with self._locked():
            values = self._values()
            parse_value(key, text)  # the new value alone, checked first
            values[key] = (
                absolute_ledger(text.strip(), root_of(self.directory)) if key == "ledger" else text
            )
            try:
                settings = _validated(values)
            except (
                _Refused
            ) as exc:  # a rule between keys is about the value just given: no file to name
                raise ConfigError(
                    str(exc) if exc.key is None else f"{self.path}: {_with_fix(exc)}"
                ) from None
            write_private(
                self.path, json.dumps(settings.as_json(), indent=2, sort_keys=True) + "\n"
            )
            return settings

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        private_dir(self.directory)
        fd = os.open(self.directory / (SETTINGS_FILE + ".lock"), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def describe() -> list[tuple[str, str, str]]:
    """(key, default, meaning) for help texts; the table of docs/cron-budget.md says the same."""
    meaning = {
        "mode": "observe records what would be held; enforce holds it",
        "daily_limit": "provider requests per window, every profile (and machine) together",
        "chat_reserve": "requests kept for chat: cron and bulk stop at daily_limit - chat_reserve",
        "job_limit": "requests one cron job may make per window (off: no cap)",
        "reset": "local time (HH:MM) at which the provider's window reopens",
        "timezone": "IANA zone name of reset, e.g. Europe/Berlin",
        "models": "comma-separated model-name globs that count (others are recorded, not counted)",
        "ledger": "empty: SQLite beside budget.json; a path (relative: to the root Hermes home); "
        "a redis:// URL shares it between machines",
    }
    defaults = BudgetSettings()
    return [
        (key, defaults.shown(key) if key != "timezone" else "machine zone", meaning[key])
        for key in KEYS
    ]
