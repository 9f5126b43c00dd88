"""The fleet ledger: one Redis, shared by every profile on every machine.

Each admission is one Lua script (`lua/admit_request.lua`), so no two processes anywhere can
both take the last free request. Connections time out fast (REDIS_TIMEOUT_S): a Redis that is
down or slow fails the call open (the caller decides), never blocks an agent.

Key schema (P is the URL's `prefix=`, default `hermes-bulk`). Every key of the budget shares the
hash tag {P:budget}, so the script touches one cluster slot:

    {P:budget}:w:<window start s>       HASH   the window's counters (budget/ledger.py names them)
                                                and name:<job id> -> "<class>\\t<job name>"
    {P:budget}:w:<window start s>:runs  SET    "<run counter>\\t<run id>": each run counted once
    {P:budget}:w:<window start s>:log   STREAM one entry per call (fields as LedgerEntry), capped
                                                at LOG_ENTRIES_KEPT
All three expire KEEP_AFTER_WINDOW_S after the window ends.
"""

from __future__ import annotations

import json
from importlib import resources

import redis

from ..config.backend_url import RedisUrl
from ..errors import BackendUnavailable
from ..store.redis.connection import RedisConnection, connect_redis
from . import policy
from .ledger import (
    KEEP_AFTER_WINDOW_S,
    NOT_SENT,
    Admission,
    CallRecord,
    LedgerEntry,
    LedgerUnavailable,
    WindowCounts,
    counters_taken_back,
)
from .policy import Terms
from .windows import Window

#: Connect and read timeouts: an admission either answers within this or the call fails open.
REDIS_TIMEOUT_S = 0.5
#: Records kept per window (approximately: the stream is trimmed in whole nodes).
LOG_ENTRIES_KEPT = 200_000
_ENTRY_PAGE = 1000


def _lua_constants() -> str:
    """policy.py's names as Lua locals, so the script and the Python rule cannot drift apart."""
    values = {
        "C_CHAT": policy.CHAT,
        "C_CRON": policy.CRON,
        "C_AUXILIARY": policy.AUXILIARY,
        "C_BULK": policy.BULK,
        "D_ALLOWED": policy.ALLOWED,
        "D_HELD": policy.HELD,
        "D_WOULD_BLOCK": policy.WOULD_BLOCK,
        "D_NOT_SENT": NOT_SENT,
    }
    return "".join(f"local {name} = {json.dumps(value)}\n" for name, value in values.items())


class RedisLedger:
    """RequestLedger on Redis (see ledger.py for the contract)."""

    def __init__(self, location: RedisUrl) -> None:
        try:
            # No failover wait: a call is never held for the ledger, it fails open (and is
            # noted) until the new primary answers.
            self.conn: RedisConnection = connect_redis(
                location,
                connect_timeout_s=REDIS_TIMEOUT_S,
                socket_timeout_s=REDIS_TIMEOUT_S,
                failover_wait_s=0,
            )
        except BackendUnavailable as exc:  # down or refusing: the caller fails open
            raise LedgerUnavailable(str(exc)) from None
        self.location = (
            f"redis+sentinel://{self.conn.where}"
            if location.sentinels
            else f"redis://{self.conn.where}"
        )
        self.r = self.conn.client
        self.base = f"{{{self.conn.prefix}:budget}}"
        self._admit = self.r.register_script(_lua_constants() + _script("admit_request.lua"))
        self._take_back = self.r.register_script(_lua_constants() + _script("take_back.lua"))

    def window_keys(self, window: Window) -> list[str]:
        w = f"{self.base}:w:{window.start_s}"
        return [w, f"{w}:runs", f"{w}:log"]

    def admit(self, call: CallRecord, window: Window, terms: Terms) -> Admission:
        args = [
            call.call_class,
            int(terms.counted),
            int(terms.enforce),
            terms.background_cap,
            "" if terms.job_cap is None else terms.job_cap,
            call.job_id,
            call.job_name,
            call.run_id,
            call.profile,
            call.provider,
            call.model,
            call.api_mode,
            window.start_s,
            window.end_s + KEEP_AFTER_WINDOW_S,
            LOG_ENTRIES_KEPT,
        ]
        try:
            decision, counted, total, job_requests, held_runs = self._admit(
                keys=self.window_keys(window), args=args
            )
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise self._unavailable(exc) from None
        return Admission(
            decision=_text(decision),
            counted=bool(counted),
            window_total=int(total),
            job_requests=int(job_requests),
            job_held_runs=int(held_runs),
        )

    def take_back(self, call: CallRecord, window: Window) -> None:
        w, _runs, log = self.window_keys(window)
        args = [
            window.start_s,
            window.end_s + KEEP_AFTER_WINDOW_S,
            LOG_ENTRIES_KEPT,
            call.call_class,
            call.profile,
            call.job_id,
            call.job_name,
            call.run_id,
            call.provider,
            call.model,
            call.api_mode,
            *counters_taken_back(call),
        ]
        try:
            self._take_back(keys=[w, log], args=args)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise self._unavailable(exc) from None

    def counts(self, window: Window) -> WindowCounts:
        try:
            raw = self.r.hgetall(self.window_keys(window)[0])
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise self._unavailable(exc) from None
        counters: dict[str, int] = {}
        names: dict[str, tuple[str, str]] = {}
        for k, v in raw.items():
            key, value = _text(k), _text(v)
            if key.startswith("name:"):
                call_class, _, name = value.partition("\t")
                names[key[5:]] = (call_class, name)
            else:
                counters[key] = int(value)
        return WindowCounts(window.start_s, counters, names)

    def entries(self, window: Window, limit: int = 1000) -> list[LedgerEntry]:
        out: list[LedgerEntry] = []
        start = "-"
        try:
            while len(out) < limit:
                page = self.r.xrange(
                    self.window_keys(window)[2], min=start, count=min(_ENTRY_PAGE, limit - len(out))
                )
                if not page:
                    break
                for _entry_id, fields in page:
                    f = {_text(k): _text(v) for k, v in fields.items()}
                    out.append(
                        LedgerEntry(
                            at=float(f["at"]),
                            window_start_s=int(f["w"]),
                            decision=f["decision"],
                            counted=f["counted"] == "1",
                            call=CallRecord(
                                call_class=f["class"],
                                profile=f["profile"],
                                job_id=f["job"],
                                job_name=f["name"],
                                run_id=f["run"],
                                provider=f["provider"],
                                model=f["model"],
                                api_mode=f["api_mode"],
                            ),
                        )
                    )
                start = "(" + _text(page[-1][0])
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise self._unavailable(exc) from None
        return out

    def _unavailable(self, exc: Exception) -> LedgerUnavailable:
        return LedgerUnavailable(str(self.conn.unavailable(exc)))

    def close(self) -> None:
        self.conn.close()


def _script(name: str) -> str:
    return (resources.files(__package__) / "lua" / name).read_text(encoding="utf-8")


def _text(value: bytes | str) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value
