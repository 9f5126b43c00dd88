"""The store's Lua scripts (lua/<operation>.lua, each opening with its KEYS and ARGV), registered
once per client: EVALSHA, reloaded after NOSCRIPT."""

from __future__ import annotations

import json
from importlib import resources

import redis

from ..protocol import (
    CLAIMED,
    COMPLETED,
    CREATING,
    FAILED,
    NOT_STARTED,
    PAUSE_TOKEN_LIMIT,
    PAUSED,
    PENDING,
    RUNNING,
    WAITING,
)
from .codec import STATUS_CODES
from .keys import BUCKET_ITEMS, EVENTS_KEPT, LIMIT_IDLE_KEEP_MS

# Scripts that take a job's keys (RedisKeys.job) and get the job helpers (_job.lua) prepended.
_JOB_SCRIPTS = (
    "begin_job",
    "add_items",
    "finish_job",
    "delete_job",
    "add_events",
    "set_state",
    "retry_failed",
    "claim_item",
    "complete_item",
    "fail_item",
    "release_item",
    "record_attempt",
    "renew_leases",
    "release_expired",
    "release_worker_items",
    "update_job",
    "mark_interrupted",
    "open_batch",
    "migrate_layout",
    "item_owners",
)
_OTHER_SCRIPTS = (
    "prune_active",
    "heartbeat",
    "acquire",
    "pause",
    "clear_backoff",
    "lease_batch",
    "update_batch",
    "migrate_answers",
)


def _lua_constants() -> str:
    """The protocol's names as Lua locals, so the scripts and protocol.py cannot drift apart."""
    values = {
        "S_PENDING": PENDING,
        "S_CLAIMED": CLAIMED,
        "S_COMPLETED": COMPLETED,
        "S_FAILED": FAILED,
        "S_CREATING": CREATING,
        "S_NOT_STARTED": NOT_STARTED,
        "S_RUNNING": RUNNING,
        "S_PAUSED": PAUSED,
        "S_WAITING": WAITING,
        "PAUSE_TOKEN_LIMIT": PAUSE_TOKEN_LIMIT,
        "EVENTS_KEPT": EVENTS_KEPT,
        "LIMIT_IDLE_KEEP_MS": LIMIT_IDLE_KEEP_MS,
        "BUCKET_ITEMS": BUCKET_ITEMS,
    }
    text = "".join(f"local {name} = {json.dumps(value)}\n" for name, value in values.items())
    # An item's status as stored in its state (codec.STATUS_CODES), and back.
    text += (
        "local STATUS_CODE = {"
        + ", ".join(f"[{json.dumps(k)}] = {v}" for k, v in STATUS_CODES.items())
        + "}\n"
    )
    return (
        text
        + "local STATUS_NAME = {"
        + ", ".join(f"[{v}] = {json.dumps(k)}" for k, v in STATUS_CODES.items())
        + "}\n"
    )


def _test_clock(clock_key: str) -> str:
    """now_ms for tests that set the clock: the time stored at clock_key (float ms since the
    epoch), else TIME. Defined after _clock.lua's, so it replaces it; production scripts never
    contain it (RedisConnection.clock_key is None outside tests)."""
    return (
        f"local function now_ms()\n  local set = redis.call('GET', {json.dumps(clock_key)})\n"
        "  if set then return tonumber(set) end\n  local t = redis.call('TIME')\n"
        "  return tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000\nend\n"
    )


class Scripts:
    """Every Lua script, registered once per client (EVALSHA, reloaded after NOSCRIPT).

    clock_key: tests only (RedisConnection.clock_key): scripts read the time there when it is set.
    """

    def __init__(self, client: redis.Redis, clock_key: str | None = None) -> None:
        here = resources.files(__package__) / "lua"

        def read(name: str) -> str:
            return (here / f"{name}.lua").read_text(encoding="utf-8")

        common = _lua_constants() + read("_clock") + (_test_clock(clock_key) if clock_key else "")
        job = common + read("_job")
        for name in _JOB_SCRIPTS:
            setattr(self, name, client.register_script(job + read(name)))
        # One script of two: each script's text as a function of its own ARGV (a parameter named
        # ARGV shadows the global), so complete and claim stay written once.
        both = "".join(
            f"local function {name}(ARGV)\n{read(name)}\nend\n"
            for name in ("complete_item", "claim_item")
        )
        self.complete_and_claim = client.register_script(job + both + read("complete_and_claim"))
        settle = "".join(
            f"local function {name}(ARGV)\n{read(name)}\nend\n"
            for name in ("record_attempt", "fail_item", "release_item")
        )
        self.settle_failed_attempt = client.register_script(
            job + settle + read("settle_failed_attempt")
        )
        for name in _OTHER_SCRIPTS:
            setattr(self, name, client.register_script(common + read(name)))
