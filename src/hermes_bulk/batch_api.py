"""The provider's Batch API (OpenAI's, which compatible servers also implement), over HTTP.

Upload a JSONL file of requests (`POST /files`, purpose=batch), create a batch of it
(`POST /batches`), poll it (`GET /batches/{id}`), find one by its metadata (`GET /batches`),
cancel it, and read its output and error files (`GET /files/{id}/content`), streamed both ways:
a file is sent from disk and read line by line, never held whole.

Every call goes through the provider key's shared wait and pacing (limits.ProviderGate), as a
live call does: a 429 here pauses every worker on the key. Errors are classified by
model.classify_status; provider error text goes to the log only.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from .errors import RateLimited, TransientModelError
from .limits import ProviderGate
from .model import classify_status, endpoint_url, retry_after_seconds
from .redact import public_url
from .store.protocol import SharedLimits

log = logging.getLogger("hermes_bulk.batch_api")

#: The most requests and input bytes one batch may hold (OpenAI's limits).
MAX_BATCH_REQUESTS = 50_000
MAX_BATCH_BYTES = 200 * 1024 * 1024
#: The metadata key a batch carries our batch id under (and the job's, for people reading it).
META_BATCH, META_JOB = "hermes_bulk_batch", "hermes_bulk_job"
#: Batches listed when looking for one by its metadata (newest first, 100 a page).
FIND_PAGES = 20
#: Provider statuses after which a batch changes no more.
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})


class BatchApi:
    """One endpoint's Batch API, for one worker (its calls share the key's limits with live calls)."""

    def __init__(self, *, base_url: str, api_key: str | None, provider_key: str, limits: SharedLimits,
                 timeout_s: float, rpm: int | None = None, sleep: Callable[[float], None] = time.sleep,
                 max_wait_s: float = float("inf")) -> None:
        """max_wait_s: the longest a call sits out the key's shared wait (a 429 pause may last an
        hour); past it the call raises LongWait. A worker waits as long as it takes; a command
        at a terminal does not."""
        self.base_url = base_url.rstrip("/")
        self.max_wait_s = max_wait_s
        self.endpoint = public_url(self.base_url)
        self.gate = ProviderGate(limits, provider_key, rpm=rpm, tpm=None, sleep=sleep)
        self.sleep = sleep
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)))

    def close(self) -> None:
        self._http.close()

    def _url(self, path: str) -> str:
        return endpoint_url(self.base_url, path)

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One call through the shared wait; a 429 pauses the key and the call is made again."""
        while True:
            self.gate.wait_for_turn(0, max_block_s=self.max_wait_s)
            if "files" in kwargs:  # an upload: the file is read again from its start
                kwargs["files"]["file"][1].seek(0)
            try:
                response = self._http.request(method, self._url(path), **kwargs)
            except httpx.TimeoutException:
                raise TransientModelError("a Batch API request timed out") from None
            except httpx.TransportError as exc:
                log.warning("connection error talking to %s: %r", self.endpoint, exc)
                raise TransientModelError(f"connection error ({type(exc).__name__})") from None
            if response.status_code == 429:
                until = self.gate.rate_limited(retry_after_seconds(response.headers))
                log.info("Batch API rate limited (HTTP 429); every worker on this key waits until %.0f", until)
                continue
            if response.status_code >= 400:
                log.warning("HTTP %s from %s %s: %s", response.status_code, method, path, response.text[:2000])
                raise classify_status(response.status_code, response.headers)
            self.gate.succeeded()
            return response

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = self._send(method, path, **kwargs)
        try:
            data = response.json()
        except ValueError:
            raise TransientModelError("the provider's Batch API answer could not be read", http_status=200) from None
        if not isinstance(data, dict):
            raise TransientModelError("the provider's Batch API answer could not be read", http_status=200)
        return data

    def upload(self, path: Path) -> str:
        """Upload a JSONL file of requests (streamed from disk); its file id."""
        with path.open("rb") as handle:
            data = self._json("POST", "files", data={"purpose": "batch"},
                              files={"file": (path.name, handle, "application/jsonl")})
        return str(data["id"])

    def create(self, input_file: str, *, window: str, metadata: dict[str, str]) -> dict[str, Any]:
        return self._json("POST", "batches", json={"input_file_id": input_file, "endpoint": "/v1/chat/completions",
                                                   "completion_window": window, "metadata": metadata})

    def get(self, batch_id: str) -> dict[str, Any]:
        return self._json("GET", f"batches/{batch_id}")

    def cancel(self, batch_id: str) -> dict[str, Any]:
        return self._json("POST", f"batches/{batch_id}/cancel")

    def find(self, batch_id: str) -> dict[str, Any] | None:
        """The provider's batch whose metadata names our batch_id, among the newest; else None."""
        after: str | None = None
        for _ in range(FIND_PAGES):
            params: dict[str, Any] = {"limit": 100}
            if after:
                params["after"] = after
            page = self._json("GET", "batches", params=params)
            found = page.get("data") or []
            for batch in found:
                if isinstance(batch, dict) and (batch.get("metadata") or {}).get(META_BATCH) == batch_id:
                    return batch
            if not page.get("has_more") or not found:
                return None
            after = found[-1].get("id")
        return None

    def lines(self, file_id: str) -> Iterator[dict[str, Any]]:
        """The JSON lines of a file, read as they arrive (one line in memory at a time)."""
        self.gate.wait_for_turn(0, max_block_s=float("inf"))
        try:
            with self._http.stream("GET", self._url(f"files/{file_id}/content")) as response:
                if response.status_code >= 400:
                    response.read()
                    log.warning("HTTP %s reading file %s: %s", response.status_code, file_id, response.text[:2000])
                    error = classify_status(response.status_code, response.headers)
                    if isinstance(error, RateLimited):
                        self.gate.rate_limited(error.retry_after_s)
                    raise error
                for line in response.iter_lines():
                    if line.strip():
                        try:
                            yield json.loads(line)
                        except ValueError:
                            log.warning("an unreadable line in batch file %s", file_id)
        except httpx.TimeoutException:
            raise TransientModelError("reading a batch file timed out") from None
        except httpx.TransportError as exc:
            raise TransientModelError(f"connection error ({type(exc).__name__})") from None
