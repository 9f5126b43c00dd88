"""What the item's HTTP request keeps from the environment and survives from the wire
(providers/transport.py): proxies as HTTP(S)_PROXY and NO_PROXY name them, and gzip answers,
including one that decodes to more than any answer may be and one that is not gzip at all.

Real parts: the client against the loopback provider, through a forwarding proxy on loopback
that relays to it; a plain HTTP server on loopback for the encodings the provider never sends.
"""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import ssl
import subprocess
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest

from hermes_bulk.errors import EndpointUnreachable, InvalidAnswer, TransientModelError
from hermes_bulk.jobs.prompt import build_messages
from hermes_bulk.providers.anthropic import AnthropicModelClient
from hermes_bulk.providers.client import MAX_ANSWER_BYTES, HttpModelClient

MESSAGES = build_messages("Say it", "line:1", "row", "b2:" + "0" * 32)
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture
def no_proxies(monkeypatch):
    """No proxy from the machine's environment: each test names its own."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    return monkeypatch


class _Server:
    """A ThreadingHTTPServer on a free loopback port, for one handler class."""

    def __init__(
        self, handler: type[BaseHTTPRequestHandler], tls: ssl.SSLContext | None = None
    ) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.scheme = "https" if tls else "http"
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.seen: list[str] = []  # request targets, as sent
        self.httpd.seen = self.seen  # type: ignore[attr-defined]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.httpd.server_address[1]}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _ForwardingProxy(BaseHTTPRequestHandler):
    """An HTTP forward proxy: takes `POST http://host/path` and relays it there."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.server.seen.append(self.path)  # type: ignore[attr-defined]
        target = urlsplit(self.path)
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        upstream = http.client.HTTPConnection(target.hostname, target.port, timeout=10)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "proxy-connection"}
        path = target.path + (f"?{target.query}" if target.query else "")
        upstream.request("POST", path, body, headers)
        answer = upstream.getresponse()
        data = answer.read()
        self.send_response(answer.status)
        for key, value in answer.getheaders():
            if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        upstream.close()


@pytest.fixture
def forwarding_proxy():
    server = _Server(_ForwardingProxy)
    yield server
    server.stop()


@pytest.mark.parametrize("scheme", ["http://", ""], ids=["url", "host-and-port"])
@pytest.mark.parametrize("kind", [HttpModelClient, AnthropicModelClient])
def test_a_proxy_named_by_the_environment_carries_the_request(
    fake_provider, forwarding_proxy, no_proxies, kind, scheme
):
    """As curl and httpx read it, a proxy named without a scheme is an HTTP proxy."""
    no_proxies.setenv("HTTP_PROXY", scheme + forwarding_proxy.url.removeprefix("http://"))
    client = kind(base_url=fake_provider.base_url, api_key="k", model="m", timeout_s=10)
    try:
        answer = client.complete(MESSAGES, max_tokens=50)
    finally:
        client.close()
    assert answer.text.strip()
    path = "/chat/completions" if kind is HttpModelClient else "/messages"
    assert forwarding_proxy.seen == [fake_provider.base_url + path], "sent to the proxy, whole"
    assert len(fake_provider.requests) == 1


def test_no_proxy_sends_straight_to_the_endpoint(fake_provider, forwarding_proxy, no_proxies):
    no_proxies.setenv("HTTP_PROXY", forwarding_proxy.url)
    no_proxies.setenv("NO_PROXY", "127.0.0.1")
    client = HttpModelClient(base_url=fake_provider.base_url, api_key="k", model="m", timeout_s=10)
    try:
        assert client.complete(MESSAGES, max_tokens=50).text.strip()
    finally:
        client.close()
    assert forwarding_proxy.seen == []
    assert len(fake_provider.requests) == 1


def test_a_proxy_that_is_down_is_an_endpoint_out_of_reach(fake_provider, no_proxies):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    no_proxies.setenv("ALL_PROXY", dead)
    client = HttpModelClient(base_url=fake_provider.base_url, api_key="k", model="m", timeout_s=5)
    try:
        with pytest.raises(EndpointUnreachable, match="cannot connect"):
            client.complete(MESSAGES, max_tokens=50)
    finally:
        client.close()
    assert fake_provider.requests == []


# Encodings the loopback provider never sends ----------------------------------------------------

ANSWER = json.dumps(
    {
        "id": "c1",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "zipped"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }
).encode()


def _bomb() -> bytes:
    """A gzip body of about 100 KiB that decodes to 100 MiB of zeros (beyond MAX_ANSWER_BYTES)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b"\0" * (1 << 20)
    return b"".join(packer.compress(chunk) for _ in range(100)) + packer.flush()


HUGE = b"announced as a terabyte"


def _answer_of(size: int) -> bytes:
    """ANSWER padded with trailing whitespace (still one JSON value) to exactly size bytes."""
    return ANSWER + b" " * (size - len(ANSWER))


#: What each path answers, in turn (the last one again and again).
BODIES = {
    "/huge/chat/completions": [HUGE],
    # Sent as they are (no gzip): the announced length and the body are both the limit, or
    # one byte more.
    "/plain-at-limit/chat/completions": [_answer_of(MAX_ANSWER_BYTES)],
    "/plain-over-limit/chat/completions": [_answer_of(MAX_ANSWER_BYTES + 1)],
    "/gzip/chat/completions": [gzip.compress(ANSWER)],
    "/bomb/chat/completions": [_bomb(), gzip.compress(ANSWER)],
    "/notgzip/chat/completions": [b"this is not gzip at all, though it says so"],
}


class _Encoded(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def handle(self) -> None:  # one connection, however many requests it carries
        with self.server.open_now:  # type: ignore[attr-defined]
            self.server.connections += 1  # type: ignore[attr-defined]
        try:
            super().handle()
        except ConnectionError:  # a client that refused a body closes with it unread
            pass
        finally:
            with self.server.open_now:  # type: ignore[attr-defined]
                self.server.connections -= 1  # type: ignore[attr-defined]
                self.server.open_now.notify_all()  # type: ignore[attr-defined]

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.server.seen.append(self.headers.get("accept-encoding", ""))  # type: ignore[attr-defined]
        turns = self.server.turns.setdefault(self.path, list(BODIES[self.path]))  # type: ignore[attr-defined]
        body = turns.pop(0) if len(turns) > 1 else turns[0]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if not self.path.startswith("/plain"):
            self.send_header("Content-Encoding", "gzip")
        if body is HUGE:  # says a terabyte, sends a few bytes, and waits
            self.send_header("Content-Length", str(10**12))
            self.end_headers()
            self.wfile.write(b"\x1f\x8b")
            self.wfile.flush()
            self.server.stopping.wait(30)  # type: ignore[attr-defined]
            return
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _encoded(tls: ssl.SSLContext | None = None) -> _Server:
    server = _Server(_Encoded, tls)
    server.httpd.turns = {}  # type: ignore[attr-defined]
    server.httpd.stopping = threading.Event()  # type: ignore[attr-defined]
    server.httpd.open_now = threading.Condition()  # type: ignore[attr-defined]
    server.httpd.connections = 0  # type: ignore[attr-defined]
    return server


@pytest.fixture
def encoded_server():
    server = _encoded()
    yield server
    server.httpd.stopping.set()  # type: ignore[attr-defined]
    server.stop()


@pytest.fixture
def tls_server(tmp_path):
    """The same server over TLS, with a self-signed certificate for 127.0.0.1 (made by
    openssl); yields (server, the certificate's path)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"]
        + ["-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server = _encoded(tls)
    yield server, cert
    server.httpd.stopping.set()  # type: ignore[attr-defined]
    server.stop()


def test_a_certificate_the_store_does_not_trust_is_an_endpoint_out_of_reach(tls_server, no_proxies):
    """TLS is verified: a self-signed certificate is refused before anything is sent."""
    server, _ = tls_server
    no_proxies.delenv("SSL_CERT_FILE", raising=False)
    client = _client(server, "/gzip")
    try:
        with pytest.raises(EndpointUnreachable, match="cannot connect"):
            client.complete(MESSAGES, max_tokens=None)
    finally:
        client.close()
    assert server.seen == []


def test_ssl_cert_file_names_a_certificate_to_trust(tls_server, no_proxies):
    """As with httpx: SSL_CERT_FILE replaces the certificate store (a company's own CA)."""
    server, cert = tls_server
    no_proxies.setenv("SSL_CERT_FILE", str(cert))
    client = _client(server, "/gzip")
    try:
        assert client.complete(MESSAGES, max_tokens=None).text == "zipped"
    finally:
        client.close()
    assert len(server.seen) == 1


def _client(server: _Server, path: str) -> HttpModelClient:
    return HttpModelClient(base_url=server.url + path, api_key="k", model="m", timeout_s=10)


def test_a_gzip_answer_is_decoded(encoded_server, no_proxies):
    client = _client(encoded_server, "/gzip")
    try:
        assert client.complete(MESSAGES, max_tokens=None).text == "zipped"
    finally:
        client.close()
    assert "gzip" in encoded_server.seen[0], "the request says gzip is welcome"


def test_an_answer_that_decodes_past_the_limit_is_refused_unread(encoded_server, no_proxies):
    assert len(BODIES["/bomb/chat/completions"][0]) < MAX_ANSWER_BYTES // 100
    client = _client(encoded_server, "/bomb")
    try:
        with pytest.raises(InvalidAnswer, match="larger than"):
            client.complete(MESSAGES, max_tokens=None)
        # The connection it left half read is not reused: the next answer is read whole.
        assert client.complete(MESSAGES, max_tokens=None).text == "zipped"
    finally:
        client.close()
    assert len(encoded_server.seen) == 2


def test_an_answer_announced_larger_than_the_limit_is_refused_before_any_read(
    encoded_server, no_proxies
):
    """Its Content-Length alone decides: the client does not wait for bytes that never come
    (with a 30 s read timeout, waiting would be a timeout, not this error)."""
    client = HttpModelClient(
        base_url=encoded_server.url + "/huge", api_key="k", model="m", timeout_s=30
    )
    try:
        with pytest.raises(InvalidAnswer, match="larger than"):
            client.complete(MESSAGES, max_tokens=None)
    finally:
        client.close()


def test_a_body_that_is_not_the_gzip_it_claims_is_a_transient_failure(encoded_server, no_proxies):
    client = _client(encoded_server, "/notgzip")
    try:
        with pytest.raises(TransientModelError, match="connection error"):
            client.complete(MESSAGES, max_tokens=None)
    finally:
        client.close()


def test_an_answer_of_exactly_the_limit_is_read_and_one_byte_more_is_not(
    encoded_server, no_proxies
):
    at_limit = _client(encoded_server, "/plain-at-limit")
    over = _client(encoded_server, "/plain-over-limit")
    try:
        assert at_limit.complete(MESSAGES, max_tokens=None).text == "zipped"
        with pytest.raises(InvalidAnswer, match="larger than"):
            over.complete(MESSAGES, max_tokens=None)
    finally:
        at_limit.close()
        over.close()


def test_close_closes_the_connection_of_every_thread(encoded_server, no_proxies):
    """While the threads live on (their connections are not collected with them)."""
    client = _client(encoded_server, "/gzip")
    answered, done = threading.Barrier(4), threading.Event()

    def work() -> None:
        client.complete(MESSAGES, max_tokens=None)
        answered.wait(10)
        done.wait(10)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    answered.wait(10)
    httpd = encoded_server.httpd
    try:
        with httpd.open_now:
            assert httpd.connections == 3, "one kept-alive connection per thread"
        client.close()
        with httpd.open_now:
            assert httpd.open_now.wait_for(lambda: httpd.connections == 0, timeout=10), (
                f"{httpd.connections} connections left open by close()"
            )
    finally:
        done.set()
        for t in threads:
            t.join(10)
