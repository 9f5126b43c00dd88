"""Huey's queues on the fleet backend: RedisHuey on the store's connection pool.

Huey's keys are its own: huey.{redis,schedule,results,counters}.P.<queue> (keys.py).
"""

from __future__ import annotations

from collections.abc import Callable

import redis
from huey import RedisHuey

from .connection import RedisConnection

QUEUE_ERRORS = (
    redis.ConnectionError,
    redis.TimeoutError,
)  #: what Huey's RedisStorage raises when Redis is gone


def queue_maker(conn: RedisConnection) -> Callable[[str], RedisHuey]:
    """A maker of Huey queues by name, all on conn's pool and under its prefix."""

    def make_queue(name: str) -> RedisHuey:
        # results=False: nothing reads Huey results (the store has them), and RedisHuey's results
        # hash would grow forever. clean_name=False keeps the prefix readable in Huey's key names.
        return RedisHuey(
            name=f"{conn.prefix}.{name}",
            connection_pool=conn.pool,
            results=False,
            utc=True,
            clean_name=False,
        )

    return make_queue
