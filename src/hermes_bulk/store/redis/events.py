"""A job's events on Redis: a list of the newest EVENTS_KEPT, appended by the script of the
change they record or alone, and read newest last (the JobStore protocol, store/protocol.py;
mixed into RedisJobStore)."""

from __future__ import annotations

from collections.abc import Iterable

from ..protocol import Event
from . import codec
from .connection import map_connection_errors


@map_connection_errors
class RedisEvents:
    """Events (self.r, self.keys and self.lua come from RedisJobStore)."""

    def add_events(self, job_id: str, events: Iterable[Event]) -> None:
        events = list(events)
        if events:
            skipped = sum(e.kind == "skipped" for e in events)
            self.lua.add_events(
                keys=self.keys.job(job_id), args=[skipped, *codec.event_args(events)]
            )

    def list_events(self, job_id: str, limit: int = 100, *, item: int | None = None) -> list[Event]:
        if limit <= 0:
            return []
        events = self.keys.job_key(job_id, "events")
        if item is None:
            return [codec.parse_event(e) for e in self.r.lrange(events, -limit, -1)]
        # No index on an item's events: the job's kept events, read whole.
        mine = [
            e for e in map(codec.parse_event, self.r.lrange(events, 0, -1)) if e.item_index == item
        ]
        return mine[-limit:]
