"""What a backend URL names: `sqlite:///path` or `redis[s]://…`, parsed and checked in one place.

The job store with its queues (fleet/broker.py) and the budget ledger (budget/ledger.py) are each
found by such a URL. Both turn it into a `SqliteUrl` or a `RedisUrl` here, so the scheme dispatch,
the path rules, the Redis URL checks and the key prefix are decided once; the openers take the
result. Every URL parsed here is registered with redact.py first: an error or a log line may quote
it, password and all."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..errors import ConfigError
from ..redact import register_url

BACKEND_SETTING = "HERMES_BULK_BACKEND"
LEDGER_SETTING = "ledger"  #: the cron-budget setting, as its scheme and path messages name it
LEDGER_REDIS_SETTING = "the cron-budget ledger setting"  #: as its Redis messages name it
REDIS_SCHEMES = ("redis", "rediss")
DEFAULT_PREFIX = "hermes-bulk"
URL_SHAPE = "redis://[[user]:password@]host[:port][/db][?prefix=name]"
#: Query options that need TLS, and ssl_cert_reqs' values (redis-py passes them to ssl).
_TLS_OPTIONS = (
    "ssl_cert_reqs",
    "ssl_ca_certs",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_check_hostname",
    "ssl_ca_path",
    "ssl_ca_data",
    "ssl_password",
    "ssl_min_version",
    "ssl_ciphers",
)
_CERT_REQS = ("none", "optional", "required")


@dataclass(frozen=True)
class SqliteUrl:
    """A SQLite file (the store's bulk.db, or a ledger)."""

    path: Path

    @property
    def queue_path(self) -> Path:
        """The file of the store's Huey queues, beside it: bulk.db -> bulk-queue.db."""
        return self.path.with_name(self.path.stem + "-queue.db")


@dataclass(frozen=True)
class RedisUrl:
    """A Redis server, database and key prefix."""

    client_url: str  # what redis-py reads: the URL given, without prefix=
    prefix: str
    host: str
    port: int
    database: str  # the path's database number; "" for redis-py's default
    setting: str  # where the URL came from, for messages

    @property
    def where(self) -> str:
        """host:port, for messages (never credentials)."""
        return f"{self.host}:{self.port}"


def parse_backend_url(url: str) -> SqliteUrl | RedisUrl:
    """The store's backend (HERMES_BULK_BACKEND): sqlite:///path or redis[s]://…"""
    register_url(url)
    scheme = _scheme(url)
    if scheme == "sqlite":
        return SqliteUrl(_sqlite_path(url, BACKEND_SETTING, "bulk.db"))
    if scheme in REDIS_SCHEMES:
        return parse_redis_url(url, BACKEND_SETTING)
    raise ConfigError(
        f"Invalid setting {BACKEND_SETTING}: unknown scheme {scheme!r}; use sqlite:// or redis://."
    )


def parse_ledger_url(location: str) -> SqliteUrl | RedisUrl:
    """The budget ledger's location: a SQLite file path, sqlite:///path, or redis[s]://…"""
    register_url(location)
    if "://" not in location:
        return SqliteUrl(Path(location).expanduser())
    scheme = _scheme(location)
    if scheme in REDIS_SCHEMES:
        return parse_redis_url(location, LEDGER_REDIS_SETTING)
    if scheme in ("", "sqlite"):
        return SqliteUrl(_sqlite_path(location, LEDGER_SETTING, "ledger.db"))
    raise ConfigError(
        f"Invalid setting {LEDGER_SETTING}: {scheme}:// is not a ledger location; use a SQLite "
        "file path or a redis:// URL."
    )


def _scheme(url: str) -> str:
    return url.split("://", 1)[0].lower()


def _sqlite_path(url: str, setting: str, example: str) -> Path:
    """The file of a sqlite:// URL: three slashes and a relative path, or four and an absolute
    one."""
    parts = urlsplit(url)
    raw = parts.path[1:] if parts.path.startswith("/") else parts.path
    if parts.netloc or not raw:
        raise ConfigError(f"Invalid setting {setting}: {url!r} is not sqlite:///path/to/{example}.")
    return Path(raw).expanduser()


def parse_redis_url(url: str, setting: str) -> RedisUrl:
    """A redis:// or rediss:// URL with an optional `prefix=`, or a one-line ConfigError saying what
    is wrong. redis-py reads the rest: username and password, db number, TLS for rediss://.

    Checked here, before redis-py sees the URL: a broken IPv6 host or a port past 65535 raised
    ValueError deep inside it, a database that is not a number was silently taken as 0, and
    TLS options on redis:// raised TypeError at the first command.
    """

    def bad(what: str) -> ConfigError:
        return ConfigError(f"Invalid setting {setting}: {what}.")

    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        if "port" in str(exc).lower():
            raise bad("the Redis port must be a whole number from 1 to 65535") from None
        raise bad(f"not a valid URL ({exc}; {URL_SHAPE})") from None
    if port == 0 or (port is None and parts.netloc.endswith(":")):
        raise bad("the Redis port must be a whole number from 1 to 65535")
    if not parts.hostname:  # redis-py would quietly take localhost: say which server is meant
        raise bad(
            f"the URL names no Redis host; write it, e.g. redis://localhost:6379/0 ({URL_SHAPE})"
        )
    query = parse_qsl(parts.query, keep_blank_values=True)
    databases = [parts.path.strip("/")] + [v for k, v in query if k == "db"]
    for db in databases:
        if db and not (db.isascii() and db.isdigit()):
            raise bad(f"the database {db!r} is not a number; use /0, /1, … ({URL_SHAPE})")
    tls = parts.scheme.lower() == "rediss"
    for key, value in query:
        if key in _TLS_OPTIONS and not tls:
            raise bad(f"{key} needs TLS; use rediss:// or drop it")
        if key == "ssl_cert_reqs" and value.lower() not in _CERT_REQS:
            raise bad(f"ssl_cert_reqs={value!r}; use one of {', '.join(_CERT_REQS)}")
    prefixes = [v for k, v in query if k == "prefix"]
    prefix = prefixes[-1] if prefixes else DEFAULT_PREFIX
    if not prefix or any(c in prefix for c in "{} \t\r\n*?[]"):
        raise bad(f"prefix={prefix!r}; use letters, digits, '-', '_', '.' or ':'")
    client_url = urlunsplit(
        parts._replace(query=urlencode([(k, v) for k, v in query if k != "prefix"]))
    )
    return RedisUrl(
        client_url=client_url,
        prefix=prefix,
        host=parts.hostname or "localhost",
        port=port or 6379,
        database=parts.path.strip("/"),
        setting=setting,
    )
