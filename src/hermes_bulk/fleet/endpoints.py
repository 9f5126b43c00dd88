"""Which endpoint a job belongs to, and the queue its triggers travel on.

A job made by `hermes-bulk create` records the endpoint it was created for: its public URL
(redact.public_url: no password, no secret query value) and a fingerprint of the key. Only a
worker configured with the same URL and key takes its items: its triggers go to a queue of that
endpoint (a route), which only such workers consume, so a trigger is never taken by a worker
that cannot serve it, and no claim has to be refused and re-sent (no cost per item).

The fingerprint is HMAC-SHA256 keyed by the API key over a fixed label, cut to 64 bits. It says
whether two keys are the same and nothing else: without the key it cannot be computed, so it
cannot be reversed, and testing a guessed key needs the guess to be the key itself (API keys
carry well over 64 bits of randomness, far beyond a search).

Jobs from a store made before endpoints were recorded have none: any worker with an HTTP
endpoint serves them (their triggers go to the queue of the kind, "http"; a worker that takes
one from there keeps its chain on its own endpoint's queue).
"""

from __future__ import annotations

import hashlib
import hmac

from ..config.provider import OPENAI, Endpoint
from ..redact import public_url
from ..store.protocol import JobSpec

HTTP = "http"
_LABEL = b"hermes-bulk endpoint key fingerprint v1"


def key_fingerprint(api_key: str | None) -> str:
    """A short keyed hash of the key ("" when there is none): equal keys, equal fingerprints."""
    if not api_key:
        return ""
    return hmac.new(api_key.encode("utf-8"), _LABEL, hashlib.sha256).hexdigest()[:16]


def endpoint_url(base_url: str) -> str:
    """The endpoint as a job records and shows it: its public URL, without a trailing slash."""
    return public_url(base_url.rstrip("/"))


def identity(url: str, fingerprint: str, protocol: str = OPENAI) -> str:
    """The route of an endpoint: the queue of its jobs' triggers (a hash: a URL makes no queue
    name). The protocol is part of it, as one proxy URL may speak both; an OpenAI endpoint's
    stays what it was before there were two."""
    tail = "" if protocol == OPENAI else f"\0{protocol}"
    return HTTP + "@" + hashlib.sha256(f"{url}\0{fingerprint}{tail}".encode()).hexdigest()[:16]


def own_route(endpoint: Endpoint) -> str:
    """The route of the endpoint these settings configure."""
    return identity(
        endpoint_url(endpoint.base_url), key_fingerprint(endpoint.api_key), endpoint.protocol
    )


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
