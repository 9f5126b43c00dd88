"""The worker registry records what each worker serves, alike on both backends
(liveness.can_serve)."""

from __future__ import annotations

import re
import threading
from types import SimpleNamespace

import pytest

from hermes_bulk.config.provider import Endpoint
from hermes_bulk.fleet import broker, endpoints
from hermes_bulk.fleet.liveness import can_serve, offer, serves_record
from hermes_bulk.store.protocol import JobSpec, WorkerInfo

BACKENDS = ["sqlite", "redis"]


@pytest.fixture(params=BACKENDS)
def url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'bulk.db'}"
    return request.getfixturevalue("redis_url")


@pytest.fixture
def store(url):
    backend = broker.build_backend(url)
    yield backend.store
    backend.close()


def test_the_fingerprint_salt_is_made_once_and_the_same_for_every_opener(url, store):
    """None until someone needs it (a dry run asks without making it); then one salt, with its
    cost, whoever makes it first among threads and openers."""
    assert store.fingerprint_salt(create=False) is None
    other = broker.build_backend(url)
    try:
        found: list[str] = []
        threads = [
            threading.Thread(target=lambda s=s: found.append(s.fingerprint_salt()))
            for s in (store, other.store) * 4
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(set(found)) == 1 and len(found) == 8
        assert re.fullmatch(r"scrypt\$10\$8\$1\$[0-9a-f]{32}", found[0]), found[0]
        assert other.store.fingerprint_salt(create=False) == found[0]
    finally:
        other.close()


def _job(job_id: str, **spec) -> SimpleNamespace:
    """What can_serve reads of a job: its id and spec."""
    return SimpleNamespace(
        job_id=job_id,
        spec=JobSpec(
            job_id=job_id,
            instruction="i",
            source="/s",
            source_kind="file",
            concurrency=2,
            retries=0,
            **spec,
        ),
    )


def _fingerprint(key: str, salt: str) -> str:
    return endpoints.key_fingerprint(Endpoint("openai", "http://a.example/v1", key), salt)


def test_the_registry_keeps_what_a_worker_serves(store):
    salt = store.fingerprint_salt()
    own = endpoints.own_route(Endpoint("openai", "http://a.example/v1", "sk-a"), salt)
    store.heartbeat_worker(
        WorkerInfo("w-all", "h", 1, store.now(), 0.0, 4, serves_record([own, "http"])), ttl_s=10
    )
    store.heartbeat_worker(
        WorkerInfo(
            "w-one", "h", 2, store.now(), 0.0, 2, serves_record([own, "http"], only_job="j1")
        ),
        ttl_s=10,
    )
    store.heartbeat_worker(WorkerInfo("w-old", "h", 3, store.now(), 0.0, 1), ttl_s=10)
    live = {w.worker_id: w for w in store.live_workers(holding=False)}
    assert live["w-all"].serves == f"{own},http" and live["w-old"].serves == ""
    mine = _job("j1", endpoint="http://a.example/v1", key_fingerprint=_fingerprint("sk-a", salt))
    other_key = _job(
        "j2", endpoint="http://a.example/v1", key_fingerprint=_fingerprint("sk-b", salt)
    )
    legacy = _job("j3")
    hermes = _job("j4", client="hermes")
    assert [can_serve(live[w], mine) for w in ("w-all", "w-one", "w-old")] == [True, True, False]
    assert [can_serve(live[w], other_key) for w in ("w-all", "w-one", "w-old")] == [
        False,
        False,
        False,
    ]
    assert [can_serve(live[w], legacy) for w in ("w-all", "w-one", "w-old")] == [True, False, True]
    assert not any(can_serve(w, hermes) for w in live.values())


def test_the_registry_keeps_what_a_worker_says_it_serves(store):
    """The endpoint (a comma and a masked key in it), protocol and batches a worker writes come
    back as written, and an entry rewritten by the next heartbeat says what it says then."""
    url = "https://gw.example/v1?deployment=a,b&api-key=***"
    said = serves_record(["http@abc", "http"], endpoint=url, protocol="anthropic", batches=True)
    store.heartbeat_worker(WorkerInfo("w-new", "h", 1, store.now(), 0.0, 4, said), ttl_s=10)
    (entry,) = store.live_workers(holding=False)
    o = offer(entry)
    assert (o.routes, o.endpoint, o.protocol, o.batches) == (
        frozenset(["http@abc", "http"]),
        url,
        "anthropic",
        True,
    )
    again = serves_record(
        ["http@abc", "http"], "j1", endpoint=url, protocol="openai", batches=False
    )
    store.heartbeat_worker(WorkerInfo("w-new", "h", 1, store.now(), 0.0, 4, again), ttl_s=10)
    (entry,) = store.live_workers(holding=False)
    assert (offer(entry).only_job, offer(entry).protocol, offer(entry).batches) == (
        "j1",
        "openai",
        False,
    )
