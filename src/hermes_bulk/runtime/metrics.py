"""Prometheus metrics of a worker: `hermes-bulk worker --metrics-port N`, text format at /metrics.

Counters are this process's (what it completed, failed, waited, spent); gauges read the backend
(queue depth, each running job's items), so a fleet is watched the way operators watch
everything else. The exposition format is small enough to write out, so no client library.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger("hermes_bulk.runtime.metrics")


@dataclass
class WorkerCounters:
    """What one worker process did; the pipeline counts, the metrics endpoint reads."""

    items_completed: int = 0
    items_failed: int = 0
    requests: int = 0
    rate_limit_waits: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **amounts: int) -> None:
        with self._lock:
            for name, amount in amounts.items():
                setattr(self, name, getattr(self, name) + amount)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {
                f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")
            }


_COUNTER_HELP = {
    "items_completed": "Items this worker completed.",
    "items_failed": "Items this worker marked failed.",
    "requests": "Model requests this worker sent.",
    "rate_limit_waits": "HTTP 429 answers this worker received (each starts or extends a shared "
    "wait).",
    "tokens_in": "Input tokens the provider reported for this worker's completed items.",
    "tokens_out": "Output tokens the provider reported for this worker's completed items.",
}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(
    worker_id: str,
    counters: dict[str, int],
    in_flight: int,
    queue_depth: int | None,
    jobs: list[tuple[str, dict[str, int]]],
) -> str:
    """The text exposition format (version 0.0.4)."""
    w = f'worker="{_escape(worker_id)}"'
    out: list[str] = []
    for name, help_text in _COUNTER_HELP.items():
        metric = f"hermes_bulk_{name}_total"
        out += [
            f"# HELP {metric} {help_text}",
            f"# TYPE {metric} counter",
            f"{metric}{{{w}}} {counters[name]}",
        ]
    out += [
        "# HELP hermes_bulk_items_in_flight Items this worker is processing now.",
        "# TYPE hermes_bulk_items_in_flight gauge",
        f"hermes_bulk_items_in_flight{{{w}}} {in_flight}",
    ]
    if queue_depth is not None:
        out += [
            "# HELP hermes_bulk_queue_depth Triggers waiting on the queues this worker serves.",
            "# TYPE hermes_bulk_queue_depth gauge",
            f"hermes_bulk_queue_depth {queue_depth}",
        ]
    out += [
        "# HELP hermes_bulk_job_items Items of each running job (run, not paused, not finished), "
        "by state.",
        "# TYPE hermes_bulk_job_items gauge",
    ]
    for job_id, counts in jobs:
        for state, n in counts.items():
            out.append(f'hermes_bulk_job_items{{job="{_escape(job_id)}",state="{state}"}} {n}')
    return "\n".join(out) + "\n"


def serve(host: str, port: int, page: Callable[[], str]) -> ThreadingHTTPServer:
    """Serve page() at /metrics from a daemon thread; returns the server (its port is bound)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server interface
            if self.path.split("?")[0] not in ("/metrics", "/"):
                self.send_error(404)
                return
            try:
                body = page().encode()
            except Exception as exc:  # a backend outage must not kill the endpoint
                log.warning("metrics: %s", exc)
                self.send_error(503, "backend unavailable")
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="hermes-bulk-metrics", daemon=True).start()
    return server
