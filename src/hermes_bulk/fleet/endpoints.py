"""Which endpoint a job belongs to, and the queue its triggers travel on.

A job made by `hermes-bulk create` records the endpoint it was created for: its public URL
(redact.public_url: no password, no secret query value) and a fingerprint of the key. Only a
worker configured with the same URL and key takes its items: its triggers go to a queue of that
endpoint (a route), which only such workers consume, so a trigger is never taken by a worker
that cannot serve it, and no claim has to be refused and re-sent (no cost per item).

The fingerprint (credentials.py) covers every credential the endpoint's requests carry: the
key header, the URL's userinfo and its query. It is a slow salted hash (scrypt, the salt stored
once per store): one process computes it once per credential, and a guess read from the store
costs one scrypt.

Jobs recorded with the fingerprint that came before (an HMAC of the header key alone) are still
served by a worker whose credentials that fingerprint described in full: a header key, and none
in its URL (legacy_route). One recorded with a key in its URL recorded none then, and no worker
serves it now: it must be created again.

Jobs from a store made before endpoints were recorded have none: any worker with an HTTP
endpoint serves them (their triggers go to the queue of the kind, "http"; a worker that takes
one from there keeps its chain on its own endpoint's queue).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from urllib.parse import urlsplit

from .. import credentials
from ..config.provider import OPENAI, Endpoint
from ..redact import public_url, url_secrets
from ..store.protocol import JobSpec

HTTP = "http"


def key_fingerprint(endpoint: Endpoint, salt_record: str) -> str:
    """The fingerprint of every credential the endpoint sends ("" when it sends none), with the
    store's salt (JobStore.fingerprint_salt): equal credentials, equal fingerprints."""
    return credentials.fingerprint(
        credentials.credentials(endpoint.base_url, endpoint.api_key), salt_record
    )


def endpoint_url(base_url: str) -> str:
    """The endpoint as a job records and shows it: its public URL, without a trailing slash."""
    return public_url(base_url.rstrip("/"))


def identity(url: str, fingerprint: str, protocol: str = OPENAI) -> str:
    """The route of an endpoint: the queue of its jobs' triggers (a hash: a URL makes no queue
    name). The protocol is part of it, as one proxy URL may speak both; an OpenAI endpoint's
    has no protocol part, so the routes a store already holds keep matching."""
    tail = "" if protocol == OPENAI else f"\0{protocol}"
    return HTTP + "@" + hashlib.sha256(f"{url}\0{fingerprint}{tail}".encode()).hexdigest()[:16]


def own_route(endpoint: Endpoint, salt_record: str) -> str:
    """The route of the endpoint these settings configure."""
    return identity(
        endpoint_url(endpoint.base_url), key_fingerprint(endpoint, salt_record), endpoint.protocol
    )


def legacy_route(endpoint: Endpoint) -> str | None:
    """The route jobs of this endpoint recorded before every credential bound them, when their
    fingerprint (the header key's) described all of this endpoint's credentials; else None."""
    if _url_credentials(endpoint.base_url):
        return None
    return identity(
        endpoint_url(endpoint.base_url),
        credentials.legacy_fingerprint(endpoint.api_key),
        endpoint.protocol,
    )


def _url_credentials(url: str) -> bool:
    """Whether the URL carries a credential the public URL hides (userinfo, a secret query)."""
    try:
        netloc = urlsplit(url).netloc
    except ValueError:
        return True
    return "@" in netloc or bool(url_secrets(url))


def spec_identity(spec: JobSpec) -> str:
    """The route of the endpoint a job was created for ("" for one that recorded none)."""
    if spec.endpoint is None:
        return ""
    return identity(spec.endpoint, spec.key_fingerprint or "", spec.protocol)


def route(spec: JobSpec, legacy_http: str | None = None) -> str:
    """The queue a job's triggers travel on: its endpoint's for an HTTP job that recorded one;
    for one that did not (made before endpoints were recorded), legacy_http (the route of the
    worker that asks) or the kind's queue; the kind's for other kinds (Hermes' model)."""
    if spec.client != HTTP:
        return spec.client
    if spec.endpoint is None:
        return legacy_http or HTTP
    return spec_identity(spec)


def worker_routes(kinds: Collection[str], own: str, old: str | None) -> list[str]:
    """The routes (queues) a worker consumes: per kind of job it has a model client for; for
    HTTP, its own endpoint's (own), the kind's (jobs that recorded no endpoint) and the route its
    jobs recorded before every credential bound them (old, legacy_route, when it differs)."""
    routes: list[str] = []
    for kind in kinds:
        if kind != HTTP:
            routes.append(kind)
            continue
        routes += [own, HTTP]
        routes += [old] if old else []
    return routes


def served_route(spec: JobSpec, own: str, old: str | None) -> str:
    """The route a job's triggers take to the worker of own and old: a job of its legacy route
    goes on on its own, as does one that recorded no endpoint."""
    found = route(spec, own)
    return own if found == old else found


def serves(
    spec: JobSpec, kinds: Collection[str], own: str, old: str | None, *, batches: bool = True
) -> bool:
    """Whether the worker of these kinds and routes takes the job's items; a batch job's only
    when it runs provider batches (`batches`: every worker with an HTTP endpoint does)."""
    return (
        spec.client in kinds
        and served_route(spec, own, old) in worker_routes(kinds, own, old)
        and (spec.mode != "batch" or batches)
    )
