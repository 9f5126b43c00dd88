"""What a backend URL names: `sqlite:///path`, `redis[s]://…` or `redis[s]+sentinel://…`, parsed
and checked in one place.

The job store with its queues (fleet/broker.py) and the budget ledger (budget/ledger.py) are each
found by such a URL. Both turn it into a `SqliteUrl` or a `RedisUrl` here, so the scheme dispatch,
the path rules, the Redis URL checks and the key prefix are decided once; the openers take the
result. Every URL parsed here is registered with redact.py first: an error or a log line may quote
it, password and all."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from ..errors import ConfigError
from ..redact import register_url

BACKEND_SETTING = "HERMES_BULK_BACKEND"
LEDGER_SETTING = "ledger"  #: the cron-budget setting, as its scheme and path messages name it
LEDGER_REDIS_SETTING = "the cron-budget ledger setting"  #: as its Redis messages name it
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
REDIS_SCHEMES = ("redis", "rediss", *SENTINEL_SCHEMES)
DEFAULT_PREFIX = "hermes-bulk"
URL_SHAPE = "redis://[[user]:password@]host[:port][/db][?prefix=name]"
SENTINEL_SHAPE = "redis+sentinel://[[user]:password@]host[:port][,host[:port]…]/service[/db]"
SENTINEL_PORT = 26379  #: Sentinel's own port, when a host of the list names none
#: Query options read here, never passed on to redis-py.
_SENTINEL_OPTIONS = ("sentinel_username", "sentinel_password")
_WAIT_OPTIONS = ("wait_replicas", "wait_timeout_ms")
#: WAIT's defaults (store/redis/durability.py): for 1 replica when the primary has one, 1 s.
DEFAULT_WAIT_TIMEOUT_MS = 1000
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
    """A Redis server (or a Sentinel service), database and key prefix."""

    client_url: str  # what redis-py reads: the URL given, without prefix=, wait_… and sentinel_…
    prefix: str
    host: str
    port: int
    database: str  # the path's database number; "" for redis-py's default
    setting: str  # where the URL came from, for messages
    #: redis+sentinel://: the Sentinels asked for the primary, and the service they know it by;
    #: client_url then names the first Sentinel, and carries the primary's credentials and TLS.
    sentinels: tuple[tuple[str, int], ...] = ()
    service: str = ""
    sentinel_username: str | None = field(default=None, repr=False)
    sentinel_password: str | None = field(default=None, repr=False)
    #: WAIT after the writes a user is told about: replicas to wait for (None: 1 when the
    #: primary has a replica, else none; 0: never), and for how long at most.
    wait_replicas: int | None = None
    wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS

    @property
    def where(self) -> str:
        """host:port, or the Sentinel service and its Sentinels, for messages (never
        credentials)."""
        if self.sentinels:
            hosts = ",".join(_host_port(h, p) for h, p in self.sentinels)
            return f"{self.service} (Sentinels {hosts})"
        return f"{self.host}:{self.port}"


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_backend_url(url: str) -> SqliteUrl | RedisUrl:
    """The store's backend (HERMES_BULK_BACKEND): sqlite:///path or redis[s]://…"""
    register_url(url)
    scheme = _scheme(url)
    if scheme == "sqlite":
        return SqliteUrl(_sqlite_path(url, BACKEND_SETTING, "bulk.db"))
    if scheme in REDIS_SCHEMES:
        return parse_redis_url(url, BACKEND_SETTING)
    raise ConfigError(
        f"Invalid setting {BACKEND_SETTING}: unknown scheme {scheme!r}; use sqlite://, redis:// "
        "or redis+sentinel://."
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
    redis+sentinel:// and rediss+sentinel:// go to parse_sentinel_url.

    Checked here, before redis-py sees the URL: redis-py raises ValueError deep inside for a
    broken IPv6 host or a port past 65535, takes a database that is not a number as 0 without a
    word, and raises TypeError at the first command for TLS options on redis://.
    """

    if _scheme(url) in SENTINEL_SCHEMES:
        return parse_sentinel_url(url, setting)

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
    _check_databases([parts.path.strip("/")], query, bad, URL_SHAPE)
    _check_tls(query, parts.scheme.lower() == "rediss", bad, "rediss://")
    if any(k in _SENTINEL_OPTIONS for k, _ in query):
        raise bad("sentinel_… options need a redis+sentinel:// URL; drop them")
    client_url = urlunsplit(parts._replace(query=urlencode(_client_query(query))))
    return RedisUrl(
        client_url=client_url,
        prefix=_prefix(query, bad),
        host=parts.hostname or "localhost",
        port=port or 6379,
        database=parts.path.strip("/"),
        setting=setting,
        **_wait_options(query, bad),
    )


def parse_sentinel_url(url: str, setting: str) -> RedisUrl:
    """redis+sentinel://[[user]:password@]host[:port][,host[:port]…]/service[/db][?options]
    (the form the redis-sentinel-url package reads; rediss+sentinel:// for TLS, to the Sentinels
    and to Redis alike). The password is the Redis primary's; `sentinel_password=` (and
    `sentinel_username=`) the Sentinels' own, when they have one. A host without a port is on
    Sentinel's 26379."""

    def bad(what: str) -> ConfigError:
        return ConfigError(f"Invalid setting {setting}: {what}.")

    parts = urlsplit(url)
    userinfo, at, hostlist = parts.netloc.rpartition("@")
    sentinels = tuple(_sentinel_address(entry, bad) for entry in hostlist.split(","))
    segments = parts.path.strip("/").split("/") if parts.path.strip("/") else []
    if not segments or len(segments) > 2:
        raise bad(f"name the Sentinel service and at most a database after it ({SENTINEL_SHAPE})")
    service, database = segments[0], segments[1] if len(segments) == 2 else ""
    query = parse_qsl(parts.query, keep_blank_values=True)
    _check_databases([database], query, bad, SENTINEL_SHAPE)
    tls = parts.scheme.lower() == "rediss+sentinel"
    _check_tls(query, tls, bad, "rediss+sentinel://")
    options = {k: v for k, v in query if k in _SENTINEL_OPTIONS}
    host, port = sentinels[0]
    netloc = f"{userinfo}{at}{_host_port(host, port)}"
    client_url = urlunsplit(
        ("rediss" if tls else "redis", netloc, f"/{database}", urlencode(_client_query(query)), "")
    )
    return RedisUrl(
        client_url=client_url,
        prefix=_prefix(query, bad),
        host=host,
        port=port,
        database=database,
        setting=setting,
        sentinels=sentinels,
        service=unquote(service),
        sentinel_username=options.get("sentinel_username") or None,
        sentinel_password=options.get("sentinel_password") or None,
        **_wait_options(query, bad),
    )


def _sentinel_address(entry: str, bad) -> tuple[str, int]:
    """One host[:port] of a Sentinel list; [v6]:port for IPv6."""
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else rest
    else:
        host, _, port_text = entry.rpartition(":") if ":" in entry else (entry, "", "")
    if not host:
        raise bad(f"a Sentinel host is missing in {entry!r} ({SENTINEL_SHAPE})")
    if not port_text:
        return host, SENTINEL_PORT
    if not (port_text.isascii() and port_text.isdigit()) or not 0 < int(port_text) < 65536:
        raise bad("the Sentinel port must be a whole number from 1 to 65535")
    return host, int(port_text)


def _check_databases(paths: list[str], query: list[tuple[str, str]], bad, shape: str) -> None:
    for db in paths + [v for k, v in query if k == "db"]:
        if db and not (db.isascii() and db.isdigit()):
            raise bad(f"the database {db!r} is not a number; use /0, /1, … ({shape})")


def _check_tls(query: list[tuple[str, str]], tls: bool, bad, scheme: str) -> None:
    for key, value in query:
        if key in _TLS_OPTIONS and not tls:
            raise bad(f"{key} needs TLS; use {scheme} or drop it")
        if key == "ssl_cert_reqs" and value.lower() not in _CERT_REQS:
            raise bad(f"ssl_cert_reqs={value!r}; use one of {', '.join(_CERT_REQS)}")


def _prefix(query: list[tuple[str, str]], bad) -> str:
    prefixes = [v for k, v in query if k == "prefix"]
    prefix = prefixes[-1] if prefixes else DEFAULT_PREFIX
    if not prefix or any(c in prefix for c in "{} \t\r\n*?[]"):
        raise bad(f"prefix={prefix!r}; use letters, digits, '-', '_', '.' or ':'")
    return prefix


def _client_query(query: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The query options redis-py reads: all but ours."""
    ours = ("prefix", *_SENTINEL_OPTIONS, *_WAIT_OPTIONS)
    return [(k, v) for k, v in query if k not in ours]


def _wait_options(query: list[tuple[str, str]], bad) -> dict:
    """wait_replicas= (0 to 16) and wait_timeout_ms= (1 to 60000)."""
    found = dict(query)
    out: dict = {}
    for key, low, high in (("wait_replicas", 0, 16), ("wait_timeout_ms", 1, 60_000)):
        if key not in found:
            continue
        text = found[key]
        if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
            raise bad(f"{key}={text!r}; use a whole number from {low} to {high}")
        out[key] = int(text)
    return out
