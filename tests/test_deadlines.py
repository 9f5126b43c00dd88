"""Every exchange with a provider has a total deadline (DESIGN.md invariant 17): an answer that
drips a byte at a time gives up at the request timeout, as a transient error, wherever it drips
(the headers, a body with a length, a body that ends with the connection); an answer that
drips but ends before the timeout is read whole.

Real parts: the model clients and the Batch API client against a raw socket server on loopback
that answers as slowly as it is told.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from hermes_bulk.errors import EndpointRedirects, TransientModelError
from hermes_bulk.jobs.prompt import build_messages
from hermes_bulk.providers.anthropic import AnthropicModelClient
from hermes_bulk.providers.batch_api import BatchApi, BatchFileCut, BatchRedirected
from hermes_bulk.providers.client import HttpModelClient

from .test_batch_mode import _source
from .test_transport import no_proxies  # noqa: F401

MESSAGES = build_messages("Say it", "line:1", "row", "b2:" + "0" * 32)
TIMEOUT_S = 1.0
#: What the deadline may overrun by: the watchdog's tick, and a loaded CI machine.
SLACK_S = 1.5

ANSWER = json.dumps(
    {
        "id": "c1",
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }
).encode()


class DripServer:
    """Answers each request with `head` and `body`, sending `drip` of them at once every `every_s`
    seconds from byte `from_byte` on (before: all at once)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.stopping = threading.Event()
        self.answer = b""
        self.from_byte = 0
        self.every_s = 0.1
        self.requests = 0
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while not self.stopping.is_set():  # each request the connection carries
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, data = data.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    ),
                    0,
                )
                while len(data) < length:
                    data += conn.recv(65536)
                data = data[length:]
                self.requests += 1
                if not self._send(conn, self.answer):
                    return

    def _send(self, conn: socket.socket, answer: bytes) -> bool:
        try:
            conn.sendall(answer[: self.from_byte])
            for i in range(self.from_byte, len(answer)):
                if self.stopping.wait(self.every_s):
                    return False
                conn.sendall(answer[i : i + 1])
        except OSError:
            return False
        return b"Content-Length" in answer

    def stop(self) -> None:
        self.stopping.set()
        self.sock.close()


@pytest.fixture
def drip():
    server = DripServer()
    yield server
    server.stop()


def _response(body: bytes, *, length: bool = True) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    head += b"Content-Length: %d\r\n" % len(body) if length else b"Connection: close\r\n"
    return head + b"\r\n" + body


#: Where the answer starts to drip: its status line, its headers' end, its body.
WHERE = {
    "status-line": lambda a: 3,
    "headers": lambda a: a.index(b"\r\n\r\n") - 5,
    "body": lambda a: a.index(b"\r\n\r\n") + 10,
}


@pytest.mark.parametrize("length", [True, False], ids=["with-length", "until-close"])
@pytest.mark.parametrize("where", list(WHERE))
def test_an_answer_that_drips_gives_up_at_the_request_timeout(drip, no_proxies, where, length):
    """Before, the timeout bounded each read: a byte every 0.1 s held the request for as long as
    the answer lasted (here 40 s and more)."""
    drip.answer = _response(ANSWER + b" " * 400, length=length)
    drip.from_byte = WHERE[where](drip.answer)
    client = HttpModelClient(base_url=drip.url, api_key="k", model="m", timeout_s=TIMEOUT_S)
    started = time.monotonic()
    try:
        with pytest.raises(TransientModelError, match="timed out"):
            client.complete(MESSAGES, max_tokens=None)
    finally:
        client.close()
    took = time.monotonic() - started
    assert TIMEOUT_S * 0.9 <= took < TIMEOUT_S + SLACK_S, took


@pytest.mark.parametrize("kind", [HttpModelClient, AnthropicModelClient])
def test_an_answer_that_drips_to_its_end_before_the_timeout_is_read(drip, no_proxies, kind):
    """The neighbour: the same drip, ended well within the timeout, and the connection used
    again for the next request."""
    body = ANSWER
    if kind is AnthropicModelClient:
        body = json.dumps(
            {
                "id": "m1",
                "type": "message",
                "role": "assistant",
                "model": "m",
                "content": [{"type": "text", "text": "ok"}],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": 3, "output_tokens": 1},
            }
        ).encode()
    drip.answer = _response(body)
    drip.from_byte = len(drip.answer) - 10
    drip.every_s = 0.02
    client = kind(base_url=drip.url, api_key="k", model="m", timeout_s=TIMEOUT_S * 3)
    try:
        assert client.complete(MESSAGES, max_tokens=None).text == "ok"
        assert client.complete(MESSAGES, max_tokens=None).text == "ok"
    finally:
        client.close()
    assert drip.requests == 2


# The Batch APIs (httpx): a batch object, an output file ----------------------------------------


@pytest.fixture
def batch_api(settings, drip):
    from hermes_bulk.fleet.broker import open_backend

    api = BatchApi(
        base_url=drip.url,
        api_key="k",
        provider_key="p:test",
        limits=open_backend(settings).limits,
        timeout_s=TIMEOUT_S,
    )
    yield api
    api.close()


BATCH = json.dumps(
    {"id": "batch_1", "status": "in_progress", "request_counts": {"completed": 0, "failed": 0}}
).encode()


def test_a_batch_object_that_drips_gives_up_at_the_request_timeout(batch_api, drip, no_proxies):
    drip.answer = _response(BATCH + b" " * 200)
    drip.from_byte = drip.answer.index(b"\r\n\r\n") + 10
    started = time.monotonic()
    with pytest.raises(TransientModelError, match="timed out"):
        batch_api.get("batch_1")
    took = time.monotonic() - started
    assert TIMEOUT_S * 0.9 <= took < TIMEOUT_S + SLACK_S, took
    drip.answer, drip.from_byte = _response(BATCH), len(_response(BATCH))  # the neighbour
    assert batch_api.get("batch_1").status == "in_progress"


LINE = b'{"custom_id": "hb-j-b-%d", "response": {"status_code": 500}, "error": null}\n'


def test_a_file_that_never_ends_gives_its_lines_then_is_cut_at_its_time_bound(
    batch_api, drip, no_proxies
):
    """The lines, then a newline every 0.1 s for ever (no length: it would end with the
    connection): the lines that came are given, then BatchFileCut at the file's bound."""
    lines = b"".join(LINE % i for i in range(3))
    drip.answer = _response(lines + b"\n" * 10_000, length=False)
    drip.from_byte = drip.answer.index(b"\r\n\r\n") + 4 + len(lines)
    batch_api.file_timeout_s = 1.5
    seen, started = [], time.monotonic()
    with pytest.raises(BatchFileCut, match="did not end within 1.5 s"):
        for line in batch_api.lines("file-1"):
            seen.append(line.custom_id)
    assert seen == ["hb-j-b-0", "hb-j-b-1", "hb-j-b-2"]
    assert 1.5 * 0.9 <= time.monotonic() - started < 1.5 + SLACK_S


@pytest.mark.parametrize("over", [0, 1])
def test_a_file_of_its_byte_bound_is_read_whole_and_one_byte_more_is_cut(
    batch_api, drip, no_proxies, over
):
    lines = b"".join(LINE % i for i in range(3))
    body = lines + b"\n" * over
    drip.answer = _response(body)
    drip.from_byte = len(drip.answer)
    read = batch_api.lines("file-1", max_bytes=len(lines))
    if over:
        with pytest.raises(BatchFileCut, match=f"within {len(lines)} bytes"):
            assert len(list(read)) == 3
    else:
        assert [line.custom_id for line in read] == [f"hb-j-b-{i}" for i in range(3)]


# Redirects: never followed, never read as an answer ---------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_to_a_live_request_is_an_endpoint_error_not_followed(drip, no_proxies, status):
    """Before, a redirect was the item's permanent failure ("rejected the request"): each item
    failed. Now the endpoint's (the breaker counts it; the item is not charged), and the key
    never goes to the host it names."""
    drip.answer = (
        b"HTTP/1.1 %d Moved\r\nLocation: http://127.0.0.2:9/v1/chat/completions\r\n"
        b"Content-Length: 0\r\n\r\n" % status
    )
    drip.from_byte = len(drip.answer)
    client = HttpModelClient(base_url=drip.url, api_key="k", model="m", timeout_s=TIMEOUT_S)
    try:
        with pytest.raises(EndpointRedirects, match=f"redirect \\(HTTP {status}\\)"):
            client.complete(MESSAGES, max_tokens=None)
    finally:
        client.close()
    assert drip.requests == 1


@pytest.mark.parametrize("status", [301, 307])
def test_a_redirect_to_a_batch_call_or_file_is_not_an_answer(batch_api, drip, no_proxies, status):
    """Before, a redirected file read as an empty one (every item then unanswered)."""
    drip.answer = (
        b"HTTP/1.1 %d Moved\r\nLocation: http://127.0.0.2:9/\r\nContent-Length: 0\r\n\r\n" % status
    )
    drip.from_byte = len(drip.answer)
    with pytest.raises(BatchRedirected, match=f"HTTP {status}"):
        list(batch_api.lines("file-1"))
    with pytest.raises(BatchRedirected, match=f"HTTP {status}"):
        batch_api.get("batch_1")
    assert drip.requests == 2


# Live jobs, by real `run --wait` processes on both stores ---------------------------------------


@pytest.fixture(params=["sqlite", "redis"])
def store_env(request, tmp_path) -> dict[str, str]:
    url = (
        f"sqlite:///{tmp_path / 'bulk.db'}"
        if request.param == "sqlite"
        else request.getfixturevalue("redis_url")
    )
    return {"HERMES_BULK_BACKEND": url}


def test_a_dripping_answer_is_a_transient_failure_retried_and_the_job_ends(
    cli, fake_provider, tmp_path, store_env
):
    """Before, the item stayed in progress for as long as the answer dripped (here a minute)."""
    fake_provider.configure(fail_once={"DRIP": "drip"}, hang_s=60, drip_s=0.1)
    env = {**store_env, "HERMES_BULK_REQUEST_TIMEOUT_SECONDS": "1"}
    job_id = cli.json(
        "create", "Say", "--over", str(_source(tmp_path, 2, marks={0: "DRIP"})), "--json", **env
    )["job_id"]
    started = time.monotonic()
    proc = cli("run", job_id, "--wait", "--no-check", check=False, timeout=60, **env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert time.monotonic() - started < 20
    status = cli.status(job_id, **env)
    assert (status["completed"], status["failed"]) == (2, 0)
    assert len(fake_provider.requests) == 3, "the dripping attempt, its retry, the other item"
    events = cli("events", job_id, **env).stdout
    assert "the request timed out (no whole answer within 1 s)" in events, events


def test_redirects_to_live_requests_pause_the_job_and_fail_nothing(
    cli, fake_provider, tmp_path, store_env
):
    """Before, a redirect failed each item at once ("the provider rejected the request")."""
    fake_provider.configure(fail_rate=1.0, fail_kinds=["307"])
    env = {**store_env, "HERMES_BULK_BREAKER_FAILURES": "2"}
    job_id = cli.json("create", "Say", "--over", str(_source(tmp_path, 3)), "--json", **env)[
        "job_id"
    ]
    proc = cli("run", job_id, "--wait", "--no-check", check=False, timeout=60, **env)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    status = cli.status(job_id, **env)
    assert (status["state"], status["failed"], status["completed"]) == ("paused", 0, 0), status
    reason = status["pause_reason"]
    assert "2 requests in a row with a redirect (HTTP 307)" in reason, reason
    assert fake_provider.base_url in reason


def test_doctor_gives_up_on_an_answer_that_drips(drip, no_proxies):
    """`run` asks doctor first: an endpoint that drips its answer to GET /models must not hold
    it (before, `run` waited for as long as the answer dripped)."""
    from hermes_bulk.providers.doctor import check_endpoint

    drip.answer = _response(b'{"object": "list", "data": []}' + b" " * 400)
    drip.from_byte = drip.answer.index(b"\r\n\r\n") + 6
    started = time.monotonic()
    report = check_endpoint(drip.url, "k", "m", timeout_s=TIMEOUT_S)
    assert time.monotonic() - started < TIMEOUT_S + SLACK_S
    assert not report.usable
    assert "did not answer within 1 s" in report.text(), report.text()
