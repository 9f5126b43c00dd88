"""The Huey side: the huey behaviour the embedded consumer relies on (a private method: huey is
pinned), and how a trigger finds the runtime that serves its queue."""

from __future__ import annotations

import ast
import logging
import threading
from pathlib import Path

from huey import SqliteHuey

from hermes_bulk.fleet import broker
from hermes_bulk.fleet.tasks import EmbeddedConsumer, consumer_options

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


def test_a_trigger_run_where_no_worker_runtime_serves_its_queue_is_logged_and_dropped(
    tmp_path, caplog
):
    backend = broker.build_backend(f"sqlite:///{tmp_path / 'bulk.db'}")
    huey = backend.queue("http")
    consumer = EmbeddedConsumer(huey, **consumer_options(1))
    consumer.start()
    try:
        with caplog.at_level(logging.ERROR, logger="hermes_bulk.fleet.tasks"):
            backend.trigger("job-1", 0, client="http")
            wait_for(
                lambda: "job job-1 arrived in a process without a worker runtime" in caplog.text,
                message="the error",
            )
    finally:
        consumer.stop(graceful=True)
        backend.close()
    assert huey.pending_count() == 0


def test_the_broker_does_not_import_the_worker():
    """The worker imports the broker; a trigger finds its runtime through tasks.serve."""
    tree = ast.parse((Path(broker.__file__)).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "worker" not in imported and not any(m and m.endswith(".worker") for m in imported)
