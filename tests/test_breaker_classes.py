"""The breaker's classes as pure functions, status by status: which HTTP answers say no item
can succeed (the job pauses at once), which are an item's own failure, and what `doctor` says of
each. Every status of a class is here with its neighbours, so taking one out of a set fails."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hermes_bulk.config.provider import ANTHROPIC, OPENAI
from hermes_bulk.errors import (
    EndpointUnreachable,
    PermanentModelError,
    RateLimited,
    TransientModelError,
)
from hermes_bulk.providers import doctor
from hermes_bulk.providers.client import classify_status
from hermes_bulk.runtime.breaker import EndpointBreaker, pause_reason, refuses_key, trips

#: status -> (class, trips at once, the key refused); the neighbours of each class included.
STATUSES = {
    400: (PermanentModelError, False, False),
    401: (PermanentModelError, True, True),
    402: (PermanentModelError, False, False),
    403: (PermanentModelError, True, True),
    404: (PermanentModelError, True, False),
    405: (PermanentModelError, False, False),
    407: (PermanentModelError, False, False),
    408: (TransientModelError, False, False),
    409: (TransientModelError, False, False),
    410: (PermanentModelError, False, False),
    413: (PermanentModelError, False, False),
    422: (PermanentModelError, False, False),
    424: (PermanentModelError, False, False),
    425: (TransientModelError, False, False),
    426: (PermanentModelError, False, False),
    429: (RateLimited, False, False),
    451: (PermanentModelError, False, False),
    499: (PermanentModelError, False, False),
    500: (TransientModelError, False, False),
    501: (TransientModelError, False, False),
    502: (TransientModelError, False, False),
    503: (TransientModelError, False, False),
    504: (TransientModelError, False, False),
    529: (TransientModelError, False, False),
    599: (TransientModelError, False, False),
}


@pytest.mark.parametrize("status", sorted(STATUSES))
def test_each_status_has_its_class_and_only_401_403_404_trip(status):
    kind, tripping, refused = STATUSES[status]
    exc = classify_status(status, None)
    assert type(exc) is kind and exc.http_status == status
    assert trips(exc) is tripping
    assert refuses_key(exc) is refused, "the batch path pauses for a refused key only"


def test_what_never_trips_at_once_whatever_status_it_carries():
    # A failure to connect is counted (EndpointBreaker), never a trip, even carrying a status.
    assert not trips(EndpointUnreachable("no route", http_status=404))
    assert not refuses_key(EndpointUnreachable("no route", http_status=401))
    assert not trips(TransientModelError("empty answer"))  # no status at all
    assert not trips(RateLimited())


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_key_is_told_as_such_for_both_statuses(status):
    reason = pause_reason(classify_status(status, None), endpoint="http://e/v1", model="m")
    assert f"refused the API key this job was created with (HTTP {status})" in reason
    assert "http://e/v1" in reason and "does not know" not in reason


def test_an_unknown_model_is_told_as_such():
    reason = pause_reason(classify_status(404, None), endpoint="http://e/v1", model="m")
    assert "does not know the model 'm' (HTTP 404)" in reason and "refused" not in reason


def test_connection_failures_trip_at_the_count_not_one_before():
    now = [0.0]
    breaker = EndpointBreaker(3, clock=lambda: now[0])
    streaks = []
    for second in (0.0, 1.0, 2.0):
        now[0] = second
        verdict = breaker.unreachable(breaker.attempt("k"))
        streaks.append((verdict.streak, verdict.tripped))
    assert streaks == [(1, False), (2, False), (3, True)]


def test_by_default_the_fifth_failure_a_second_apart_trips_and_later_ones_still_do():
    now = [0.0]
    breaker = EndpointBreaker(clock=lambda: now[0])
    verdicts = []
    for second in (0.0, 0.5, 1.5, 2.5, 3.5, 4.5, 5.5):  # 0.5 s after the first: the same moment
        now[0] = second
        verdicts.append(breaker.unreachable(breaker.attempt("k")))
    assert [(v.streak, v.tripped) for v in verdicts] == [
        (1, False), (1, False), (2, False), (3, False), (4, False), (5, True), (6, True)
    ]  # fmt: skip
    assert EndpointBreaker(failures=2).failures == 2


def test_a_request_that_started_before_an_answer_knows_the_endpoint_answered_since():
    breaker = EndpointBreaker(5, clock=lambda: 0.0)
    before = breaker.attempt("k")
    breaker.answered("k")
    assert breaker.unreachable(before).answered_since
    assert not breaker.unreachable(breaker.attempt("k")).answered_since, "none since this one"


def test_failures_exactly_spacing_apart_count_and_just_under_do_not():
    now = [10.0]
    breaker = EndpointBreaker(5, spacing_s=1.0, clock=lambda: now[0])
    assert breaker.unreachable(breaker.attempt("k")).streak == 1
    now[0] = 10.999
    assert breaker.unreachable(breaker.attempt("k")).streak == 1, "the same moment's failure"
    now[0] = 11.0
    assert breaker.unreachable(breaker.attempt("k")).streak == 2, "a spacing apart: counted"


def test_an_answer_resets_the_count_so_failures_after_it_start_again():
    now = [0.0]
    breaker = EndpointBreaker(2, clock=lambda: now[0])
    breaker.unreachable(breaker.attempt("k"))
    breaker.answered("k")
    now[0] = 0.5  # within the spacing of the failure before the answer: counted all the same
    verdict = breaker.unreachable(breaker.attempt("k"))
    assert (verdict.streak, verdict.tripped, verdict.answered_since) == (1, False, False)


# doctor: what its probe request's status says of the key and the model ---------------------------


@pytest.mark.parametrize(
    ("status", "key", "model"),
    [
        (401, doctor.FAIL, doctor.SKIP),
        (403, doctor.FAIL, doctor.SKIP),
        (404, doctor.OK, doctor.FAIL),
        (400, doctor.OK, doctor.WARN),
        (408, doctor.OK, doctor.WARN),
        (429, doctor.WARN, doctor.WARN),
        (500, doctor.WARN, doctor.WARN),
        (503, doctor.WARN, doctor.WARN),
    ],
)
@pytest.mark.parametrize("protocol", [OPENAI, ANTHROPIC])
def test_doctor_reads_each_status_of_the_probe(fake_provider, status, key, model, protocol):
    # GET /models lists fake-model only: a model it does not list is probed with 1 token.
    fake_provider.configure(script=[str(status)])
    report = doctor.check_endpoint(
        fake_provider.base_url, "sk-x", "unlisted-model", timeout_s=5, protocol=protocol
    )
    marks = {c.name: c.mark for c in report.checks}
    assert marks["endpoint"] == doctor.OK and marks["key"] == key
    assert marks["model"] == model
    assert report.usable is (key != doctor.FAIL and model != doctor.FAIL)
    if key == doctor.FAIL:
        assert f"refused (HTTP {status})" in report.text()
    assert [r.protocol for r in fake_provider.requests] == [protocol], "probed in its protocol"


class _Answers(BaseHTTPRequestHandler):
    """GET .../models answers `listing`; any POST (the probe) answers `probe`."""

    listing, probe = 200, 200

    def _answer(self, status: int) -> None:
        body = json.dumps({"data": [{"id": "fake-model"}]} if status == 200 else {}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - the http.server interface
        self._answer(self.listing)

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(self.probe)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def answers():
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Answers", (_Answers,), {}))
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("listing", "key", "model", "probed"),
    [
        (401, doctor.FAIL, doctor.SKIP, False),
        (403, doctor.FAIL, doctor.SKIP, False),  # refused at the listing: no request is paid for
        (404, doctor.OK, doctor.OK, True),  # no listing here: the probe answers for the model
        (400, doctor.OK, doctor.OK, True),
        (500, doctor.OK, doctor.OK, True),
    ],
)
def test_doctor_reads_each_status_of_the_model_listing(answers, listing, key, model, probed):
    answers.RequestHandlerClass.listing = listing
    url = f"http://127.0.0.1:{answers.server_address[1]}/v1"
    report = doctor.check_endpoint(url, "sk-x", "fake-model", timeout_s=5)
    marks = {c.name: c.mark for c in report.checks}
    assert (marks["key"], marks["model"]) == (key, model)
    assert ("1-token request" in report.text()) is probed
    if key == doctor.FAIL:
        assert f"refused (HTTP {listing})" in report.text()
