"""The store's Lua scripts (lua/<operation>.lua, each opening with its KEYS and ARGV), registered
once per client: EVALSHA, reloaded after NOSCRIPT; and call_job_script, which gives a job script
the buckets it asks for."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from importlib import resources

import redis
from redis.commands.core import Script

from ..protocol import (
    CLAIMED,
    COMPLETED,
    CREATING,
    FAILED,
    NOT_STARTED,
    PAUSE_COST_LIMIT,
    PAUSE_SAMPLE,
    PAUSE_TOKEN_LIMIT,
    PAUSED,
    PENDING,
    RUNNING,
    SAMPLE_DONE,
    WAITING,
)
from .item_state import STATUS_CODES, ZERO_OMITTED
from .keys import BUCKET_ITEMS, EVENTS_KEPT, LIMIT_IDLE_KEEP_MS, RedisKeys

#: Set to 1 (the test suite does), every script refuses a key it was not passed in KEYS: Redis
#: itself checks this only in a cluster. Off by default: it wraps every Redis call of a script.
CHECK_KEYS_ENV = "HERMES_BULK_CHECK_SCRIPT_KEYS"
#: Calls of a job script that may each name buckets it was not given before it gives up: the
#: buckets only grow, and a round is needed only when another worker moved the script's choice.
NEEDKEYS_ROUNDS = 32
_NEEDKEYS = re.compile(r"^NEEDKEYS ([\d ]+?)(?: script:|$)")

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
    "set_sample",
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
        "PAUSE_COST_LIMIT": PAUSE_COST_LIMIT,
        "PAUSE_SAMPLE": PAUSE_SAMPLE,
        "SAMPLE_DONE": SAMPLE_DONE.replace("{n}", "%d"),
        "EVENTS_KEPT": EVENTS_KEPT,
        "LIMIT_IDLE_KEEP_MS": LIMIT_IDLE_KEEP_MS,
        "BUCKET_ITEMS": BUCKET_ITEMS,
    }
    text = "".join(f"local {name} = {json.dumps(value)}\n" for name, value in values.items())
    # The counts an item's state leaves out at 0, and its status as stored there and back
    # (item_state.py, the legend of a state's fields).
    text += "local ZERO_OMITTED = {" + ", ".join(json.dumps(k) for k in ZERO_OMITTED) + "}\n"
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


def _key_check(client: redis.Redis, texts: Iterable[str]) -> str:
    """Lua that makes `redis.call` in the rest of a script refuse a key not in KEYS (a local
    `redis` shadowing the global: Redis keeps its own table read-only). Which arguments are keys
    comes from the server's COMMAND INFO for every command the scripts call."""
    names = sorted({n for text in texts for n in re.findall(r"redis\.call\('([A-Z]+)'", text)})
    info = client.execute_command("COMMAND", "INFO", *names)
    positions = ", ".join(
        f"{name} = {{{c['first_key_pos']}, {c['last_key_pos']}, {c['step_count']}}}"
        for name in names
        for c in [info[name.lower()]]
    )
    return f"""local redis = (function(real)
  local declared, positions = {{}}, {{{positions}}}
  for _, k in ipairs(KEYS) do declared[k] = true end
  local function call(command, ...)
    local p, args = positions[command], {{...}}
    if not p then error('key check: no key positions for ' .. command) end
    if p[1] > 0 then
      local last = p[2] < 0 and #args + 1 + p[2] or p[2]
      for i = p[1], last, p[3] do
        if not declared[args[i]] then
          error('key check: ' .. command .. ' touched a key not in KEYS: ' .. tostring(args[i]))
        end
      end
    end
    return real.call(command, ...)
  end
  return setmetatable({{call = call}}, {{__index = real}})
end)(redis)
"""


def needed_buckets(exc: redis.ResponseError) -> set[int] | None:
    """The buckets a job script asked for (its "NEEDKEYS <bucket> ..." error), or None."""
    match = _NEEDKEYS.match(str(exc))
    return {int(b) for b in match.group(1).split()} if match else None


def call_job_script(
    script,
    keys: RedisKeys,
    job_id: str,
    args: list,
    *,
    items: Iterable[int] = (),
    buckets: Iterable[int] = (),
    extra_keys: Iterable[str] = (),
    client: redis.Redis | None = None,
):
    """Run a job script with the buckets of `items` (and `buckets`) in its KEYS; when it chose
    items of other buckets (it wrote nothing then), run it again with those too. client: the
    connection to send it on (durability.py), else the script's own client's pool."""
    wanted = {int(i) // BUCKET_ITEMS for i in items} | set(buckets)
    extra = list(extra_keys)
    for _ in range(NEEDKEYS_ROUNDS):
        try:
            on = {"client": client} if client is not None else {}
            return script(keys=keys.job(job_id, extra, sorted(wanted)), args=args, **on)
        except redis.ResponseError as exc:
            more = needed_buckets(exc)
            if more is None:
                raise
            wanted |= more
    raise redis.ResponseError(
        f"a script of job {job_id} still chose items of other buckets after {NEEDKEYS_ROUNDS} calls"
    )


class _Script(Script):
    """A registered script that survives a failover: redis-py loads a script once after NOSCRIPT,
    but a failover can move the connection between the load and the call (the load reached the
    demoted primary, the call the new one, whose script cache is its own): then once more."""

    def __call__(self, keys=None, args=None, client=None):
        try:
            return super().__call__(keys, args, client)
        except redis.exceptions.NoScriptError:
            return super().__call__(keys, args, client)


class Scripts:
    """Every Lua script, registered once per client (EVALSHA, reloaded after NOSCRIPT).

    clock_key: tests only (RedisConnection.clock_key): scripts read the time there when it is set.
    With CHECK_KEYS_ENV set, each script refuses a key it was not passed in KEYS.
    """

    def __init__(self, client: redis.Redis, clock_key: str | None = None) -> None:
        here = resources.files(__package__) / "lua"

        def read(name: str) -> str:
            return (here / f"{name}.lua").read_text(encoding="utf-8")

        common = _lua_constants() + read("_clock") + (_test_clock(clock_key) if clock_key else "")
        if os.environ.get(CHECK_KEYS_ENV) == "1":
            common += _key_check(client, (p.read_text(encoding="utf-8") for p in here.iterdir()))
        job = common + read("_job")
        for name in _JOB_SCRIPTS:
            setattr(self, name, _Script(client, job + read(name)))
        # One script of two: each script's text as a function of its own ARGV (a parameter named
        # ARGV shadows the global), so complete and claim stay written once.
        both = (
            "".join(
                f"local function {name}(ARGV)\n{read(name)}\nend\n"
                for name in ("complete_item", "claim_item")
            )
            + f"local function acquire(KEYS, ARGV)\n{read('acquire')}\nend\n"
        )
        self.complete_and_claim = _Script(client, job + both + read("complete_and_claim"))
        settle = "".join(
            f"local function {name}(ARGV)\n{read(name)}\nend\n"
            for name in ("record_attempt", "fail_item", "release_item")
        )
        self.settle_failed_attempt = _Script(client, job + settle + read("settle_failed_attempt"))
        for name in _OTHER_SCRIPTS:
            setattr(self, name, _Script(client, common + read(name)))
