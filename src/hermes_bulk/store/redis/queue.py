"""Huey's queues on the fleet backend: RedisHuey on the store's connection pool.

Huey's keys are its own: huey.{redis,schedule,results,counters}.P.<queue> (keys.py). Huey's
commands go through a RidingClient as the store's do (failover.py): an enqueue refused by a
demoted primary (READONLY: a managed endpoint that failed over, a plain redis:// URL) or sent
while the Sentinels elect a new primary waits the failover out instead of failing the command
that enqueued; a pop whose reply was lost is not sent again (it may have taken a trigger).
"""

from __future__ import annotations

from collections.abc import Callable

import redis
from huey import RedisHuey
from huey.storage import RedisStorage

from .connection import RedisConnection
from .failover import RidingClient

QUEUE_ERRORS = (
    redis.ConnectionError,
    redis.TimeoutError,
)  #: what Huey's RedisStorage raises when Redis is gone


def queue_maker(conn: RedisConnection) -> Callable[[str], RedisHuey]:
    """A maker of Huey queues by name, all on conn's pool and under its prefix."""

    def riding_client(connection_pool: redis.ConnectionPool) -> RidingClient:
        client = RidingClient(connection_pool=connection_pool)
        client.ride_out_s, client.sentinel = conn.client.ride_out_s, conn.client.sentinel
        return client

    class Storage(RedisStorage):
        redis_client = staticmethod(riding_client)

    def make_queue(name: str) -> RedisHuey:
        # results=False: nothing reads Huey results (the store has them), and RedisHuey's results
        # hash would grow forever. clean_name=False keeps the prefix readable in Huey's key names.
        return RedisHuey(
            name=f"{conn.prefix}.{name}",
            connection_pool=conn.pool,
            results=False,
            utc=True,
            clean_name=False,
            storage_class=Storage,
        )

    return make_queue
