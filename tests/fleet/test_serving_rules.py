"""Which worker may serve which job, as pure functions (fleet/endpoints.serves, the worker's own
rule, and liveness.can_serve, the rule `status` reads from the registry): every vintage of job
against every kind of worker, and both rules agree on each."""

from __future__ import annotations

import dataclasses

import pytest

from hermes_bulk import credentials
from hermes_bulk.config.provider import ANTHROPIC, OPENAI, Endpoint
from hermes_bulk.fleet import endpoints
from hermes_bulk.fleet.liveness import (
    NO_BATCHES,
    ONLY_OTHER_JOB,
    OTHER_CREDENTIALS,
    OTHER_ENDPOINT,
    OTHER_KIND,
    UNSAID_ENDPOINT,
    can_serve,
    offer,
    serves_record,
    unserved_because,
)
from hermes_bulk.store.records import JobRecord, JobSpec, WorkerInfo

SALT = credentials.new_salt_record()
URL = "http://models.example:8000/v1"
KEY = "sk-the-key-of-account-a"


def worker(
    base_url: str = URL, key: str | None = KEY, protocol: str = OPENAI, kinds=("http",)
) -> tuple[tuple[str, ...], str, str | None]:
    """(kinds, own route, old route) of a worker of these settings, as WorkerRuntime has them."""
    endpoint = Endpoint(protocol, base_url, key)
    own = endpoints.own_route(endpoint, SALT)
    old = endpoints.legacy_route(endpoint)
    return tuple(kinds), own, None if old == own else old


def job(**spec) -> JobRecord:
    fields = {f.name: None for f in dataclasses.fields(JobRecord) if f.name != "spec"}
    fields.update(state="running", total=1, created_at=0.0)
    base = JobSpec(
        job_id="job1", instruction="i", source="/s", source_kind="csv", concurrency=1, retries=0
    )
    return JobRecord(spec=dataclasses.replace(base, **spec), **fields)


def made_for(base_url=URL, key=KEY, protocol=OPENAI) -> JobRecord:
    """A job `create` makes now for that endpoint and key."""
    endpoint = Endpoint(protocol, base_url, key)
    return job(
        endpoint=endpoints.endpoint_url(base_url),
        key_fingerprint=endpoints.key_fingerprint(endpoint, SALT),
        protocol=protocol,
    )


OLD_FINGERPRINT = job(
    endpoint=endpoints.endpoint_url(URL), key_fingerprint=credentials.legacy_fingerprint(KEY)
)
#: Recorded with a key in its URL under the old fingerprint, which left that key out.
OLD_FINGERPRINT_KEY_IN_URL = job(
    endpoint=endpoints.endpoint_url(URL + "?api-key=query-key-aaaa"),
    key_fingerprint=credentials.legacy_fingerprint(KEY),
)
NO_ENDPOINT = job()  # made before endpoints were recorded
HERMES = job(client="hermes")

WORKERS = {
    "same": worker(),
    "other key": worker(key="sk-the-key-of-account-b"),
    "no key": worker(key=None),
    "other url": worker(base_url="http://models.example:8001/v1"),
    "same url, trailing slash": worker(base_url=URL + "/"),
    "anthropic": worker(protocol=ANTHROPIC),
    "key in url too": worker(base_url=URL + "?api-key=query-key-aaaa"),
    "hermes only": worker(kinds=("hermes",)),
    "hermes and http": worker(kinds=("hermes", "http")),
}

#: job -> the workers that serve it (all others must not).
SERVED_BY = {
    "made now": (made_for(), {"same", "same url, trailing slash", "hermes and http"}),
    "made now, no key": (made_for(key=None), {"no key"}),
    "made now, anthropic": (made_for(protocol=ANTHROPIC), {"anthropic"}),
    "old fingerprint": (OLD_FINGERPRINT, {"same", "same url, trailing slash", "hermes and http"}),
    "old fingerprint, key in url": (OLD_FINGERPRINT_KEY_IN_URL, set()),  # create it again
    "no endpoint recorded": (NO_ENDPOINT, set(WORKERS) - {"hermes only"}),
    "hermes": (HERMES, {"hermes only", "hermes and http"}),
}


#: The settings of each worker above: what its registry entry says in words.
SAID = {
    "same": (URL, OPENAI),
    "other key": (URL, OPENAI),
    "no key": (URL, OPENAI),
    "other url": ("http://models.example:8001/v1", OPENAI),
    "same url, trailing slash": (URL, OPENAI),
    "anthropic": (URL, ANTHROPIC),
    "key in url too": (URL + "?api-key=***", OPENAI),
    "hermes only": (None, None),
    "hermes and http": (URL, OPENAI),
}

#: (job, worker) -> why that worker does not serve that job, for every pair SERVED_BY rules out.
WHY_NOT = {
    "made now": {
        "other key": OTHER_CREDENTIALS,
        "no key": OTHER_CREDENTIALS,
        "other url": OTHER_ENDPOINT,
        "anthropic": OTHER_ENDPOINT,
        "key in url too": OTHER_ENDPOINT,
        "hermes only": OTHER_KIND,
    },
    "made now, no key": {
        "same": OTHER_CREDENTIALS,
        "same url, trailing slash": OTHER_CREDENTIALS,
        "hermes and http": OTHER_CREDENTIALS,
        "other key": OTHER_CREDENTIALS,
        "other url": OTHER_ENDPOINT,
        "anthropic": OTHER_ENDPOINT,
        "key in url too": OTHER_ENDPOINT,
        "hermes only": OTHER_KIND,
    },
    "made now, anthropic": {
        **dict.fromkeys(
            ["same", "same url, trailing slash", "hermes and http", "other key", "no key"],
            OTHER_ENDPOINT,
        ),
        "other url": OTHER_ENDPOINT,
        "key in url too": OTHER_ENDPOINT,
        "hermes only": OTHER_KIND,
    },
    "old fingerprint": {
        "other key": OTHER_CREDENTIALS,
        "no key": OTHER_CREDENTIALS,
        "other url": OTHER_ENDPOINT,
        "anthropic": OTHER_ENDPOINT,
        "key in url too": OTHER_ENDPOINT,
        "hermes only": OTHER_KIND,
    },
    "old fingerprint, key in url": {
        **dict.fromkeys(
            ["same", "same url, trailing slash", "hermes and http", "other key", "no key"],
            OTHER_ENDPOINT,
        ),
        "other url": OTHER_ENDPOINT,
        "anthropic": OTHER_ENDPOINT,
        "key in url too": OTHER_CREDENTIALS,  # the URL shows alike (***): the key differs
        "hermes only": OTHER_KIND,
    },
    "no endpoint recorded": {"hermes only": OTHER_KIND},
    "hermes": {
        name: OTHER_KIND for name in WORKERS if name not in ("hermes only", "hermes and http")
    },
}


def registry_entry(worker_name: str, *, said: bool = True, batches: bool = True) -> WorkerInfo:
    """The entry a worker of these settings heartbeats: its routes and, unless it is of the
    vintage before them (said=False), its endpoint, protocol and batches in words."""
    kinds, own, old = WORKERS[worker_name]
    url, protocol = SAID[worker_name] if said else (None, None)
    routes = endpoints.worker_routes(kinds, own, old)
    return WorkerInfo(
        "w",
        "h",
        1,
        0.0,
        0.0,
        1,
        serves_record(
            routes,
            endpoint=url,
            protocol=protocol,
            batches=("http" in kinds and batches) if said else None,
        ),
    )


@pytest.mark.parametrize("job_name", sorted(SERVED_BY))
@pytest.mark.parametrize("worker_name", sorted(WORKERS))
def test_each_vintage_of_job_is_served_by_its_workers_only(job_name, worker_name):
    record, serving = SERVED_BY[job_name]
    kinds, own, old = WORKERS[worker_name]
    expected = worker_name in serving
    assert endpoints.serves(record.spec, kinds, own, old) is expected
    for said in (False, True):
        info = registry_entry(worker_name, said=said)
        assert can_serve(info, record) is expected, "status agrees with the worker"
    # Why not, in the terms `status` words it; a worker that does not say its endpoint is
    # "unsaid" where one that says it is of another endpoint or key.
    why = WHY_NOT[job_name].get(worker_name)
    assert (why is None) is expected, f"{job_name} / {worker_name}: a reason iff not served"
    assert unserved_because(registry_entry(worker_name), record) == why
    unsaid = UNSAID_ENDPOINT if why in (OTHER_ENDPOINT, OTHER_CREDENTIALS) else why
    assert unserved_because(registry_entry(worker_name, said=False), record) == unsaid


@pytest.mark.parametrize("job_name", ["made now", "no endpoint recorded", "old fingerprint"])
def test_a_batch_job_is_served_only_by_a_worker_that_runs_batches(job_name):
    """The live job beside it is served by both; a worker that does not say (older than the
    record) ran batches: every HTTP worker has since batches came."""
    live, _ = SERVED_BY[job_name]
    batch = dataclasses.replace(live, spec=dataclasses.replace(live.spec, mode="batch"))
    kinds, own, old = WORKERS["same"]
    assert endpoints.serves(batch.spec, kinds, own, old, batches=True)
    assert not endpoints.serves(batch.spec, kinds, own, old, batches=False)
    assert endpoints.serves(live.spec, kinds, own, old, batches=False)
    runs, does_not = registry_entry("same"), registry_entry("same", batches=False)
    assert can_serve(runs, batch) and can_serve(runs, live)
    assert not can_serve(does_not, batch) and can_serve(does_not, live)
    assert unserved_because(does_not, batch) == NO_BATCHES
    assert can_serve(registry_entry("same", said=False), batch)


def test_what_a_worker_says_it_serves_is_read_back_whole():
    """The URL is kept apart from the routes whatever it holds (a comma, a masked key)."""
    url = "https://gw.example/v1?deployment=a,b&api-key=***"
    kinds, own, old = WORKERS["same"]
    routes = endpoints.worker_routes(kinds, own, old)
    entry = WorkerInfo(
        "w",
        "h",
        1,
        0.0,
        0.0,
        1,
        serves_record(routes, "job9", endpoint=url, protocol=ANTHROPIC, batches=False),
    )
    o = offer(entry)
    assert (o.routes, o.only_job, o.endpoint, o.protocol, o.batches, o.reported) == (
        frozenset(routes),
        "job9",
        url,
        ANTHROPIC,
        False,
        True,
    )
    older = offer(WorkerInfo("w", "h", 1, 0.0, 0.0, 1, serves_record(routes)))
    assert (older.endpoint, older.protocol, older.batches, older.reported) == (
        None,
        None,
        None,
        True,
    )
    oldest = offer(WorkerInfo("w", "h", 1, 0.0, 0.0, 1, ""))
    assert (oldest.routes, oldest.reported) == (frozenset(["http"]), False)


def test_a_job_taken_from_an_old_route_goes_on_on_the_workers_own():
    kinds, own, old = WORKERS["same"]
    assert old is not None and old != own
    assert endpoints.served_route(OLD_FINGERPRINT.spec, own, old) == own
    assert endpoints.served_route(NO_ENDPOINT.spec, own, old) == own
    assert endpoints.served_route(made_for().spec, own, old) == own
    assert endpoints.served_route(HERMES.spec, own, old) == "hermes"


def test_a_worker_older_than_the_registry_record_serves_unrecorded_http_jobs_only():
    old_entry = WorkerInfo("w", "h", 1, 0.0, 0.0, 1, "")
    assert can_serve(old_entry, NO_ENDPOINT)
    assert not can_serve(old_entry, made_for()) and not can_serve(old_entry, HERMES)


def test_a_worker_of_one_job_serves_that_job_alone():
    kinds, own, old = WORKERS["same"]
    routes = endpoints.worker_routes(kinds, own, old)
    only = WorkerInfo("w", "h", 1, 0.0, 0.0, 1, serves_record(routes, "job1"))
    assert can_serve(only, made_for())
    other = dataclasses.replace(
        made_for(), spec=dataclasses.replace(made_for().spec, job_id="job2")
    )
    assert not can_serve(only, other)
    assert unserved_because(only, other) == ONLY_OTHER_JOB
    assert unserved_because(only, made_for()) is None


def test_an_openai_route_is_the_one_recorded_before_there_were_two_protocols():
    # Triggers queued by older workers, and jobs routed by them, are found under these names.
    assert endpoints.identity(URL, "abc") == "http@78891553cc0829b1"
    assert endpoints.identity(URL, "abc", OPENAI) == "http@78891553cc0829b1"
    assert endpoints.identity(URL, "abc", ANTHROPIC) == "http@9e495f865784d393"


def test_a_url_that_cannot_be_read_has_no_old_route():
    # Whether it carries a credential cannot be told: the old fingerprint cannot have said all.
    assert endpoints.legacy_route(Endpoint(OPENAI, "http://[models.example/v1", KEY)) is None
    assert endpoints.legacy_route(Endpoint(OPENAI, URL, KEY)) is not None


def test_names_read_from_a_store_route_as_the_constants_do():
    # Strings a store returns are not the module's constants: the same text, another object.
    def read(text: str) -> str:
        return "".join(list(text))

    kinds, own, old = WORKERS["same"]
    record = made_for()
    stored = dataclasses.replace(record.spec, client=read("http"), protocol=read(OPENAI))
    assert endpoints.route(stored) == endpoints.route(record.spec) == own
    assert endpoints.served_route(stored, own, old) == own
    assert endpoints.worker_routes([read("http")], own, old) == [own, "http", old]
