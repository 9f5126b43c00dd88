"""What a worker serves and what it calls: its routes (the queues it consumes), which jobs it
takes, and the model clients and Batch API it sends their requests with."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from ..config.provider import ANTHROPIC
from ..errors import ClientUnavailable, ConfigError
from ..fleet import endpoints
from ..fleet.liveness import serves_record
from ..providers.anthropic import AnthropicModelClient
from ..providers.batch_api import BatchApi
from ..providers.client import HttpModelClient, ModelClient
from ..providers.message_batches import MessageBatchApi
from ..providers.pacing import provider_key
from ..store.protocol import JobRecord

log = logging.getLogger("hermes_bulk.runtime.worker")

ClientFactory = Callable[[JobRecord], ModelClient]

#: Why a worker without a client for a job's kind leaves the job to others (job.spec.client).
_CANNOT_SERVE = {
    "http": "it was created by hermes-bulk create, and this worker serves only jobs created in "
    "Hermes; "
    "process it with: hermes-bulk run JOB --wait, or a hermes-bulk worker",
    "hermes": "it was created in Hermes, and this worker cannot call Hermes' model (that needs "
    "hermes-agent "
    "installed here and HERMES_HOME set to the profile the job was created in)",
}


class Serving:
    """What a worker serves (a part of WorkerRuntime, worker.py, whose state it uses)."""

    @property
    def salt(self) -> str:
        if self._salt is None:
            self._salt = self.backend.store.fingerprint_salt()
        return self._salt

    @functools.cached_property
    def own_route(self) -> str:
        """The queue of jobs made for this worker's endpoint and credentials (fleet/endpoints.py):
        its fingerprint is computed here, once."""
        return endpoints.own_route(self.endpoint, self.salt)

    @functools.cached_property
    def old_route(self) -> str | None:
        """The route of its endpoint without every credential bound (fleet/endpoints.legacy_route),
        which some jobs record, when that differs: consumed on one thread, chains go on on
        own_route."""
        route = endpoints.legacy_route(self.endpoint)
        return None if route == self.own_route else route

    def _own_routes(self) -> tuple[str, str | None]:
        """own_route and old_route, read (a fingerprint, the store's salt) only by an HTTP
        worker."""
        if endpoints.HTTP not in self.clients:
            return "", None
        return self.own_route, self.old_route

    def routes(self) -> list[str]:
        """The routes (queues) this worker consumes (fleet/endpoints.worker_routes)."""
        return endpoints.worker_routes(self.clients, *self._own_routes())

    def route_of(self, job: JobRecord) -> str:
        return endpoints.served_route(job.spec, *self._own_routes())

    def serves(self, job: JobRecord) -> bool:
        """Whether this worker takes the job's items: its kind and endpoint, and (run JOB --wait)
        its id."""
        if self.only_job is not None and job.job_id != self.only_job:
            return False
        return endpoints.serves(
            job.spec, self.clients, *self._own_routes(), batches=self.batch_driver is not None
        )

    def serves_record(self) -> str:
        """What this worker serves, as its registry entry says it (liveness.serves_record): its
        routes, the one job of `run JOB --wait`, and in words its endpoint, protocol and whether
        it runs provider batches, for `workers` and `status` to show."""
        http = endpoints.HTTP in self.clients
        return serves_record(
            self.routes(),
            self.only_job,
            endpoint=endpoints.endpoint_url(self.endpoint.base_url) if http else None,
            protocol=self.endpoint.protocol if http else None,
            batches=self.batch_driver is not None,
        )

    def _say_unserved(self, job: JobRecord) -> None:
        """Once per job: an HTTP job made for another endpoint or key is left to its workers."""
        if job.spec.client != endpoints.HTTP or job.job_id in self._told_unserved:
            return
        if self.only_job is not None and job.job_id != self.only_job:
            return
        self._told_unserved.add(job.job_id)
        own = endpoints.endpoint_url(self.endpoint.base_url)
        if job.spec.endpoint != own:
            why = f"and this worker calls {own}"
        elif job.spec.protocol != self.endpoint.protocol:
            why = f"to speak {job.spec.protocol}, and this worker speaks {self.endpoint.protocol}"
        else:
            why = "with other credentials than this worker's"
        log.info(
            "job %s is left to workers of its endpoint: it was created for %s %s",
            job.job_id,
            job.spec.endpoint,
            why,
        )

    def _api_key(self) -> str | None:
        return self.endpoint.api_key

    def client_for(self, job: JobRecord) -> ModelClient:
        """The model client for a job; ClientUnavailable when this worker does not serve its
        kind."""
        factory = self.clients.get(job.spec.client)
        if factory is None:
            raise ClientUnavailable(
                _CANNOT_SERVE.get(
                    job.spec.client, f"this worker has no {job.spec.client!r} model client"
                )
            )
        return factory(job)

    def http_client_for(self, job: JobRecord) -> ModelClient:
        """The endpoint in HERMES_BULK_* (jobs created by `hermes-bulk create`)."""
        model = job.spec.model or self.settings.model
        if not model:
            raise ConfigError(
                "No model configured: set HERMES_BULK_MODEL or pass --model to create."
            )
        endpoint = self.endpoint
        key = (endpoint.base_url, model)
        with self._clients_lock:
            client = self._clients.get(key)
            if client is None:
                speaker = (
                    AnthropicModelClient if endpoint.protocol == ANTHROPIC else HttpModelClient
                )
                client = self._clients[key] = speaker(
                    base_url=endpoint.base_url,
                    api_key=endpoint.api_key,
                    model=model,
                    timeout_s=self.settings.request_timeout_seconds,
                    max_connections=max(4, self.threads),
                    provider_key=provider_key(endpoint.base_url, endpoint.api_key, self.salt),
                )
            return client

    def _batch_api_for(self, job: JobRecord) -> BatchApi:
        """The Batch API of the endpoint in HERMES_BULK_* (one per worker; its calls share the key's
        limits)."""
        with self._clients_lock:
            api = self._batch_apis.get(self.endpoint.base_url)
            if api is None:
                speaker = MessageBatchApi if self.endpoint.protocol == ANTHROPIC else BatchApi
                api = self._batch_apis[self.endpoint.base_url] = speaker(
                    base_url=self.endpoint.base_url,
                    api_key=self.endpoint.api_key,
                    provider_key=job.spec.provider_key,
                    limits=self.backend.limits,
                    timeout_s=self.settings.request_timeout_seconds,
                    rpm=job.spec.rpm,
                )
            return api

    def queues(self) -> list:
        """The Huey queues this worker consumes: one per route (routes)."""
        return [self.backend.queue(route) for route in self.routes()]

    def queue_threads(self) -> list[int]:
        """Threads per queue (queues' order): `threads`, but one on the kind's HTTP queue and on
        the legacy route, where only triggers of jobs that recorded no endpoint, or the old
        fingerprint, arrive (their chains go on on this worker's own endpoint's queue)."""
        single = (endpoints.HTTP, self.old_route)
        return [1 if route in single else self.threads for route in self.routes()]
