"""An answer that came back while Redis was down is saved once Redis is back, not asked for again
(pipeline.ItemProcessor saves an outcome through a backend outage of up to a lease).

Real parts: a redis-server this test owns (stopped as a service restart stops it, then started
again on the same port and files), the loopback provider, the HTTP client.
"""

from __future__ import annotations

import threading

from hermes_bulk.fleet import broker
from hermes_bulk.providers.client import HttpModelClient
from hermes_bulk.runtime.pipeline import ItemProcessor
from hermes_bulk.runtime.saving import output_path
from hermes_bulk.store.protocol import COMPLETED

from .helpers import running_job


def test_an_answer_received_during_a_redis_restart_is_saved_when_redis_is_back(
    tmp_path, fake_provider, own_redis
):
    server = own_redis
    backend = broker.build_backend(server.url)
    job_id = running_job(backend.store, "outage1", ["item 0"])
    http = HttpModelClient(
        base_url=fake_provider.base_url, api_key="k", model="fake-model", timeout_s=10
    )
    restarted = threading.Event()

    class AnswerThenRestart:
        """The real client; once the answer is in, Redis goes down for about a second."""

        provider_key, rate = http.provider_key, None

        def announced(self):
            return http.announced()

        def complete(self, *args, **kwargs):
            answer = http.complete(*args, **kwargs)
            server.stop()  # SIGTERM: the append-only file is written, nothing is lost

            def back() -> None:
                server.start()
                restarted.set()

            threading.Timer(1.0, back).start()
            return answer

    processor = ItemProcessor(
        store=backend.store,
        limits=backend.limits,
        worker_id="w1",
        client_for=lambda job: AnswerThenRestart(),
        jobs_dir=tmp_path / "jobs",
        lease_s=60,
        concurrency_cap=4,
    )
    try:
        outcome = processor.handle(job_id, 0)
        assert restarted.is_set(), "the save waited for Redis to come back"
        assert (outcome.claimed, outcome.index) == (True, 0)
        assert backend.store.get_item(job_id, 0).item.status == COMPLETED
        assert len(fake_provider.requests) == 1, "the answer was not asked for again"
        assert output_path(tmp_path / "jobs", job_id, 0).read_text().strip()
    finally:
        http.close()
        backend.close()
