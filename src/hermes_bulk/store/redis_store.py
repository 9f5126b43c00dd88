"""The fleet backend's store and limiter: one Redis, shared by every worker on every machine.

Every state change of one job is one Lua script (`redis_lua/<operation>.lua`, each opening with
its KEYS and ARGV), so N workers on M machines see each operation whole; store/protocol.py says,
method by method, which operations take more than one step here and what an interruption leaves. Scripts read the clock with
Redis TIME, so machines with skewed clocks agree on leases, pauses and pacing. Semantics
mirror store/sqlite.py; store/protocol.py is the contract.

Key schema (P is the URL's `prefix=`, default `hermes-bulk`; times are float ms since the epoch).

One job's keys share the hash tag {P:job:ID}, so each job's script touches one cluster slot:

    {P:job:ID}:meta      HASH  spec (JSON), state, pause_reason, max_tokens, concurrency, the
                               counters of JobRecord, created_at_ms, last_claim_at_ms,
                               run_at_ms, run_epoch, max_index, skipped_events
    {P:job:ID}:items     HASH  index -> "<estimate>\\t<content_hash>\\t<JSON [name, origin,
                               offset, stat_sig]>", written once (scripts read the first two
                               fields without decoding the rest)
    {P:job:ID}:states    HASH  index -> JSON {s status, a attempts, w 429 waits, r reserved,
                               ti/to tokens, et/hs/em error, pv provider, md model}; absent
                               means a fresh pending item (a million-item job costs nothing here
                               until items move)
    {P:job:ID}:contents  HASH  content_hash -> text: identical contents are stored once per job
    {P:job:ID}:results   HASH  index -> result text
    {P:job:ID}:pending   ZSET  pending indexes scored by index: claiming the lowest is O(log n)
    {P:job:ID}:leases    ZSET  running indexes scored by lease expiry
    {P:job:ID}:owners    HASH  running index -> worker id (at most the job's concurrency)
    {P:job:ID}:failed    ZSET  failed indexes scored by index (retry_failed)
    {P:job:ID}:events    LIST  "<at_ms>\\t<JSON [kind, message, index, error_type,
                               http_status]>"; only the newest EVENTS_KEPT are kept

Across jobs:

    P:jobs:created           ZSET  job id scored by created_at_ms (list_jobs)
    P:jobs:ids               ZSET  job id, score 0 (find_job_ids: a lexicographic range)
    P:jobs:active            ZSET  job id scored by run epoch: every job that is running or may
                                   hold leases (a superset, pruned by release_expired_leases)
    {P:workers}              ZSET  worker id scored by expiry; PEXPIREs after its last entry
    {P:workers}:<worker id>  HASH  host, pid, started_at, heartbeat_at_ms, threads; PEXPIRE ttl
    {P:limit:<provider key>} HASH  request_tat_ms, token_tat_ms, pause_until_ms, backoff_step,
                                   auto_interval_ms, auto_since_ms, window_start_ms, window_count,
                                   previous_count;
                                   expires LIMIT_IDLE_KEEP_MS after its pacing and wait are over
    huey.{redis,schedule,results,counters}.P.<queue>   Huey's own (RedisHuey, results off); one
                                   <queue> per kind of model client (broker.queue_name)

delete_job removes all ten keys of a job and its index entries. The cross-job indexes are
updated outside the job's scripts (so each script stays in one slot), in the same MULTI/EXEC
as the script for begin_job, delete_job and set_state (this backend is for one Redis, not a
Cluster: a MULTI spans slots), and in an order that keeps each index a superset of what it
must list: a job is indexed before its keys exist (and before it runs) and unindexed with
them; readers skip entries whose job is missing or still being created. The active-jobs
index is pruned by run epoch (prune_active.lua), so a job run again while it is being pruned
stays listed. Operations the SQLite store does in one statement across jobs
(release_expired_leases, release_worker_items, renew_leases, item_owners, live_workers'
holdings) run one atomic script per job on that index, pipelined; retry_failed is atomic per
RETRY_BATCH_ITEMS items. No credentials are ever written to Redis.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from importlib import resources
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from huey import RedisHuey

from ..errors import BackendUnavailable, ConfigError
from . import limits_math
from .protocol import (
    CLAIMED,
    COMPLETED,
    CREATING,
    FAILED,
    NOT_STARTED,
    PAUSE_TOKEN_LIMIT,
    PAUSED,
    PENDING,
    RUNNING,
    Claim,
    ClaimRefused,
    Event,
    ItemError,
    ItemRecord,
    JobRecord,
    JobSpec,
    NewItem,
    PauseState,
    Turn,
    Usage,
    WorkerInfo,
    spec_from_json,
)

DEFAULT_PREFIX = "hermes-bulk"

#: Events kept per job (the newest); a million-item job cannot grow its history without bound.
EVENTS_KEPT = 10_000
#: A provider key's pacing and backoff state is kept this long after it was last needed.
LIMIT_IDLE_KEEP_MS = 86_400_000
#: Items per add_items script call, and the content bytes one call may carry.
ADD_BATCH_ITEMS = 1000
ADD_BATCH_BYTES = 8 * 1024 * 1024
#: Failed items returned to pending per retry_failed script call (Redis stays responsive).
RETRY_BATCH_ITEMS = 1000
#: Job ids read per round trip when walking an index.
INDEX_PAGE = 200
#: At most this many ids from find_job_ids (as the SQLite store).
FIND_LIMIT = 10

#: Connecting must fail fast when Redis is down; reads may wait on a busy server. Keep
#: socket_timeout well above RedisHuey's 1 s BRPOP, or popped tasks are lost
#: (reference/huey-probe.md §6).
CONNECT_TIMEOUT_S = 5.0
SOCKET_TIMEOUT_S = 30.0
#: PING a pooled connection idle this long before reusing it.
HEALTH_CHECK_INTERVAL_S = 30

# Scripts that take a job's ten keys and get the job helpers (_job.lua) prepended.
_JOB_SCRIPTS = ("begin_job", "add_items", "finish_job", "delete_job", "add_events", "set_state",
                "retry_failed", "claim_item", "complete_item", "fail_item", "release_item",
                "record_attempt", "renew_leases", "release_expired", "release_worker_items")
_OTHER_SCRIPTS = ("prune_active", "heartbeat", "acquire", "pause", "clear_backoff")
_JOB_KEY_SUFFIXES = ("meta", "items", "states", "contents", "results", "pending", "leases",
                     "owners", "failed", "events")


# Connection -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RedisConnection:
    """A pool for one Redis URL, its key prefix, and where it points (for messages)."""

    pool: redis.ConnectionPool
    client: redis.Redis
    prefix: str
    where: str  # host:port, never credentials
    setting: str = "HERMES_BULK_BACKEND"  # what messages tell the user to check

    def unavailable(self, exc: Exception, *, lost: bool = True) -> BackendUnavailable:
        """The one-line, credential-free error for a Redis that cannot be used."""
        if isinstance(exc, redis.AuthenticationError):
            return BackendUnavailable(
                f"Redis at {self.where} did not accept the credentials (authentication failed or "
                f"required); check the username and password in {self.setting}.")
        what = "Lost the connection to" if lost else "Cannot reach"
        return BackendUnavailable(f"{what} Redis at {self.where} ({self._reason(exc)}). Start it, or "
                                  "use the sqlite:// backend for a single machine.")

    def _reason(self, exc: Exception) -> str:
        """A few words on why: redis-py's "Error 111 connecting to host:port. Connection refused."
        ends with the reason; anything else is named by its type only."""
        if isinstance(exc, redis.TimeoutError):
            return "timed out"
        text, marker = str(exc), f"{self.where}. "
        if marker in text:
            return text.split(marker, 1)[1].rstrip(".").lower()[:80]
        return type(exc).__name__

    @functools.cached_property
    def lua(self) -> _Scripts:
        return _Scripts(self.client)

    def close(self) -> None:
        self.pool.disconnect()


def connect_redis(url: str, *, connect_timeout_s: float = CONNECT_TIMEOUT_S,
                  socket_timeout_s: float = SOCKET_TIMEOUT_S,
                  setting: str = "HERMES_BULK_BACKEND") -> RedisConnection:
    """A pinged connection pool for a redis:// or rediss:// URL with an optional `prefix=`.

    redis-py reads the rest of the URL: username and password, db number, TLS for rediss://.
    Raises BackendUnavailable naming host:port (never the password) when Redis cannot be used.
    `setting` names where the URL came from, for messages (the budget ledger has its own).
    """
    parts, query, host, port = _checked_url(url, setting)
    prefixes = [v for k, v in query if k == "prefix"]
    prefix = prefixes[-1] if prefixes else DEFAULT_PREFIX
    if not prefix or any(c in prefix for c in "{} \t\r\n*?[]"):
        raise ConfigError(f"Invalid setting {setting}: prefix={prefix!r}; use letters, "
                          "digits, '-', '_', '.' or ':'.")
    clean_url = urlunsplit(parts._replace(query=urlencode([(k, v) for k, v in query if k != "prefix"])))
    try:
        # No retries: a script whose reply was lost must not run a second time (a claim would
        # take a second item). A stale pooled connection is replaced at checkout instead.
        pool = redis.ConnectionPool.from_url(
            clean_url, socket_connect_timeout=connect_timeout_s, socket_timeout=socket_timeout_s,
            health_check_interval=HEALTH_CHECK_INTERVAL_S)
    except (ValueError, TypeError):
        raise ConfigError(f"Invalid setting {setting}: not a redis:// or rediss:// URL "
                          f"({URL_SHAPE}).") from None
    conn = RedisConnection(pool=pool, client=redis.Redis(connection_pool=pool), prefix=prefix,
                           where=f"{host}:{port}", setting=setting)
    try:
        conn.client.ping()
    except redis.ResponseError as exc:
        pool.disconnect()
        if "DB index is out of range" in str(exc):
            raise ConfigError(f"Invalid setting {setting}: database {parts.path.strip('/')} is out of range for "
                              f"Redis at {conn.where} (it has databases 0 to 15 unless its `databases` "
                              "setting says otherwise).") from None
        raise conn.unavailable(exc, lost=False) from None
    except redis.RedisError as exc:
        pool.disconnect()
        raise conn.unavailable(exc, lost=False) from None
    except TypeError as exc:  # an option redis-py passes on to a connection that does not take it
        pool.disconnect()
        raise ConfigError(f"Invalid setting {setting}: an option in the URL is not one Redis connections "
                          f"take ({str(exc).rsplit(' ', 1)[-1]}).") from None
    return conn


URL_SHAPE = "redis://[[user]:password@]host[:port][/db][?prefix=name]"
#: Query options that need TLS, and ssl_cert_reqs' values (redis-py passes them to ssl).
_TLS_OPTIONS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname",
                "ssl_ca_path", "ssl_ca_data", "ssl_password", "ssl_min_version", "ssl_ciphers")
_CERT_REQS = ("none", "optional", "required")


def _checked_url(url: str, setting: str) -> tuple:
    """(parts, query, host, port) of a Redis URL, or a one-line ConfigError saying what is wrong.

    Caught here, before redis-py sees the URL: a broken IPv6 host or a port past 65535 raised
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
    if port == 0:
        raise bad("the Redis port must be a whole number from 1 to 65535")
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
    return parts, query, parts.hostname or "localhost", port or 6379


def _map_connection_errors(cls):
    """Every public method of cls raises BackendUnavailable when Redis goes away mid-call.

    One wrapper for the whole class, so no method can forget it; generators (iter_items) are
    wrapped as generators, since their errors surface while the caller iterates.
    """
    errors = (redis.ConnectionError, redis.TimeoutError)

    def wrap(fn):
        if inspect.isgeneratorfunction(fn):
            @functools.wraps(fn)
            def gen(self, *args, **kwargs):
                try:
                    yield from fn(self, *args, **kwargs)
                except errors as exc:
                    raise self.conn.unavailable(exc) from exc
            return gen

        @functools.wraps(fn)
        def call(self, *args, **kwargs):
            try:
                return fn(self, *args, **kwargs)
            except errors as exc:
                raise self.conn.unavailable(exc) from exc
        return call

    for name, fn in list(vars(cls).items()):
        if not name.startswith("_") and inspect.isfunction(fn):
            setattr(cls, name, wrap(fn))
    return cls


# Keys and scripts -----------------------------------------------------------------------------


class RedisKeys:
    """Every key name (the schema is in the module docstring)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.jobs_created = f"{prefix}:jobs:created"
        self.jobs_ids = f"{prefix}:jobs:ids"
        self.jobs_active = f"{prefix}:jobs:active"
        self.workers = f"{{{prefix}:workers}}"

    def job(self, job_id: str) -> list[str]:
        """The job's ten keys, in the order _job.lua names them."""
        return [self.job_key(job_id, suffix) for suffix in _JOB_KEY_SUFFIXES]

    def job_key(self, job_id: str, suffix: str) -> str:
        return f"{{{self.prefix}:job:{job_id}}}:{suffix}"

    def worker(self, worker_id: str) -> str:
        return f"{self.workers}:{worker_id}"

    def limit(self, provider_key: str) -> str:
        return f"{{{self.prefix}:limit:{provider_key}}}"


def _lua_constants() -> str:
    """The protocol's names as Lua locals, so the scripts and protocol.py cannot drift apart."""
    values = {"S_PENDING": PENDING, "S_CLAIMED": CLAIMED, "S_COMPLETED": COMPLETED, "S_FAILED": FAILED,
              "S_CREATING": CREATING, "S_NOT_STARTED": NOT_STARTED, "S_RUNNING": RUNNING,
              "S_PAUSED": PAUSED, "PAUSE_TOKEN_LIMIT": PAUSE_TOKEN_LIMIT, "EVENTS_KEPT": EVENTS_KEPT,
              "LIMIT_IDLE_KEEP_MS": LIMIT_IDLE_KEEP_MS}
    return "".join(f"local {name} = {json.dumps(value)}\n" for name, value in values.items())


class _Scripts:
    """Every Lua script, registered once per client (EVALSHA, reloaded after NOSCRIPT)."""

    def __init__(self, client: redis.Redis) -> None:
        here = resources.files(__package__) / "redis_lua"

        def read(name: str) -> str:
            return (here / f"{name}.lua").read_text(encoding="utf-8")

        common = _lua_constants() + read("_clock")
        job = common + read("_job")
        for name in _JOB_SCRIPTS:
            setattr(self, name, client.register_script(job + read(name)))
        for name in _OTHER_SCRIPTS:
            setattr(self, name, client.register_script(common + read(name)))


# Decoding -------------------------------------------------------------------------------------


def _text(value: bytes | str | None) -> str | None:
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _decode_hash(raw: dict | list) -> dict[str, str]:
    if isinstance(raw, list):  # a script's HGETALL reply is flat
        raw = dict(zip(raw[::2], raw[1::2], strict=True))
    return {_text(k): _text(v) for k, v in raw.items()}


def _seconds(ms: str | None) -> float | None:
    return float(ms) / 1000 if ms else None


def _opt(value: int | str | None) -> str:
    """'' stands for None in ARGV."""
    return "" if value is None else str(value)


def _job_from_meta(meta: dict[str, str]) -> JobRecord | None:
    """The JobRecord, or None when the job is unknown or still being created."""
    if not meta or meta.get("state") == CREATING:
        return None
    spec = spec_from_json(meta["spec"])
    max_tokens = int(meta["max_tokens"]) if meta.get("max_tokens") else None
    if spec.max_tokens != max_tokens:
        spec = replace(spec, max_tokens=max_tokens)
    n = {k: int(meta[k]) for k in ("total", "pending", "running", "completed", "failed", "tokens_in",
                                   "tokens_out", "tokens_charged", "tokens_reserved",
                                   "estimated_tokens", "skipped")}
    return JobRecord(spec=spec, created_at=float(meta["created_at_ms"]) / 1000, state=meta["state"],
                     pause_reason=meta.get("pause_reason"), last_claim_at=_seconds(meta.get("last_claim_at_ms")),
                     run_at=_seconds(meta.get("run_at_ms")), **n)


def _item_record(item: NewItem) -> str:
    return f"{item.estimated_tokens}\t{item.content_hash}\t" + json.dumps(
        [item.name, item.origin, item.offset, item.stat_sig])


def _parse_item(raw: bytes) -> tuple[int, str, list]:
    """(estimate, content_hash, [name, origin, offset, stat_sig]) of an items-hash value."""
    estimate, content_hash, rest = _text(raw).split("\t", 2)
    return int(estimate), content_hash, json.loads(rest)


def _event_body(e: Event) -> str:
    return json.dumps([e.kind, e.message, e.item_index, e.error_type, e.http_status])


def _event_args(events: Iterable[Event]) -> list:
    args: list = []
    for e in events:
        args += [e.at * 1000 if e.at else 0, _event_body(e)]
    return args


def _parse_event(raw: bytes) -> Event:
    at_ms, body = _text(raw).split("\t", 1)
    kind, message, index, error_type, http_status = json.loads(body)
    return Event(kind, message, index, error_type, http_status, at=float(at_ms) / 1000)


# The store ------------------------------------------------------------------------------------


@_map_connection_errors
class RedisJobStore:
    """JobStore on Redis (see store/protocol.py for each method's contract)."""

    def __init__(self, conn: RedisConnection) -> None:
        self.conn = conn
        self.r = conn.client
        self.keys = RedisKeys(conn.prefix)
        self.lua = conn.lua

    def now(self) -> float:
        seconds, micros = self.r.time()
        return seconds + micros / 1e6

    def close(self) -> None:
        self.conn.close()

    # Creating ------------------------------------------------------------------------------
    def begin_job(self, spec: JobSpec) -> None:
        created_ms = self.now() * 1000
        # One MULTI/EXEC: a process killed while sending it leaves nothing (Redis drops a MULTI
        # whose connection closes before EXEC). Indexes first all the same, so a job's keys are
        # never without the index entries that reach them.
        pipe = self.r.pipeline(transaction=True)
        # NX: a clashing id must not move the existing job in list_jobs.
        pipe.zadd(self.keys.jobs_created, {spec.job_id: created_ms}, nx=True)
        pipe.zadd(self.keys.jobs_ids, {spec.job_id: 0})
        self.lua.begin_job(keys=self.keys.job(spec.job_id), client=pipe, args=[
            f"{created_ms:.3f}", json.dumps(asdict(spec)), _opt(spec.max_tokens), spec.concurrency])
        try:
            pipe.execute()
        except redis.ResponseError as exc:
            if "job exists" in str(exc):
                raise ValueError(f"begin_job: job {spec.job_id!r} exists") from None
            raise

    def add_items(self, job_id: str, items: Iterable[NewItem]) -> None:
        keys = self.keys.job(job_id)
        args: list = []
        size = 0
        for it in items:
            if "\t" in it.content_hash:  # the items-hash record is tab-separated
                raise ValueError(f"add_items: content hash {it.content_hash!r} contains a tab")
            args += [it.index, _item_record(it), it.content_hash, it.content, it.estimated_tokens]
            size += len(it.content)
            if len(args) >= 5 * ADD_BATCH_ITEMS or size >= ADD_BATCH_BYTES:
                self._add_batch(keys, args)
                args, size = [], 0
        if args:
            self._add_batch(keys, args)

    def _add_batch(self, keys: list[str], args: list) -> None:
        try:
            self.lua.add_items(keys=keys, args=args)
        except redis.ResponseError as exc:
            if "no such job" in str(exc) or "already added" in str(exc):
                raise ValueError(f"add_items: {str(exc).removeprefix('ERR ')}") from None
            raise

    def finish_job(self, job_id: str) -> JobRecord:
        self.lua.finish_job(keys=self.keys.job(job_id))
        job = self.get_job(job_id)
        if job is None:
            raise ValueError(f"finish_job: no job {job_id!r}")
        return job

    def delete_job(self, job_id: str) -> bool:
        # One MULTI/EXEC: the job's keys and its index entries go together, so an interrupted
        # delete leaves neither keys no index reaches nor index entries for no job.
        pipe = self.r.pipeline(transaction=True)
        self.lua.delete_job(keys=self.keys.job(job_id), client=pipe)
        for index in (self.keys.jobs_active, self.keys.jobs_created, self.keys.jobs_ids):
            pipe.zrem(index, job_id)
        return bool(pipe.execute()[0])

    # Reading -------------------------------------------------------------------------------
    def get_job(self, job_id: str) -> JobRecord | None:
        return _job_from_meta(_decode_hash(self.r.hgetall(self.keys.job_key(job_id, "meta"))))

    def _metas(self, job_ids: list[str]) -> list[dict[str, str]]:
        pipe = self.r.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hgetall(self.keys.job_key(job_id, "meta"))
        return [_decode_hash(m) for m in pipe.execute()]

    def _states(self, job_ids: list[str]) -> list[str | None]:
        pipe = self.r.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hget(self.keys.job_key(job_id, "meta"), "state")
        return [_text(s) for s in pipe.execute()]

    def find_job_ids(self, prefix: str) -> list[str]:
        low, high = b"[" + prefix.encode(), b"(" + prefix.encode() + b"\xff"
        found: list[str] = []
        offset = 0
        while len(found) < FIND_LIMIT:
            ids = [_text(i) for i in self.r.zrange(self.keys.jobs_ids, low, high, bylex=True,
                                                   offset=offset, num=INDEX_PAGE)]
            found += [i for i, s in zip(ids, self._states(ids), strict=True) if s and s != CREATING]
            if len(ids) < INDEX_PAGE:
                break
            offset += INDEX_PAGE
        return found[:FIND_LIMIT]

    def list_jobs(self, limit: int = 20) -> list[JobRecord]:
        jobs: list[JobRecord] = []
        start = 0
        while len(jobs) < limit:
            ids = [_text(i) for i in self.r.zrevrange(self.keys.jobs_created, start, start + INDEX_PAGE - 1)]
            jobs += [j for j in map(_job_from_meta, self._metas(ids)) if j is not None]
            if len(ids) < INDEX_PAGE:
                break
            start += INDEX_PAGE
        return jobs[:max(limit, 0)]

    def _active_ids(self) -> list[str]:
        return [_text(i) for i in self.r.zrange(self.keys.jobs_active, 0, -1)]

    def active_job_ids(self) -> list[str]:
        ids = self._active_ids()
        return [i for i, s in zip(ids, self._states(ids), strict=True) if s == RUNNING]

    def iter_items(self, job_id: str, batch: int = 1000) -> Iterator[ItemRecord]:
        # Indexes are positions in the source (0..n-1), so a page is a range of hash fields.
        max_index = self.r.hget(self.keys.job_key(job_id, "meta"), "max_index")
        if max_index is None:
            return
        items, states, results = (self.keys.job_key(job_id, s) for s in ("items", "states", "results"))
        for low in range(0, int(max_index) + 1, max(batch, 1)):
            page = list(range(low, min(low + batch, int(max_index) + 1)))
            pipe = self.r.pipeline(transaction=False)
            pipe.hmget(items, page)
            pipe.hmget(states, page)
            pipe.hmget(results, page)
            raw_items, raw_states, raw_results = pipe.execute()
            for index, raw, state, result in zip(page, raw_items, raw_states, raw_results, strict=True):
                if raw is None:
                    continue
                _, _, (name, _origin, _offset, _stat_sig) = _parse_item(raw)
                st = json.loads(state) if state else {}
                yield ItemRecord(index=index, name=name, status=st.get("s", PENDING), result=_text(result),
                                 error_type=st.get("et"), http_status=st.get("hs"), error_message=st.get("em"),
                                 tokens_in=st.get("ti", 0), tokens_out=st.get("to", 0),
                                 attempts=st.get("a", 0), provider=st.get("pv"), model=st.get("md"))

    def list_events(self, job_id: str, limit: int = 100) -> list[Event]:
        if limit <= 0:
            return []
        return [_parse_event(e) for e in self.r.lrange(self.keys.job_key(job_id, "events"), -limit, -1)]

    # Job state -----------------------------------------------------------------------------
    def set_state(self, job_id, state, *, from_states, pause_reason=None, max_tokens=None, event=None):
        args = [state, _opt(pause_reason), _opt(max_tokens)]
        args += _event_args([event]) if event is not None else [0, ""]
        pipe = self.r.pipeline(transaction=True)
        if state == RUNNING:
            # Listed in the same MULTI/EXEC as the move (score 0, NX: never lowers an entry),
            # so no running job is ever out of the index because a process died.
            pipe.zadd(self.keys.jobs_active, {job_id: 0}, nx=True)
        self.lua.set_state(keys=self.keys.job(job_id), args=[*args, *from_states], client=pipe)
        epoch = pipe.execute()[-1]
        if epoch is None:
            return None
        if state == RUNNING:
            self._raise_active_epoch(job_id, epoch)
        return self.get_job(job_id)

    def _raise_active_epoch(self, job_id: str, epoch: int) -> None:
        """Score the job's entry with its new run epoch, so a prune by a reaper that saw the job
        idle at an older epoch can no longer remove it (prune_active.lua). GT: a slower
        concurrent run never puts back an older epoch. A process that dies before this leaves
        the entry at its old score: a running job is never pruned, so only a prune decided
        before the run and arriving in between can drop it, and running the job again (`run`
        accepts a running job) lists it again."""
        self.r.zadd(self.keys.jobs_active, {job_id: epoch}, gt=True)

    def retry_failed(self, job_id: str) -> int:
        keys, total = self.keys.job(job_id), 0
        while True:
            n = self.lua.retry_failed(keys=keys, args=[RETRY_BATCH_ITEMS])
            total += n
            if n < RETRY_BATCH_ITEMS:
                return total

    # Items ---------------------------------------------------------------------------------
    def claim_item(self, job_id, index_hint, worker_id, *, lease_s, max_running):
        reply = self.lua.claim_item(keys=self.keys.job(job_id),
                                    args=[index_hint, worker_id, lease_s * 1000, max_running])
        if reply[0] != b"ok":
            return ClaimRefused(_text(reply[0]))
        _, meta, index, raw_item, raw_state, content = reply
        _, content_hash, (name, origin, offset, stat_sig) = _parse_item(raw_item)
        st = json.loads(raw_state) if raw_state else {}
        return Claim(job=_job_from_meta(_decode_hash(meta)), index=int(index), name=name,
                     content=_text(content), content_hash=content_hash, origin=origin, offset=offset,
                     stat_sig=stat_sig, attempts=st.get("a", 0), rate_limit_waits=st.get("w", 0))

    def next_item_estimate(self, job_id: str) -> int | None:
        first = self.r.zrange(self.keys.job_key(job_id, "pending"), 0, 0)
        raw = self.r.hget(self.keys.job_key(job_id, "items"), first[0]) if first else None
        return _parse_item(raw)[0] if raw is not None else None

    def renew_leases(self, worker_id, items, *, lease_s):
        by_job: dict[str, list[int]] = {}
        for job_id, idx in items:
            by_job.setdefault(job_id, []).append(idx)
        if not by_job:
            return 0
        pipe = self.r.pipeline(transaction=False)
        for job_id, indexes in by_job.items():
            self.lua.renew_leases(keys=self.keys.job(job_id), args=[worker_id, lease_s * 1000, *indexes], client=pipe)
        return sum(int(n) for n in pipe.execute())

    def complete_item(self, job_id, index, worker_id, result, usage: Usage, *, provider=None, model=None):
        return bool(self.lua.complete_item(keys=self.keys.job(job_id), args=[
            index, worker_id, result, _opt(usage.tokens_in), _opt(usage.tokens_out), _opt(provider),
            _opt(model)]))

    def fail_item(self, job_id, index, worker_id, error: ItemError):
        return bool(self.lua.fail_item(keys=self.keys.job(job_id), args=[
            index, worker_id, error.error_type, _opt(error.http_status), error.message]))

    def release_item(self, job_id, index, worker_id):
        return bool(self.lua.release_item(keys=self.keys.job(job_id), args=[index, worker_id]))

    def record_attempt(self, job_id, index, worker_id, error: ItemError, *, rate_limited):
        return self.lua.record_attempt(keys=self.keys.job(job_id), args=[
            index, worker_id, int(rate_limited), error.error_type, _opt(error.http_status), error.message])

    # What the SQLite store does in one statement across jobs, this store does one atomic
    # script per job on the active-jobs index (pipelined: one round trip). Each job's release
    # is atomic; the set of jobs is read just before.
    def _each_active_job(self, script, args: list) -> dict[str, object]:
        ids = self._active_ids()
        pipe = self.r.pipeline(transaction=False)
        for job_id in ids:
            script(keys=self.keys.job(job_id), args=args, client=pipe)
        return dict(zip(ids, pipe.execute(), strict=True))

    def release_expired_leases(self) -> dict[str, int]:
        released: dict[str, int] = {}
        idle: list[tuple[str, int]] = []
        for job_id, (n, is_idle, epoch) in self._each_active_job(self.lua.release_expired, []).items():
            if n:
                released[job_id] = n
            if is_idle:
                idle.append((job_id, epoch))
        if idle:
            # Jobs not running and holding nothing leave the index, unless run again meanwhile.
            pipe = self.r.pipeline(transaction=False)
            for job_id, epoch in idle:
                self.lua.prune_active(keys=[self.keys.jobs_active], args=[job_id, epoch], client=pipe)
            pipe.execute()
        return released

    def release_worker_items(self, worker_id: str) -> dict[str, int]:
        counts = self._each_active_job(self.lua.release_worker_items, [worker_id])
        return {job_id: n for job_id, n in counts.items() if n}

    def _holdings(self) -> dict[str, list[tuple[str, int]]]:
        """Worker id -> the (job id, index) it holds, in job then index order."""
        ids = sorted(self._active_ids())
        pipe = self.r.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(self.keys.job_key(job_id, "owners"))
        held: dict[str, list[tuple[str, int]]] = {}
        for job_id, owners in zip(ids, pipe.execute(), strict=True):
            for index, owner in sorted((int(i), _text(o)) for i, o in owners.items()):
                held.setdefault(owner, []).append((job_id, index))
        return held

    def item_owners(self) -> dict[str, int]:
        return {owner: len(items) for owner, items in self._holdings().items()}

    def add_events(self, job_id: str, events: Iterable[Event]) -> None:
        events = list(events)
        if events:
            skipped = sum(e.kind == "skipped" for e in events)
            self.lua.add_events(keys=self.keys.job(job_id), args=[skipped, *_event_args(events)])

    # Workers -------------------------------------------------------------------------------
    def heartbeat_worker(self, info: WorkerInfo, *, ttl_s: float) -> None:
        self.lua.heartbeat(keys=[self.keys.workers, self.keys.worker(info.worker_id)], args=[
            info.worker_id, info.host, info.pid, repr(float(info.started_at)), info.threads, ttl_s * 1000])

    def remove_worker(self, worker_id: str) -> None:
        pipe = self.r.pipeline(transaction=True)  # one slot: {P:workers}
        pipe.delete(self.keys.worker(worker_id))
        pipe.zrem(self.keys.workers, worker_id)
        pipe.execute()

    def live_workers(self) -> list[WorkerInfo]:
        # A worker's hash expires with its ttl: present means live.
        ids = [_text(i) for i in self.r.zrange(self.keys.workers, 0, -1)]
        pipe = self.r.pipeline(transaction=False)
        for worker_id in ids:
            pipe.hgetall(self.keys.worker(worker_id))
        held = self._holdings()
        workers = []
        for worker_id, raw in zip(ids, pipe.execute(), strict=True):
            w = _decode_hash(raw)
            if w:
                workers.append(WorkerInfo(worker_id, w["host"], int(w["pid"]), float(w["started_at"]),
                                          float(w["heartbeat_at_ms"]) / 1000, int(w["threads"]),
                                          holding=held.get(worker_id, [])))
        return sorted(workers, key=lambda w: w.started_at)


@_map_connection_errors
class RedisLimits:
    """SharedLimits on Redis: GCRA pacing and the shared 429 wait per provider key."""

    def __init__(self, conn: RedisConnection) -> None:
        self.conn = conn
        self.r = conn.client
        self.keys = RedisKeys(conn.prefix)
        self.lua = conn.lua
        # Per key: the last acquire here found nothing a success would clear, and no 429 was
        # seen here since; clear_backoff then skips its round trip (see SqliteLimits._clean).
        self._clean: dict[str, bool] = {}

    def acquire(self, key: str, *, rpm: int | None, tpm: int | None, tokens: int) -> Turn:
        wait_ms, clean, epoch = self.lua.acquire(keys=[self.keys.limit(key)], args=[
            rpm or 0, tpm or 0, tokens, limits_math.AUTO_RECOVERY_DOUBLING_S * 1000, limits_math.AUTO_OFF_BELOW_S * 1000])
        self._clean[key] = bool(clean)
        return Turn(float(wait_ms) / 1000, int(epoch))

    def pause(self, key: str, *, seconds: float | None, base_s: float, cap_s: float,
              epoch: int) -> float:
        self._clean[key] = False
        wait_ms = "" if seconds is None else seconds * 1000
        until_ms = self.lua.pause(keys=[self.keys.limit(key)], args=[
            wait_ms, base_s * 1000, cap_s * 1000, limits_math.AIMD_DECREASE, limits_math.AUTO_MAX_INTERVAL_S * 1000,
            limits_math.AUTO_RECOVERY_DOUBLING_S * 1000, limits_math.AUTO_OFF_BELOW_S * 1000,
            epoch])
        return float(until_ms) / 1000

    def clear_backoff(self, key: str) -> None:
        if self._clean.get(key):
            return  # nothing to clear as of this process's last acquire (as SqliteLimits)
        self.lua.clear_backoff(keys=[self.keys.limit(key)])

    def pause_state(self, key: str) -> PauseState | None:
        pipe = self.r.pipeline(transaction=False)
        pipe.time()
        pipe.hmget(self.keys.limit(key), ["pause_until_ms", "backoff_step"])
        (seconds, micros), (until_ms, step) = pipe.execute()
        if until_ms is not None and float(until_ms) > seconds * 1000 + micros / 1000:
            return PauseState(until=float(until_ms) / 1000, backoff_step=int(step or 0))
        return None


QUEUE_ERRORS = (redis.ConnectionError, redis.TimeoutError)  #: what Huey's RedisStorage raises when Redis is gone


def persistence_warning(conn: RedisConnection) -> str | None:
    """A warning when this Redis would lose jobs on restart (no AOF), else None.

    Jobs live in Redis: without the append-only file a restart (or a crash) forgets them.
    Managed Redis may refuse INFO; then nothing can be said.
    """
    try:
        info = conn.client.info("persistence")
    except redis.RedisError:
        return None
    if str(info.get("aof_enabled", "1")) == "1":
        return None
    return (f"Redis at {conn.where} does not persist with an append-only file (appendonly no): a Redis "
            "restart would lose jobs. Turn it on: redis-server --appendonly yes (docker/compose.yaml does).")


def open_redis_backend_parts(url: str) -> tuple[Callable[[str], RedisHuey], RedisJobStore, RedisLimits,
                                                   RedisConnection]:
    """A maker of Huey queues by name, the store, the limiter and the connection for a redis://
    URL, all on one pool."""
    conn = connect_redis(url)

    def make_queue(name: str) -> RedisHuey:
        # results=False: nothing reads Huey results (the store has them), and RedisHuey's results
        # hash would grow forever. clean_name=False keeps the prefix readable in Huey's key names.
        return RedisHuey(name=f"{conn.prefix}.{name}", connection_pool=conn.pool, results=False,
                         utc=True, clean_name=False)

    return make_queue, RedisJobStore(conn), RedisLimits(conn), conn
