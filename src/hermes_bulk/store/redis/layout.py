"""The per-item records' layout, and the move of a Redis written by an older one.

Layout 2 (keys.py, LAYOUT) keeps each job's per-item records in buckets of BUCKET_ITEMS
indexes, with hashes as bytes (codec.content_field, codec.answer_field); layout 1 kept one
hash per family for the whole job, and hashes in hex. `ensure_layout` runs when a
store opens: once P:layout says "2" it is one GET; before that it moves every job of layout 1
(migrate_layout.lua, PAGE_ITEMS items a script, each item whole) and the answer index's keys
(migrate_answers.lua, a page a script), then sets P:layout. Moving
is idempotent, so a move interrupted anywhere, or run by two processes at once, ends the same.
Processes of the older version must be stopped first: they read and write layout 1 only.
"""

from __future__ import annotations

from .connection import RedisConnection
from .keys import BUCKET_ITEMS, LAYOUT, RedisKeys

#: Items moved per script call (Redis stays responsive during a move of a large job).
PAGE_ITEMS = 1000


def ensure_layout(conn: RedisConnection, keys: RedisKeys) -> int:
    """Move every job still in layout 1 to the current layout; returns the items moved."""
    client, lua = conn.client, conn.lua
    if client.get(keys.layout) == LAYOUT.encode():
        return 0
    moved = 0
    for raw_id in client.zrange(keys.jobs_ids, 0, -1):
        job_id = raw_id.decode()
        if not client.exists(keys.job_key(job_id, "items")):  # new, empty, or moved already
            continue
        top = int(client.hget(keys.job_key(job_id, "meta"), "max_index") or -1)
        for low in range(0, top + 1, PAGE_ITEMS):
            high = min(low + PAGE_ITEMS, top + 1) - 1
            buckets = range(low // BUCKET_ITEMS, high // BUCKET_ITEMS + 1)
            moved += int(
                lua.migrate_layout(keys=keys.job(job_id, buckets=buckets), args=[low, high])
            )
    cursor = b"0"
    while True:  # the answer index: hex keys to their bytes
        cursor = lua.migrate_answers(keys=[keys.answers], args=[cursor])
        if cursor in (b"0", 0):
            break
    client.set(keys.layout, LAYOUT)
    return moved
