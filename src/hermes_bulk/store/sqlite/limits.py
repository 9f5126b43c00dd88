"""SqliteLimits: the SharedLimits protocol (store/protocol.py) on one SqliteDatabase."""

from __future__ import annotations

import threading

from .. import limits_math
from ..limits_math import LimitState
from ..protocol import PauseState, Turn
from .database import SqliteDatabase


class SqliteLimits:
    """SharedLimits on SqliteDatabase: the shared 429 wait and pacing per provider key.

    The pacing arithmetic lives in `limits_math`, shared in spirit with the Redis Lua scripts.
    """

    #: Requests granted on an unpaced key are added to its shared count in batches, at most this
    #: often per process, instead of one write transaction each (that write was one of three on
    #: every item's path). observed_rate reads the count over about a second, so it lags by at
    #: most this much; a 429 adds what is pending first.
    COUNT_EVERY_S = 0.1

    def __init__(self, db: SqliteDatabase) -> None:
        self.db = db
        self._uncounted: dict[str, int] = {}
        self._counted_at: dict[str, float] = {}
        self._count_lock = threading.Lock()
        # Per key: this process's last acquire found no backoff step, and it has not seen a 429
        # since, so a success has nothing to clear (clear_backoff skips its read). A 429 elsewhere
        # in between is cleared by the next success after its wait.
        self._clean: dict[str, bool] = {}

    def _take_uncounted(self, key: str, now_s: float, *, plus: int = 0, force: bool = False) -> int:
        """Requests granted here and not yet counted (plus `plus`), if it is time to count them."""
        with self._count_lock:
            n = self._uncounted.get(key, 0) + plus
            if not force and now_s - self._counted_at.get(key, 0.0) < self.COUNT_EVERY_S:
                self._uncounted[key] = n
                return 0
            self._uncounted[key], self._counted_at[key] = 0, now_s
            return n

    def _row(self, conn, key: str) -> LimitState:
        row = conn.execute(
            f"SELECT {', '.join(LimitState.COLUMNS)} FROM limits WHERE key = ?", (key,)
        ).fetchone()
        return LimitState(*row) if row else LimitState()

    def _save(self, conn, key: str, state: LimitState) -> None:
        cols = ", ".join(LimitState.COLUMNS)
        marks = ", ".join("?" * len(LimitState.COLUMNS))
        updates = ", ".join(f"{c} = excluded.{c}" for c in LimitState.COLUMNS)
        conn.execute(
            f"INSERT INTO limits (key, {cols}) VALUES (?, {marks}) ON CONFLICT (key) DO UPDATE "
            f"SET {updates}",
            (key, *state.values()),
        )

    def acquire(self, key: str, *, rpm: int | None, tpm: int | None, tokens: int) -> Turn:
        now_s = self.db.clock()
        if not rpm and not tpm:
            # Unpaced: a read (no write lock) says whether the key is waiting or adaptively paced;
            # when it is neither, the grant only needs counting, which is batched.
            rows = self.db.read(
                "SELECT pause_until, auto_interval, auto_since, backoff_step, decreases"
                " FROM limits WHERE key = ?",
                (key,),
            )
            seen = (
                LimitState(
                    pause_until_s=rows[0][0],
                    auto_interval_s=rows[0][1],
                    auto_since_s=rows[0][2],
                    backoff_step=rows[0][3],
                    decreases=rows[0][4],
                )
                if rows
                else LimitState()
            )
            self._clean[key] = limits_math.clean(seen)
            if limits_math.unpaced(seen, now_s, rpm=rpm, tpm=tpm):
                n = self._take_uncounted(key, now_s, plus=1)
                if n:
                    with self.db.write() as conn:
                        state = self._row(conn, key)
                        limits_math.count(state, now_s, n)
                        self._save(conn, key, state)
                return Turn(0.0, seen.decreases)
        with self.db.write() as conn:
            state = self._row(conn, key)
            self._clean[key] = limits_math.clean(state)
            wait_s = limits_math.acquire(state, now_s, rpm=rpm, tpm=tpm, tokens=tokens)
            if wait_s == 0:
                self._save(conn, key, state)
            return Turn(wait_s, state.decreases)

    def pause(
        self, key: str, *, seconds: float | None, base_s: float, cap_s: float, epoch: int
    ) -> float:
        now_s = self.db.clock()
        self._clean[key] = False
        with self.db.write() as conn:
            state = self._row(conn, key)
            uncounted = self._take_uncounted(key, now_s, force=True)
            if uncounted:  # the rate seen before this 429 includes them
                limits_math.count(state, now_s, uncounted)
            limits_math.rate_limited(
                state, now_s, retry_after_s=seconds, base_s=base_s, cap_s=cap_s, epoch=epoch
            )
            self._save(conn, key, state)
            return state.pause_until_s

    def clear_backoff(self, key: str) -> None:
        if self._clean.get(key):
            return
        # Read first: most successes have nothing to change, and a read takes no write lock.
        rows = self.db.read("SELECT backoff_step FROM limits WHERE key = ?", (key,))
        if rows and rows[0][0]:
            with self.db.write() as conn:
                state = self._row(conn, key)
                limits_math.succeeded(state)
                self._save(conn, key, state)

    def pause_state(self, key: str) -> PauseState | None:
        rows = self.db.read("SELECT pause_until, backoff_step FROM limits WHERE key = ?", (key,))
        if rows and rows[0][0] > self.db.clock():
            return PauseState(until=rows[0][0], backoff_step=rows[0][1])
        return None
