"""What a request meets on the loopback provider before it is answered: the fault it draws (an
item's fault, the script, the rate bucket, fail_rate), the gate, a wrong key or an unknown model,
and the faults that answer slowly or not at all (a 429 with its wait, a drip).

A gate, for tests that must know what reached the provider and when: `hold()` closes it (chat
requests that arrive are recorded, then wait unanswered; `hold(let_through=n)` answers the next
n first), `release()` opens it (the waiting ones are answered), `wait_requests(n)` blocks until
n chat requests have arrived (answered or held), `wait_held(n)` until n wait at the gate, and
`held` counts those waiting now. `POST /_control {"gate": "hold"|"release", "let_through": n}`
does the same from another process.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

from .fake_answers import content_text, digest
from .fake_anthropic import anthropic_error
from .fake_config import RequestRecord


class Faults:
    """The faults and the gate of FakeProvider (mixed into it: its config, lock, records and
    loop are the ones used here)."""

    # Gate ----------------------------------------------------------------------------------
    def hold(self, let_through: int = 0) -> None:
        """Close the gate: chat requests from now on are recorded, then wait until release();
        the first `let_through` of them are answered as if it were open."""
        with self._lock:
            self._let_through = let_through
        self._set_gate(False)

    def release(self) -> None:
        """Open the gate: the requests waiting at it are answered, and so are the next ones."""
        self._set_gate(True)

    def _set_gate(self, is_open: bool) -> None:
        if self._loop is None:
            self._hold_at_start = not is_open
            return
        done = threading.Event()

        def flip() -> None:
            assert self._gate_open is not None
            self._gate_open.set() if is_open else self._gate_open.clear()
            done.set()

        self._loop.call_soon_threadsafe(flip)
        if not done.wait(10):
            raise RuntimeError("the fake provider's loop did not answer")

    def _passes_closed_gate(self) -> bool:
        with self._lock:
            if self._let_through <= 0:
                return False
            self._let_through -= 1
            return True

    async def _wait_at_gate(self) -> None:
        """While the gate is closed, a request waits here (counted in `held`), unless it is one
        of those hold(let_through=n) lets pass."""
        assert self._gate_open is not None
        if not self._gate_open.is_set() and not self._passes_closed_gate():
            with self._lock:
                self.held += 1
                self._arrived.notify_all()
            try:
                await self._gate_open.wait()
            finally:
                with self._lock:
                    self.held -= 1

    def wait_held(self, n: int, timeout: float = 60.0) -> None:
        """Block until n chat requests wait at the closed gate."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: self.held >= n, timeout):
                raise AssertionError(
                    f"{self.held} requests wait at the fake provider's gate after {timeout}s, "
                    f"not {n}"
                )

    # Decisions -----------------------------------------------------------------------------
    def _decide(
        self, item: str, records: list[RequestRecord] | None = None, req: dict | None = None
    ) -> tuple[str, RequestRecord]:
        """The fault (or "ok") for this request, and its record (in records: requests by default),
        under the lock."""
        cfg = self.config
        with self._lock:
            fault = "ok"
            for marker, kind in cfg.item_faults.items():
                if marker in item:
                    fault = kind
            for marker in [m for m in cfg.fail_once if m in item]:
                fault = cfg.fail_once.pop(marker)
            if fault == "ok" and cfg.script:
                fault = cfg.script.pop(0)
            if fault == "ok" and cfg.rate_per_s:
                now = time.monotonic()
                self._tokens = min(
                    cfg.rate_per_s, self._tokens + (now - self._tokens_at) * cfg.rate_per_s
                )
                self._tokens_at = now
                if self._tokens >= 1.0:
                    self._tokens -= 1.0
                else:
                    wait_ms = int((1.0 - self._tokens) / cfg.rate_per_s * 1000) + 1
                    fault = f"429:ms={wait_ms}"
            if fault == "ok" and cfg.fail_rate and self._rng.random() < cfg.fail_rate:
                fault = self._rng.choice(cfg.fail_kinds)
            req = req or {}
            record = RequestRecord(
                at=time.time(),
                item=digest(item),
                status=0,
                fault=None if fault == "ok" else fault,
                options={k: v for k, v in req.items() if k not in ("model", "messages")},
                system="\n".join(
                    content_text(m.get("content"))
                    for m in req.get("messages") or []
                    if isinstance(m, dict) and m.get("role") == "system"
                ),
            )
            (self.requests if records is None else records).append(record)
            self._arrived.notify_all()
            return fault, record

    def _refused(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict] | None:
        """(401, body) for a wrong key (require_key), (404, body) for an unknown model (models)."""
        if not path.startswith("/v1"):
            return None
        key = self.config.require_key
        given = headers.get("x-api-key")  # Anthropic's header, on every path of its API
        if key is not None and headers.get("authorization", "") != f"Bearer {key}" and given != key:
            with self._lock:
                self.requests.append(
                    RequestRecord(at=time.time(), item="", status=401, fault="401")
                )
                self._arrived.notify_all()
            return 401, {
                "error": {
                    "message": "Incorrect API key provided: sk-LEAKED-1234",
                    "code": "invalid_api_key",
                }
            }
        if self.config.models is not None and path.endswith(("/chat/completions", "/messages")):
            try:
                model = json.loads(body or b"{}").get("model")
            except (ValueError, AttributeError):
                model = None
            if model not in self.config.models:
                with self._lock:
                    self.requests.append(
                        RequestRecord(at=time.time(), item="", status=404, fault="404")
                    )
                    self._arrived.notify_all()
                return 404, {
                    "error": {
                        "message": f"The model {model} does not exist (key sk-LEAKED-1234)",
                        "code": "model_not_found",
                    }
                }
        return None

    def _echo(self, target: str, headers: dict[str, str]) -> str:
        """What error bodies quote besides the usual text (echo_credentials, error_echo)."""
        parts = (
            [f"request {target} with Authorization: {headers.get('authorization', '')}"]
            if self.config.echo_credentials
            else []
        )
        return "".join(f"; {part}" for part in [*parts, self.config.error_echo] if part)

    def limit_headers(self, *, anthropic: bool) -> list[tuple[str, str]]:
        """The bucket as the provider's headers say it (rate_headers), or none."""
        cfg = self.config
        if not (cfg.rate_per_s and cfg.rate_headers):
            return []
        with self._lock:
            elapsed = time.monotonic() - self._tokens_at
            left = min(cfg.rate_per_s, self._tokens + elapsed * cfg.rate_per_s)
        full_in_s = (cfg.rate_per_s - left) / cfg.rate_per_s
        limit, remaining = str(round(cfg.rate_per_s * 60)), str(int(left))
        if anthropic:
            at = time.time() + full_in_s
            reset = (
                time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1000):03d}Z"
            )
            prefix = "anthropic-ratelimit-requests-"
            return [
                (prefix + "limit", limit),
                (prefix + "remaining", remaining),
                (prefix + "reset", reset),
            ]
        return [
            ("x-ratelimit-limit-requests", limit),
            ("x-ratelimit-remaining-requests", remaining),
            ("x-ratelimit-reset-requests", f"{round(full_in_s * 1000)}ms"),
        ]

    def _send_429(
        self, writer: asyncio.StreamWriter, fault: str, echo: str, *, anthropic: bool
    ) -> bool:
        """A 429 in the protocol asked, with the wait the fault names (429:<s>, 429:ms=<ms>)."""
        headers = []
        if fault.startswith("429:ms="):
            ms = int(fault.split("=", 1)[1])
            headers = [
                ("retry-after-ms", str(ms)),
                ("Retry-After", str(max(1, -(-ms // 1000)))),
            ]
        elif ":" in fault:
            headers = [("Retry-After", fault.split(":", 1)[1])]
        headers += self.limit_headers(anthropic=anthropic)
        if anthropic:
            return self._send(writer, 429, anthropic_error(429, f"Rate limited{echo}"), headers)
        return self._send(
            writer,
            429,
            {
                "error": {
                    "message": f"Rate limit reached for fake-model (secret sk-LEAKED-1234){echo}",
                    "type": "rate_limit_exceeded",
                }
            },
            headers,
        )

    async def _drip(self, writer: asyncio.StreamWriter) -> bool:
        """An answer that never ends: its headers, then a byte of its body every drip_s seconds
        for as long as the client reads (or hang_s passes)."""
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
        writer.write(b"Content-Length: 1000000\r\n\r\n{")
        ends = time.monotonic() + self.config.hang_s
        while not self._stopping and time.monotonic() < ends:
            await asyncio.sleep(self.config.drip_s)
            writer.write(b" ")
            await writer.drain()
        return False
