"""Pins the huey behaviour the embedded consumer relies on (a private method: huey is pinned)."""

from __future__ import annotations

import threading

from huey import SqliteHuey

from hermes_bulk.tasks import EmbeddedConsumer, consumer_options

from .helpers import wait_for


def test_an_embedded_consumer_starts_off_the_main_thread_and_stops_cleanly(tmp_path):
    huey = SqliteHuey("t", filename=str(tmp_path / "q.db"), results=False)
    done = []

    @huey.task()
    def work(n):
        done.append(n)

    errors = []

    def host():
        try:
            consumer = EmbeddedConsumer(huey, **consumer_options(2))
            consumer.start()  # huey's own start() would fail here: signals need the main thread
            for n in range(20):
                work(n)
            wait_for(lambda: len(done) == 20, message="tasks")
            consumer.stop(graceful=True)
        except Exception as exc:  # reported to the main thread
            errors.append(exc)

    t = threading.Thread(target=host)
    t.start()
    t.join(30)
    assert errors == [] and sorted(done) == list(range(20))
    assert not [th for th in threading.enumerate() if th.name.startswith(("Worker-", "Scheduler"))]
