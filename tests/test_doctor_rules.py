"""`doctor`, check by check, against a loopback HTTP server in this process: what each answer of
GET /models and of the 1-token probe says of the endpoint, the key and the model, in each
protocol; the endpoint not reached, silent, hanging up or dripping; the headers and the probe it
sends; the provider's text kept to the log. Each status beside its neighbours (401 and 403
beside 400 and 402; 429 and 500 beside 428, 430 and 499). No fixture of tests/conftest.py: this
file is what `scripts/mutate doctor` runs per mutant (tests/test_breaker_classes.py holds the
same statuses against the project's loopback provider)."""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from hermes_bulk.providers import anthropic, doctor

from .helpers import without_proxies

KEY = "sk-doctor-test"
#: The provider's own words in an error answer: they go to the log, never to the screen.
PROVIDER_TEXT = "provider-says-" + "z" * 2500


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def _serve(self, how) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.seen.append((self.command, self.path, dict(self.headers.items()), body))
        if how == "close":  # hang up without a word
            self.close_connection = True
            return
        if how == "hang":
            self.server.stop.wait(10)
            self.close_connection = True
            return
        status, payload = how
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.server.drip_s:  # the headers at once, then a byte at a time
            for byte in payload:
                if self.server.stop.wait(self.server.drip_s):
                    return
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
        else:
            self.wfile.write(payload)

    def do_GET(self) -> None:  # noqa: N802 - the http.server interface
        self._serve(self.server.listing)

    def do_POST(self) -> None:  # noqa: N802
        self._serve(self.server.probe)

    def log_message(self, *args) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.seen: list[tuple[str, str, dict[str, str], bytes]] = []
        self.stop = threading.Event()
        self.drip_s = 0.0
        self.listing = self.probe = _answer(200, ["fake-model"])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


def _answer(status: int, models: list | None = None, text: str | None = None):
    """(status, body): a model listing of these ids, else an error with the provider's text."""
    if models is not None:
        return status, json.dumps({"object": "list", "data": [{"id": m} for m in models]}).encode()
    return status, json.dumps({"error": {"message": text or PROVIDER_TEXT}}).encode()


_TLS: list = []


@pytest.fixture
def server(monkeypatch):
    # Every check here speaks plain HTTP: one TLS context (httpx makes one per client, 80 ms
    # here) for all of them makes this file quick enough to run per mutant.
    _TLS or _TLS.append(httpx._config.create_ssl_context())  # noqa: SLF001
    monkeypatch.setattr(httpx._transports.default, "create_ssl_context", lambda **_: _TLS[0])  # noqa: SLF001
    without_proxies(monkeypatch)
    srv = _Server()
    threading.Thread(target=srv.serve_forever, args=(0.02,), daemon=True).start()
    yield srv
    srv.stop.set()
    srv.shutdown()
    srv.server_close()


def _read(protocol: str) -> str:
    """The protocol as the settings give it: an equal string, not the constant itself."""
    return "".join(list(protocol))


def _check(server, model="fake-model", key=KEY, *, protocol=doctor.OPENAI, timeout_s=5.0):
    report = doctor.check_endpoint(
        server.url, key, model, timeout_s=timeout_s, protocol=_read(protocol)
    )
    return report, {c.name: (c.mark, c.text) for c in report.checks}


def _marks(report) -> list[tuple[str, str]]:
    return [(c.name, c.mark) for c in report.checks]


# The lines it prints ------------------------------------------------------------------------


def test_a_check_is_one_line_of_mark_name_and_words_and_a_fail_makes_the_report_unusable():
    line = doctor.Check("key", doctor.OK, "accepted").line
    assert line == "ok   key      accepted"
    assert doctor.Check("endpoint", doctor.FAIL, "x").line == "FAIL endpoint x"
    report = doctor.Report("http://e/v1")
    assert report.usable and report.text() == "" and report.seconds == 0.0
    report.add("endpoint", doctor.OK, "answers")
    report.add("key", doctor.WARN, "not refused")
    report.add("model", doctor.SKIP, "not checked")
    assert report.usable, "a warning or a skip is no reason to refuse"
    assert (
        report.text()
        == "ok   endpoint answers\nwarn key      not refused\n--   model    not checked"
    )
    report.add("model", doctor.FAIL, "unknown")
    assert not report.usable
    with pytest.raises(dataclasses.FrozenInstanceError):  # a line once made stays as it is
        report.checks[0].mark = doctor.FAIL  # type: ignore[misc]


# GET /models --------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", [doctor.OPENAI, doctor.ANTHROPIC])
def test_a_listed_model_is_confirmed_by_the_listing_alone_with_the_key_sent_as_the_protocol_wants(
    server, protocol
):
    started = time.monotonic()
    report, checks = _check(server, protocol=protocol)
    took = time.monotonic() - started
    assert _marks(report) == [("endpoint", "ok"), ("key", "ok"), ("model", "ok")]
    assert checks["endpoint"][1] == f"{server.url} answers (GET /models: HTTP 200)"
    assert checks["key"][1] == "accepted"
    assert checks["model"][1] == "'fake-model' is listed by the endpoint"
    assert report.usable and 0 < report.seconds <= took, "the seconds the check took"
    ((method, path, headers, _),) = server.seen  # nothing is paid for
    assert (method, path) == ("GET", "/v1/models")
    headers = {k.lower(): v for k, v in headers.items()}
    if protocol == doctor.ANTHROPIC:
        assert headers["x-api-key"] == KEY and "authorization" not in headers
        assert headers["anthropic-version"] == anthropic.API_VERSION
    else:
        assert headers["authorization"] == f"Bearer {KEY}" and "x-api-key" not in headers


@pytest.mark.parametrize("protocol", [doctor.OPENAI, doctor.ANTHROPIC])
def test_without_a_key_none_is_sent_and_the_line_says_where_to_set_one(server, protocol):
    report, checks = _check(server, key=None, protocol=protocol)
    headers = {k.lower() for k in server.seen[0][2]}
    assert "authorization" not in headers and "x-api-key" not in headers
    env = "ANTHROPIC_API_KEY" if protocol == doctor.ANTHROPIC else "OPENAI_API_KEY"
    assert checks["key"] == (
        doctor.OK,
        f"none set (HERMES_BULK_API_KEY, {env}); the endpoint answered without one",
    )
    assert report.usable


def test_the_endpoint_is_shown_without_its_credentials_or_a_trailing_slash(server):
    url = server.url.replace("http://", "http://user:hunter2@") + "/"
    report = doctor.check_endpoint(url, KEY, "fake-model", timeout_s=5)
    assert report.endpoint == server.url.replace("http://", "http://user:***@")
    assert "hunter2" not in report.text() and report.usable


@pytest.mark.parametrize("status", [401, 403])
@pytest.mark.parametrize("key", [KEY, None])
@pytest.mark.parametrize("protocol", [doctor.OPENAI, doctor.ANTHROPIC])
def test_a_listing_that_refuses_the_key_says_so_and_sends_no_probe(server, status, key, protocol):
    server.listing = _answer(status)
    report, checks = _check(server, key=key, protocol=protocol)
    env = "ANTHROPIC_API_KEY" if protocol == doctor.ANTHROPIC else "OPENAI_API_KEY"
    assert checks["endpoint"] == (doctor.OK, f"{server.url} answers (GET /models: HTTP {status})")
    if key:
        want = f"refused (HTTP {status}): correct HERMES_BULK_API_KEY (or {env})"
    else:
        want = (
            f"none set, and the endpoint wants one (HTTP {status}): set HERMES_BULK_API_KEY "
            f"(or {env})"
        )
    assert checks["key"] == (doctor.FAIL, want)
    assert checks["model"] == (doctor.SKIP, "not checked (the key was refused)")
    assert len(report.checks) == 3 and not report.usable
    assert [m for m, *_ in server.seen] == ["GET"], "no request is paid for"


@pytest.mark.parametrize("status", [201, 400, 402, 404, 500])
@pytest.mark.parametrize("names_it", [False, True])
def test_a_listing_that_fails_otherwise_leaves_the_model_to_the_probe(server, status, names_it):
    """Only a 200 listing is believed, even when an error answer's body names the model."""
    server.listing = _answer(status, ["fake-model"] if names_it else None)
    report, checks = _check(server)
    assert _marks(report) == [("endpoint", "ok"), ("key", "ok"), ("model", "ok")]
    assert checks["model"][1] == (
        f"'fake-model' answered a 1-token request (GET /models answered HTTP {status})"
    )
    assert [m for m, *_ in server.seen] == ["GET", "POST"]


@pytest.mark.parametrize(("status", "key_mark"), [(200, doctor.OK), (404, doctor.WARN)])
@pytest.mark.parametrize("model", [None, ""])
def test_no_model_configured_fails_the_model_line(server, status, key_mark, model):
    server.listing = _answer(status, ["fake-model"] if status == 200 else None)
    report, checks = _check(server, model=model)
    assert checks["key"] == (
        key_mark,
        "accepted" if status == 200 else f"not refused (HTTP {status})",
    )
    assert checks["model"] == (
        doctor.FAIL,
        "none configured: set HERMES_BULK_MODEL, or pass --model",
    )
    assert not report.usable and len(server.seen) == 1


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"data": {"id": "fake-model"}}',
        b'{"data": ["fake-model", {"id": 7}, {"name": "fake-model"}]}',
        b'{"models": [{"id": "fake-model"}]}',
    ],
    ids=["not-json", "a-list", "data-not-a-list", "entries-without-a-string-id", "no-data"],
)
def test_a_listing_that_does_not_name_the_model_as_an_id_sends_the_probe(server, body):
    server.listing = (200, body)
    report, checks = _check(server)
    assert [m for m, *_ in server.seen] == ["GET", "POST"]
    assert checks["model"] == (
        doctor.OK,
        "'fake-model' answered a 1-token request (not listed by GET /models)",
    )


def test_the_model_is_found_among_other_ids_and_ids_are_compared_whole(server):
    server.listing = _answer(200, ["other", "fake-model", "fake-model-2"])
    assert _check(server)[1]["model"][0] == doctor.OK and len(server.seen) == 1
    server.seen.clear()
    server.listing = _answer(200, ["fake-model-2", "fake"])
    _check(server)
    assert [m for m, *_ in server.seen] == ["GET", "POST"], "a prefix is not the model"


# The 1-token probe --------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", [doctor.OPENAI, doctor.ANTHROPIC])
def test_the_probe_asks_for_one_token_in_the_protocols_own_path(server, protocol):
    server.listing = _answer(200, ["another-model"])
    report, checks = _check(server, model="unlisted", protocol=protocol)
    (_, _, _, _), (method, path, headers, body) = server.seen
    assert method == "POST"
    assert path == ("/v1/messages" if protocol == doctor.ANTHROPIC else "/v1/chat/completions")
    assert json.loads(body) == {
        "model": "unlisted",
        "messages": [{"role": "user", "content": "Say OK."}],
        "max_tokens": 1,
    }
    headers = {k.lower(): v for k, v in headers.items()}
    assert KEY in (headers.get("x-api-key"), headers.get("authorization", "")[7:])
    assert checks["key"] == (doctor.OK, "accepted")
    assert checks["model"] == (
        doctor.OK,
        "'unlisted' answered a 1-token request (not listed by GET /models)",
    )


#: The probe's status -> (key mark, key text, model mark); {s}: the status.
PROBE = {
    400: (doctor.OK, "not refused (HTTP 400)", doctor.WARN),
    401: (doctor.FAIL, "refused (HTTP 401): correct HERMES_BULK_API_KEY (or {env})", doctor.SKIP),
    402: (doctor.OK, "not refused (HTTP 402)", doctor.WARN),
    403: (doctor.FAIL, "refused (HTTP 403): correct HERMES_BULK_API_KEY (or {env})", doctor.SKIP),
    404: (doctor.OK, "accepted", doctor.FAIL),
    405: (doctor.OK, "not refused (HTTP 405)", doctor.WARN),
    428: (doctor.OK, "not refused (HTTP 428)", doctor.WARN),
    429: (doctor.WARN, "not refused (HTTP 429)", doctor.WARN),
    430: (doctor.OK, "not refused (HTTP 430)", doctor.WARN),
    499: (doctor.OK, "not refused (HTTP 499)", doctor.WARN),
    500: (doctor.WARN, "not refused (HTTP 500)", doctor.WARN),
    503: (doctor.WARN, "not refused (HTTP 503)", doctor.WARN),
}


@pytest.mark.parametrize("status", sorted(PROBE))
@pytest.mark.parametrize("protocol", [doctor.OPENAI, doctor.ANTHROPIC])
def test_each_status_of_the_probe_and_its_neighbours(server, status, protocol, caplog):
    server.listing = _answer(200, ["another-model"])
    server.probe = _answer(status)
    with caplog.at_level(logging.WARNING, logger="hermes_bulk.providers.doctor"):
        report, checks = _check(server, model="unlisted", protocol=protocol)
    env = "ANTHROPIC_API_KEY" if protocol == doctor.ANTHROPIC else "OPENAI_API_KEY"
    key_mark, key_text, model_mark = PROBE[status]
    assert checks["key"] == (key_mark, key_text.format(env=env))
    assert checks["model"][0] == model_mark
    assert report.usable is (doctor.FAIL not in (key_mark, model_mark))
    if status == 404:
        assert checks["model"][1] == (
            "'unlisted' is unknown to the endpoint (not listed by GET /models; a 1-token request "
            "answered HTTP 404): correct HERMES_BULK_MODEL (or --model), or HERMES_BULK_BASE_URL "
            "if it is the wrong endpoint (OpenAI-compatible ones usually end in /v1)"
        )
    elif model_mark == doctor.WARN:
        assert checks["model"][1] == (
            f"'unlisted' not confirmed: a 1-token request answered HTTP {status} (not listed by "
            "GET /models; the provider's text is in the log)"
        )
    # The provider's words: in the log (its first 2,000 characters), never in the report.
    assert PROVIDER_TEXT[:20] not in report.text()
    (logged,) = [r for r in caplog.records if "POST" in r.getMessage()]
    assert (
        logged.args[0] == status
        and logged.args[-1] == json.dumps({"error": {"message": PROVIDER_TEXT}})[:2000]
    )


def test_an_unknown_model_with_no_key_set_warns_of_the_key(server):
    server.listing = _answer(200, ["another-model"])
    server.probe = _answer(404)
    report, checks = _check(server, model="unlisted", key=None)
    assert checks["key"] == (
        doctor.WARN,
        "none set (HERMES_BULK_API_KEY, OPENAI_API_KEY); the endpoint answered without one",
    )
    assert checks["model"][0] == doctor.FAIL


def test_an_answer_of_200_is_not_logged(server, caplog):
    with caplog.at_level(logging.WARNING, logger="hermes_bulk.providers.doctor"):
        report, _ = _check(server)
    assert report.usable and caplog.records == []


# No answer ----------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", [doctor.OPENAI, doctor.ANTHROPIC])
def test_an_endpoint_that_cannot_be_reached_says_where_to_correct_it(server, protocol):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    report = doctor.check_endpoint(url, KEY, "m", timeout_s=5, protocol=_read(protocol))
    env = "ANTHROPIC_BASE_URL" if protocol == doctor.ANTHROPIC else "OPENAI_BASE_URL"
    assert [(c.name, c.mark, c.text) for c in report.checks] == [
        (
            "endpoint",
            doctor.FAIL,
            f"{url} cannot be reached (ConnectError): start it, or correct HERMES_BULK_BASE_URL "
            f"(or {env})",
        ),
        ("key", doctor.SKIP, "not checked (no answer)"),
        ("model", doctor.SKIP, "not checked (no answer)"),
    ]
    assert not report.usable


def test_an_endpoint_that_hangs_up_says_the_request_failed(server):
    server.listing = "close"
    report, checks = _check(server)
    assert checks["endpoint"] == (
        doctor.FAIL,
        f"{server.url}: the request failed (RemoteProtocolError); the details are in the log",
    )
    assert _marks(report) == [("endpoint", "FAIL"), ("key", "--"), ("model", "--")]


def test_a_probe_without_an_answer_leaves_the_key_and_model_unsaid(server):
    server.listing = _answer(200, ["another-model"])
    server.probe = "close"
    report, _ = _check(server, model="unlisted")
    assert _marks(report) == [("endpoint", "ok"), ("endpoint", "FAIL")]
    assert not report.usable


def test_a_silent_endpoint_is_given_up_on_at_the_timeout(server):
    server.listing = "hang"
    started = time.monotonic()
    report, checks = _check(server, timeout_s=0.5)
    assert time.monotonic() - started < 3
    assert checks["endpoint"] == (doctor.FAIL, f"{server.url} did not answer within 0.5 s")
    assert not report.usable


def test_an_answer_that_drips_is_given_up_on_at_the_timeout_however_often_a_byte_comes(server):
    """Every read gets a byte within the timeout; the whole answer does not come within it."""
    server.drip_s = 0.05
    server.listing = _answer(200, ["fake-model"] + ["x" * 30] * 3)  # about 6 s of bytes
    started = time.monotonic()
    report, checks = _check(server, timeout_s=0.6)
    assert time.monotonic() - started < 3
    assert checks["endpoint"] == (doctor.FAIL, f"{server.url} did not answer within 0.6 s")
