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

from hermes_bulk.errors import TransientModelError
from hermes_bulk.jobs.prompt import build_messages
from hermes_bulk.providers.anthropic import AnthropicModelClient
from hermes_bulk.providers.client import HttpModelClient

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
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
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
