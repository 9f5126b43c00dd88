"""The budget's settings: defaults, validation, and `budget.json` next to the ledger.

Every profile and every process reads the same file, `<root Hermes home>/plugin-data/
cron-budget/budget.json`, which holds only the keys someone set (an unset timezone keeps
following the machine's zone). `set` validates one key at a time and writes the file whole
and atomically under a lock, so two `set`s at once cannot lose one another. A bad value is
one line that says what to do (ConfigError).

The ledger's location is the `ledger` key, overridden by HERMES_BULK_BUDGET_LEDGER: empty means
the SQLite file `ledger.db` beside budget.json; a redis:// or rediss:// URL shares the ledger
between machines (each machine keeps its own budget.json, so give them the same settings).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..errors import ConfigError
from ..files import private_dir, write_private
from ..redact import public_url
from .policy import ENFORCE, OBSERVE

SETTINGS_FILE = "budget.json"
LEDGER_FILE = "ledger.db"
LEDGER_ENV = "HERMES_BULK_BUDGET_LEDGER"
KEYS = ("mode", "daily_limit", "chat_reserve", "job_limit", "reset", "timezone", "models", "ledger")

_TIME = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)$")


@dataclass(frozen=True)
class BudgetSettings:
    """What the budget is told. `timezone` None follows the machine's zone."""

    mode: str = OBSERVE
    daily_limit: int = 1000  # provider requests per window, every profile together
    chat_reserve: int = 300  # requests kept for chat: background work stops at the difference
    job_limit: int | None = None  # requests one cron job may make per window
    reset: dt.time = dt.time(0, 0)  # local time at which the provider's window reopens
    timezone: str | None = None
    models: tuple[str, ...] = ("*",)  # model-name globs that count
    ledger: str = ""  # "" = SQLite beside budget.json; or a redis:// URL
    explicit: frozenset[str] = field(default=frozenset(), compare=False)  # keys set in the file

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
            return redacted(value) if value else "local SQLite"
        return str(value)

    def as_json(self) -> dict:
        """The keys that were set, as budget.json stores them."""
        return {key: stored_value(key, getattr(self, key)) for key in sorted(self.explicit)}


def stored_value(key: str, value):
    """A parsed value as budget.json stores it."""
    return value.strftime("%H:%M") if key == "reset" else list(value) if key == "models" else value


# Parsing one key ------------------------------------------------------------------------------


def _whole(key: str, text: str, *, minimum: int) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ConfigError(f"{key} {text!r} is not a whole number; give a number of requests, e.g. "
                          f"hermes cron-budget set {key} 1000.") from None
    if value < minimum:
        raise ConfigError(f"{key} must be at least {minimum} (got {value}).")
    return value


def parse_value(key: str, text: object):
    """One setting's value from text (or a JSON value from budget.json); ConfigError if bad."""
    parser = _PARSERS.get(key)
    if parser is None:
        raise ConfigError(f"Unknown setting {key!r}; the settings are: {', '.join(KEYS)}.")
    return parser(text.strip() if isinstance(text, str) else text)


def _mode(raw):
    if raw not in (OBSERVE, ENFORCE):
        raise ConfigError(f"mode {raw!r} is not observe or enforce; observe records what would be held, "
                          "enforce holds it.")
    return raw


def _job_limit(raw):
    if raw is None or str(raw).lower() in ("off", "none", ""):
        return None
    return _whole("job_limit", raw, minimum=1)


def _reset(raw):
    m = _TIME.match(str(raw))
    if not m:
        raise ConfigError(f"reset {raw!r} is not a time of day; use HH:MM on a 24-hour clock, e.g. 09:00.")
    return dt.time(int(m.group(1)), int(m.group(2)))


def _timezone(raw):
    if raw is None or str(raw).lower() in ("", "machine", "local"):
        return None
    return _zone_name(str(raw))


def _models(raw):
    globs = raw if isinstance(raw, list) else str(raw).split(",")
    globs = tuple(str(g).strip() for g in globs if str(g).strip())
    if not globs:
        raise ConfigError('models is empty; give model-name globs separated by commas, e.g. "*:free,gpt-*" '
                          'or "*" for every model.')
    return globs


def _ledger(raw):
    value = str(raw or "")
    scheme = value.split("://", 1)[0].lower() if "://" in value else ""
    if scheme and scheme not in ("redis", "rediss", "sqlite"):
        raise ConfigError(f"ledger {scheme}:// is not supported; give a redis:// URL, a SQLite file path, "
                          "or an empty value for the local default.")
    return value


_PARSERS = {
    "mode": _mode,
    "daily_limit": lambda raw: _whole("daily_limit", raw, minimum=1),
    "chat_reserve": lambda raw: _whole("chat_reserve", raw, minimum=0),
    "job_limit": _job_limit,
    "reset": _reset,
    "timezone": _timezone,
    "models": _models,
    "ledger": _ledger,
}


def _zone_name(name: str) -> str:
    try:
        if ".." in name or name.startswith("/"):
            raise ValueError
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(f"timezone {name!r} is not an IANA zone name; use one like Europe/Berlin, "
                          "America/New_York or UTC.") from None
    return name


def check(settings: BudgetSettings) -> BudgetSettings:
    """The rules between keys."""
    if settings.chat_reserve > settings.daily_limit:
        raise ConfigError(f"chat_reserve ({settings.chat_reserve}) is above daily_limit ({settings.daily_limit}); "
                          "lower chat_reserve or raise daily_limit first.")
    return settings


def with_value(settings: BudgetSettings, key: str, text: object) -> BudgetSettings:
    value = parse_value(key, text)
    return check(replace(settings, **{key: value}, explicit=settings.explicit | {key}))


def from_mapping(values: dict, *, source: str = SETTINGS_FILE) -> BudgetSettings:
    settings = _parsed(values, source)
    try:
        return check(settings)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _parsed(values: dict, source: str) -> BudgetSettings:
    """Each key parsed, not yet checked against the others; a bad key is named with its fix."""
    settings = BudgetSettings()
    for key, value in values.items():
        try:
            settings = replace(settings, **{key: parse_value(key, value)}, explicit=settings.explicit | {key})
        except ConfigError as exc:
            how = (f"remove {key!r} from the file" if key not in KEYS
                   else f"fix it with: hermes cron-budget set {key} VALUE")
            raise ConfigError(f"{source}: {str(exc).rstrip('.')}; {how}.") from None
    return settings


# Where things live ----------------------------------------------------------------------------


def root_home() -> Path:
    """The root Hermes home outside Hermes, resolved as hermes_constants.get_default_hermes_root does.

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
    """Where budget.json, the SQLite ledger and the fail-open warning live: shared by every profile."""
    return (root or root_home()) / "plugin-data" / "cron-budget"


def ledger_location(settings: BudgetSettings, directory: Path) -> str:
    """HERMES_BULK_BUDGET_LEDGER, else the `ledger` setting, else ledger.db in the budget dir."""
    env = os.environ.get(LEDGER_ENV, "").strip()
    if env:
        parse_value("ledger", env)
        return env
    return settings.ledger or str(directory / LEDGER_FILE)


def redacted(location: str) -> str:
    """A ledger location fit to print: a URL's password is masked (redact.public_url)."""
    return public_url(location) if "://" in location else location


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
        """The file's keys as stored ({} when there is no file); ConfigError when it is not JSON."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise ConfigError(f"Cannot read {self.path} ({exc.strerror}); check its permissions.") from None
        try:
            values = json.loads(text)
        except ValueError as exc:
            where = f" ({exc.msg} at line {exc.lineno}, column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
            raise ConfigError(f"{self.path} is not valid JSON{where}; fix it by hand, or delete it "
                              f"(rm {self.path}) to start from the defaults and set your keys again.") from None
        if not isinstance(values, dict):
            raise ConfigError(f"{self.path} is not a JSON object; fix it by hand, or delete it "
                              f"(rm {self.path}) to start from the defaults and set your keys again.")
        return values

    def set(self, key: str, text: str) -> BudgetSettings:
        """Validate and store one key; returns the new settings.

        The other keys are taken as the file stores them, so setting a key whose stored value is
        bad repairs the file; a bad value of another key is named, with the command that fixes it.
        """
        with self._locked():
            values = self._values()
            values[key] = stored_value(key, parse_value(key, text))  # the new value alone, checked first
            settings = check(_parsed(values, str(self.path)))
            write_private(self.path, json.dumps(settings.as_json(), indent=2, sort_keys=True) + "\n")
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
    """(key, default, meaning) for help texts and the README table."""
    meaning = {
        "mode": "observe records what would be held; enforce holds it",
        "daily_limit": "provider requests per window, every profile (and machine) together",
        "chat_reserve": "requests kept for chat: cron and bulk stop at daily_limit - chat_reserve",
        "job_limit": "requests one cron job may make per window (off: no cap)",
        "reset": "local time (HH:MM) at which the provider's window reopens",
        "timezone": "IANA zone name of reset, e.g. Europe/Berlin",
        "models": "comma-separated model-name globs that count (others are recorded, not counted)",
        "ledger": "empty: SQLite beside budget.json; a redis:// URL shares it between machines",
    }
    defaults = BudgetSettings()
    return [(f.name, defaults.shown(f.name) if f.name != "timezone" else "machine zone", meaning[f.name])
            for f in fields(BudgetSettings) if f.name in KEYS]
