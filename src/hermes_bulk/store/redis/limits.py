"""RedisLimits: the SharedLimits protocol (store/protocol.py) on Redis: GCRA pacing and the
shared 429 wait per provider key, one Lua script each (acquire, pause, clear_backoff)."""

from __future__ import annotations

from .. import limits_math
from ..protocol import PauseState, Turn
from .connection import RedisConnection, map_connection_errors
from .keys import RedisKeys

#: acquire.lua's ARGV[4..5], the adaptive pacing's constants, in milliseconds.
ACQUIRE_TIMING_ARGS = (
    limits_math.AUTO_RECOVERY_DOUBLING_S * 1000,
    limits_math.AUTO_OFF_BELOW_S * 1000,
)


def turn_of(clean: dict[str, bool], key: str, reply) -> Turn:
    """acquire.lua's reply as a Turn, noting for clear_backoff whether the key had a step."""
    wait_ms, was_clean, epoch = reply
    clean[key] = bool(was_clean)
    return Turn(float(wait_ms) / 1000, int(epoch))


@map_connection_errors
class RedisLimits:
    """SharedLimits on Redis: GCRA pacing and the shared 429 wait per provider key."""

    def __init__(self, conn: RedisConnection) -> None:
        self.conn = conn
        self.r = conn.client
        self.keys = RedisKeys(conn.prefix)
        self.lua = conn.lua
        # Per key: the last turn here found nothing a success would clear, and no 429 was seen
        # here since; clear_backoff then skips its round trip (see SqliteLimits._clean). Shared
        # with the job store, whose complete_and_claim takes turns too.
        self._clean = conn.backoff_clean

    def acquire(self, key: str, *, rpm: int | None, tpm: int | None, tokens: int) -> Turn:
        wait_ms, clean, epoch = self.lua.acquire(
            keys=[self.keys.limit(key)],
            args=[
                rpm or 0,
                tpm or 0,
                tokens,
                *ACQUIRE_TIMING_ARGS,
            ],
        )
        return turn_of(self._clean, key, (wait_ms, clean, epoch))

    def pause(
        self, key: str, *, seconds: float | None, base_s: float, cap_s: float, epoch: int
    ) -> float:
        self._clean[key] = False
        wait_ms = "" if seconds is None else seconds * 1000
        until_ms = self.lua.pause(
            keys=[self.keys.limit(key)],
            args=[
                wait_ms,
                base_s * 1000,
                cap_s * 1000,
                limits_math.AIMD_DECREASE,
                limits_math.AUTO_MAX_INTERVAL_S * 1000,
                limits_math.AUTO_RECOVERY_DOUBLING_S * 1000,
                limits_math.AUTO_OFF_BELOW_S * 1000,
                epoch,
            ],
        )
        return float(until_ms) / 1000

    def clear_backoff(self, key: str) -> None:
        if self._clean.get(key):
            return  # nothing to clear as of this process's last acquire (as SqliteLimits)
        self.lua.clear_backoff(keys=[self.keys.limit(key)])

    def pause_state(self, key: str) -> PauseState | None:
        pipe = self.r.pipeline(transaction=False)
        n = self.conn.queue_clock(pipe)
        pipe.hmget(self.keys.limit(key), ["pause_until_ms", "backoff_step"])
        *clock, (until_ms, step) = pipe.execute()
        if until_ms is not None and float(until_ms) > self.conn.time_of(clock[:n]) * 1000:
            return PauseState(until=float(until_ms) / 1000, backoff_step=int(step or 0))
        return None
