"""CPU per request of the ways an item's request can be sent, side by side in one run.

    python bench/http_clients.py [--requests 2000] [--rounds 3]

One thread, the loopback provider answering at once in its own process, the request body an
item's (jobs/prompt.build_messages). Cases, interleaved each round, the median of the rounds:
httpx streaming as hermes-bulk's client did before providers/transport.py, urllib3 streaming
as transport.py does, the standard library's http.client (no pool, no decoding: a floor), and
hermes-bulk's HttpModelClient.complete (transport plus building the body and reading the answer).
Ratios to httpx are what to compare; the absolute times move with the machine's load.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import urllib3  # noqa: E402

from bench.procs import FakeProviderProc  # noqa: E402
from hermes_bulk.jobs import prompt  # noqa: E402
from hermes_bulk.providers.client import HttpModelClient  # noqa: E402
from hermes_bulk.sources import content_hash  # noqa: E402


def _messages(i: int) -> list[dict[str, str]]:
    content = json.dumps({"id": i, "text": f"item {i} with a few words of text"})
    return prompt.build_messages("Summarise", f"line:{i + 1}", content, content_hash(content))


def _cases(base_url: str) -> dict[str, tuple[Callable[[int], object], Callable[[], None]]]:
    url = base_url.rstrip("/") + "/chat/completions"
    parts = urlsplit(url)

    def body(i: int) -> dict:
        return {"model": "fake-model", "messages": _messages(i)}

    hx = httpx.Client(limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))

    def via_httpx(i: int) -> object:
        with hx.stream("POST", url, json=body(i)) as response:
            raw = bytearray()
            for chunk in response.iter_bytes():
                raw += chunk
        return json.loads(raw)

    pool = urllib3.connection_from_url(url, maxsize=1, retries=False)
    headers = {"Content-Type": "application/json", "Accept-Encoding": "gzip, deflate"}

    def via_urllib3(i: int) -> object:
        data = json.dumps(body(i), separators=(",", ":")).encode()
        response = pool.urlopen(
            "POST", parts.path, body=data, headers=headers, preload_content=False, retries=False
        )
        raw = bytearray()
        for chunk in response.stream(65536):
            raw += chunk
        response.release_conn()
        return json.loads(raw)

    conn = http.client.HTTPConnection(parts.hostname, parts.port)

    def via_http_client(i: int) -> object:
        data = json.dumps(body(i), separators=(",", ":")).encode()
        conn.request("POST", parts.path, body=data, headers=headers)
        return json.loads(conn.getresponse().read())

    client = HttpModelClient(
        base_url=base_url, api_key="sk-bench-not-a-secret", model="fake-model", timeout_s=60
    )

    def via_hermes_bulk(i: int) -> object:
        return client.complete(_messages(i), max_tokens=None)

    return {
        "httpx (stream)": (via_httpx, hx.close),
        "urllib3 (stream)": (via_urllib3, pool.close),
        "http.client (floor)": (via_http_client, conn.close),
        "HttpModelClient.complete": (via_hermes_bulk, client.close),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    provider = FakeProviderProc(latency_s=0.0)
    try:
        cases = _cases(provider.base_url)
        ms: dict[str, list[float]] = {name: [] for name in cases}
        for r in range(args.rounds):
            names = list(cases)
            names = names[r % len(names) :] + names[: r % len(names)]
            for name in names:
                send = cases[name][0]
                for i in range(50):  # a warm connection, as a worker's
                    send(i)
                cpu = time.process_time()
                for i in range(args.requests):
                    send(i)
                ms[name].append((time.process_time() - cpu) / args.requests * 1000)
        for _, close in cases.values():
            close()
    finally:
        provider.stop()
    base = statistics.median(ms["httpx (stream)"])
    print(f"{args.requests} requests a case, {args.rounds} interleaved rounds, one thread")
    print("| case | CPU ms/request (median) | vs httpx |")
    print("|---|---|---|")
    for name, values in ms.items():
        m = statistics.median(values)
        print(f"| {name} | {m:.3f} | {m / base:.2f} |")


if __name__ == "__main__":
    main()
