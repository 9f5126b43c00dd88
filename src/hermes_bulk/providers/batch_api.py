"""The provider's Batch API (OpenAI's, which compatible servers also implement), over HTTP.

Upload a JSONL file of requests (`POST /files`, purpose=batch), create a batch of it
(`POST /batches`), poll it (`GET /batches/{id}`), find one by its metadata (`GET /batches`),
cancel it, and read its output and error files (`GET /files/{id}/content`), streamed both ways:
a file is sent from disk and read line by line, never held whole.

Every call goes through the provider key's shared wait and pacing (limits.ProviderGate), as a
live call does: a 429 here pauses every worker on the key. Errors are classified by
model.classify_status; provider error text goes to the log only.

Nothing the provider answers is trusted (DESIGN.md invariant 15): a batch object is read by
`remote_batch` (its id, status, counts and file ids checked, or BatchAnswerInvalid), a file is
read in lines of at most `max_line_bytes` (a longer line is skipped as it streams, keeping only
its start), and each line is read by `read_line` into a FileLine that says what is wrong with it,
if anything. What is wrong is said in our words, never the provider's.

Every call has a total deadline and a byte bound (DESIGN.md invariant 17; deadline.py): an
answer within the request timeout and MAX_OBJECT_BYTES, a file within FILE_TIMEOUTS request
timeouts and the bytes the caller allows (past either, BatchFileCut after the lines that came).
A redirect is BatchRedirected, never an answer or an empty file.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ..errors import RateLimited, TransientModelError
from ..redact import public_url
from ..store.protocol import BatchRecord, SharedLimits
from . import deadline
from .client import Completion, classify_status, endpoint_url, parse_completion, retry_after_seconds
from .pacing import ProviderGate

log = logging.getLogger("hermes_bulk.providers.batch_api")

#: The most requests and input bytes one batch may hold (OpenAI's limits).
MAX_BATCH_REQUESTS = 50_000
MAX_BATCH_BYTES = 200 * 1024 * 1024
#: The metadata key a batch carries our batch id under (and the job's, for people reading it).
META_BATCH, META_JOB = "hermes_bulk_batch", "hermes_bulk_job"
#: Batches listed when looking for one by its metadata (newest first, 100 a page).
FIND_PAGES = 20
#: Provider statuses after which a batch changes no more.
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
#: Every status a batch can have at the provider; any other makes its answer invalid.
STATUSES = TERMINAL | {"validating", "in_progress", "finalizing", "cancelling"}
#: The longest line of an output or error file read, by default (HERMES_BULK_BATCH_MAX_LINE_BYTES).
DEFAULT_MAX_LINE_BYTES = 8 * 1024 * 1024
#: What is kept of an overlong or unreadable line: enough to find its custom_id.
LINE_HEAD_BYTES = 4096
#: An id the provider gives a batch or a file: it goes into a URL path, so nothing else.
_REMOTE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$")
#: A line's custom_id as written at the start of a line that cannot be read whole.
_CUSTOM_ID_AT_START = re.compile(rb'"custom_id"\s*:\s*"([A-Za-z0-9_-]{1,100})"')
#: The largest request count believed (a batch holds at most 50,000 requests).
_MAX_COUNT = 10**9
#: The largest Batch API answer read (a batch object, a page of 100 of them: tens of KiB).
MAX_OBJECT_BYTES = 4 * 1024 * 1024
#: How much of an error answer is read, for the log.
MAX_ERROR_BYTES = 64 * 1024
#: An upload may take the request timeout and a second for each of these bytes besides.
UPLOAD_BYTES_PER_S = 1024 * 1024
#: How many request timeouts an output or results file may take to read whole.
FILE_TIMEOUTS = 15


class BatchAnswerInvalid(TransientModelError):
    """The provider answered, but not with what the Batch API promises (our words say what)."""

    error_type = "BatchAnswerInvalid"

    def __init__(self, message: str) -> None:
        super().__init__(message, http_status=200)


class BatchUnreachable(TransientModelError):
    """Nothing answered (no connection): not the batch's fault, so not counted against it."""


class BatchRedirected(BatchUnreachable):
    """The provider answered with a redirect (HTTP 3xx), which is never followed (the key would
    go to the host it names): an answer that could not be read, never an empty one, and not the
    batch's fault; the driver asks again, then pauses the job naming it."""

    def __init__(self, status: int) -> None:
        super().__init__(
            f"the provider's Batch API answered with a redirect (HTTP {status}), which is not "
            "followed",
            http_status=status,
        )


@dataclass(frozen=True, slots=True)
class Answer:
    """A Batch API answer, read within its bounds."""

    status_code: int
    headers: httpx.Headers
    content: bytes


@dataclass(frozen=True, slots=True)
class RemoteBatch:
    """The fields of a provider's batch object that are used, checked."""

    id: str
    status: str
    completed: int
    failed: int
    output_file: str | None
    error_file: str | None


def _remote_id(value: object) -> str | None:
    return value if isinstance(value, str) and _REMOTE_ID.match(value) else None


def _count(value: object) -> int | None:
    if value is None:
        return 0
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_COUNT
    return value if ok else None


def checked_id(data: dict[str, Any], expect_id: str | None) -> str:
    """A batch answer's id: usable in a URL path, and the one asked about (expect_id)."""
    batch_id = _remote_id(data.get("id"))
    if batch_id is None:
        raise BatchAnswerInvalid("the provider's batch answer has no usable id")
    if expect_id is not None and batch_id != expect_id:
        raise BatchAnswerInvalid(f"the provider answered about another batch than {expect_id}")
    return batch_id


def remote_batch(data: object, *, expect_id: str | None = None) -> RemoteBatch:
    """A batch object, checked field by field; BatchAnswerInvalid naming the first bad field."""
    if not isinstance(data, dict):
        raise BatchAnswerInvalid("the provider's batch answer is not an object")
    batch_id = checked_id(data, expect_id)
    status = data.get("status")
    if status not in STATUSES:
        raise BatchAnswerInvalid(
            f"the provider's answer about batch {batch_id} has an unknown status"
        )
    counts = data.get("request_counts")
    if counts is not None and not isinstance(counts, dict):
        raise BatchAnswerInvalid(
            f"the provider's answer about batch {batch_id} has unreadable request counts"
        )
    completed, failed = (
        _count((counts or {}).get("completed")),
        _count((counts or {}).get("failed")),
    )
    if completed is None or failed is None:
        raise BatchAnswerInvalid(
            f"the provider's answer about batch {batch_id} has unreadable request counts"
        )
    files = []
    for key in ("output_file_id", "error_file_id"):
        value = data.get(key)
        if value is not None and _remote_id(value) is None:
            raise BatchAnswerInvalid(
                f"the provider's answer about batch {batch_id} has an unusable {key}"
            )
        files.append(value)
    return RemoteBatch(batch_id, str(status), completed, failed, files[0], files[1])


@dataclass(frozen=True, slots=True)
class FileLine:
    """One line of an output or error file: its object when it is a well-formed line, else what
    is wrong with it (`problem`, our words), with the custom_id found at its start if any."""

    custom_id: str | None
    data: dict[str, Any] | None = None
    problem: str | None = None


def read_line(
    raw: bytes, *, overlong: bool = False, max_bytes: int = DEFAULT_MAX_LINE_BYTES
) -> FileLine:
    """A line as read (the start only, when overlong), checked for the shape OpenAI writes:
    an object with a string custom_id, a `response` (null or an object with an integer
    status_code and, for 200, an object body) and an `error` (null or an object)."""
    bound = bound_object(raw, overlong=overlong, max_bytes=max_bytes)
    if isinstance(bound, FileLine):
        return bound
    custom_id, data = bound
    response, error = data.get("response"), data.get("error")
    if response is not None and not isinstance(response, dict):
        return FileLine(custom_id, problem="a line whose response is not an object")
    if error is not None and not isinstance(error, dict):
        return FileLine(custom_id, problem="a line whose error is not an object")
    if response is None and error is None:
        return FileLine(custom_id, problem="a line with neither a response nor an error")
    if response is not None:
        status = response.get("status_code")
        if not isinstance(status, int) or isinstance(status, bool) or not 100 <= status <= 599:
            return FileLine(custom_id, problem="a line without a usable status code")
        if status == 200 and not isinstance(response.get("body"), dict):
            return FileLine(custom_id, problem="a line whose answer body is not an object")
    return FileLine(custom_id, data=data)


def bound_object(
    raw: bytes, *, overlong: bool, max_bytes: int
) -> tuple[str, dict[str, Any]] | FileLine:
    """What every result line must be, on either provider: (its custom_id, the JSON object);
    else the problem line (bound to a custom_id where one can be read at its start)."""
    if overlong:
        return FileLine(_sniff_custom_id(raw), problem=f"a line longer than {max_bytes} bytes")
    try:
        data = json.loads(raw)
    except ValueError:
        return FileLine(_sniff_custom_id(raw), problem="a line that is not JSON")
    if not isinstance(data, dict):
        return FileLine(None, problem="a line that is not a JSON object")
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str):
        return FileLine(None, problem="a line without a custom_id")
    return custom_id, data


def _sniff_custom_id(head: bytes) -> str | None:
    match = _CUSTOM_ID_AT_START.search(head[:LINE_HEAD_BYTES])
    return match.group(1).decode("ascii") if match else None


def bounded_lines(chunks: Iterable[bytes], max_bytes: int) -> Iterator[tuple[bytes, bool]]:
    """The lines of a byte stream, each (line, overlong): a line longer than max_bytes is not
    kept whole: only its first LINE_HEAD_BYTES, the rest skipped as it streams, so memory stays
    at one chunk plus max_bytes whatever the provider sends. Blank lines are left out."""
    buf = bytearray()
    over = False
    for chunk in chunks:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if not over:
                buf += piece
                if len(buf) > max_bytes:
                    del buf[LINE_HEAD_BYTES:]
                    over = True
            if end < 0:
                break
            if over or buf.strip():
                yield bytes(buf), over
            buf.clear()
            over = False
            start = end + 1
    if over or buf.strip():
        yield bytes(buf), over


class BatchApi:
    """One endpoint's Batch API, for one worker (its calls share the key's limits with live
    calls)."""

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str | None,
        provider_key: str,
        limits: SharedLimits,
        timeout_s: float,
        rpm: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
        max_wait_s: float = float("inf"),
    ) -> None:
        """max_wait_s: the longest a call sits out the key's shared wait (a 429 pause may last an
        hour); past it the call raises LongWait. A worker waits as long as it takes; a command
        at a terminal does not."""
        self.base_url = base_url.rstrip("/")
        self.max_wait_s = max_wait_s
        self.endpoint = public_url(self.base_url)
        self.gate = ProviderGate(limits, provider_key, rpm=rpm, tpm=None, sleep=sleep)
        self.sleep = sleep
        #: Each call's total bound (connect, send, headers, body: deadline.py), and a file's.
        self.timeout_s = timeout_s
        self.file_timeout_s = FILE_TIMEOUTS * timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = deadline.bound_client(
            httpx.Client(
                headers=headers, timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))
            )
        )

    #: What the endpoint lacks when it answers a batch create as if it had no batch API.
    KIND = "Batch API (POST /files and /batches)"

    def close(self) -> None:
        self._http.close()

    def discard(self, input_file: str | None) -> None:
        """Forget a batch's input that will not be sent (a file uploaded stays at the provider,
        which removes it in time)."""

    def _url(self, path: str) -> str:
        return endpoint_url(self.base_url, path)

    def _send(
        self, method: str, path: str, *, total_s: float | None = None, **kwargs: Any
    ) -> Answer:
        """One call through the shared wait; a 429 pauses the key and the call is made again.
        The call ends within total_s (the request timeout by default) and reads at most
        MAX_OBJECT_BYTES of answer; a redirect is BatchRedirected, never an answer."""
        while True:
            self.gate.wait_for_turn(0, max_block_s=self.max_wait_s)
            if "files" in kwargs:  # an upload: the file is read again from its start
                kwargs["files"]["file"][1].seek(0)
            at = time.monotonic() + (total_s or self.timeout_s)
            try:
                with deadline.until(at):
                    answer = self._exchange(method, path, **kwargs)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                log.warning("connection error talking to %s: %r", self.endpoint, exc)
                raise BatchUnreachable(f"connection error ({type(exc).__name__})") from None
            except httpx.TimeoutException:
                raise TransientModelError("a Batch API request timed out") from None
            except httpx.TransportError as exc:
                log.warning("connection error talking to %s: %r", self.endpoint, exc)
                raise TransientModelError(f"connection error ({type(exc).__name__})") from None
            if answer.status_code == 429:
                until = self.gate.rate_limited(retry_after_seconds(answer.headers))
                log.info(
                    "Batch API rate limited (HTTP 429); every worker on this key waits until %.0f",
                    until,
                )
                continue
            if 300 <= answer.status_code < 400 or answer.status_code < 200:
                log.warning("HTTP %s (not followed) from %s %s", answer.status_code, method, path)
                raise BatchRedirected(answer.status_code)
            if answer.status_code >= 400:
                log.warning(
                    "HTTP %s from %s %s: %s",
                    answer.status_code,
                    method,
                    path,
                    answer.content[:2000].decode("utf-8", "replace"),
                )
                raise classify_status(answer.status_code, answer.headers)
            self.gate.succeeded()
            return answer

    def _exchange(self, method: str, path: str, **kwargs: Any) -> Answer:
        """The answer's status, headers and body (of at most MAX_OBJECT_BYTES, or of
        MAX_ERROR_BYTES for an error: what passes it is not read)."""
        request = self._http.build_request(method, self._url(path), **kwargs)
        response = self._http.send(request, stream=True)
        try:
            limit = MAX_OBJECT_BYTES if response.status_code < 400 else MAX_ERROR_BYTES
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > limit:
                    if response.status_code >= 400:
                        break
                    raise BatchAnswerInvalid(
                        f"the provider's Batch API answer is larger than {limit // 2**20} MiB"
                    )
            return Answer(response.status_code, response.headers, bytes(body))
        finally:
            response.close()

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = self._send(method, path, **kwargs)
        try:
            data = json.loads(response.content)
        except (ValueError, RecursionError):
            raise BatchAnswerInvalid("the provider's Batch API answer could not be read") from None
        if not isinstance(data, dict):
            raise BatchAnswerInvalid("the provider's Batch API answer is not an object")
        return data

    def request_line(self, custom_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """One line of a batch's input file: a request body (the client's request_body) and the
        custom_id that binds its answer to it."""
        return {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": body,
        }

    def parse(self, body: Any, model: str) -> Completion:
        """An answered line's body as a Completion (the live protocol's reading)."""
        return parse_completion(body, endpoint=self.endpoint, model=model)

    def upload(self, path: Path) -> str:
        """Upload a JSONL file of requests (streamed from disk); its file id."""
        with path.open("rb") as handle:
            data = self._json(
                "POST",
                "files",
                total_s=self.timeout_s + os.fstat(handle.fileno()).st_size / UPLOAD_BYTES_PER_S,
                data={"purpose": "batch"},
                files={"file": (path.name, handle, "application/jsonl")},
            )
        file_id = _remote_id(data.get("id"))
        if file_id is None:
            raise BatchAnswerInvalid("the provider's answer to an upload has no usable file id")
        return file_id

    def create(self, input_file: str, *, window: str, metadata: dict[str, str]) -> RemoteBatch:
        return remote_batch(
            self._json(
                "POST",
                "batches",
                json={
                    "input_file_id": input_file,
                    "endpoint": "/v1/chat/completions",
                    "completion_window": window,
                    "metadata": metadata,
                },
            )
        )

    def get(self, batch_id: str) -> RemoteBatch:
        return remote_batch(self._json("GET", f"batches/{batch_id}"), expect_id=batch_id)

    def cancel(self, batch_id: str) -> dict[str, Any]:
        return self._json("POST", f"batches/{batch_id}/cancel")

    def find(
        self, batch: BatchRecord, *, recorded: frozenset[str] = frozenset()
    ) -> RemoteBatch | None:
        """The provider's batch whose metadata names our batch_id, among the newest; else None.
        A listed batch whose object is not valid is passed over. (recorded: the job's batches
        already recorded, which a search without metadata must pass over.)"""
        batch_id = batch.batch_id
        after: str | None = None
        for _ in range(FIND_PAGES):
            params: dict[str, Any] = {"limit": 100}
            if after:
                params["after"] = after
            page = self._json("GET", "batches", params=params)
            found = page.get("data")
            if not isinstance(found, list):
                return None
            for batch in found:
                metadata = batch.get("metadata") if isinstance(batch, dict) else None
                if isinstance(metadata, dict) and metadata.get(META_BATCH) == batch_id:
                    try:
                        return remote_batch(batch)
                    except BatchAnswerInvalid as exc:
                        log.warning(
                            "batch %s found at the provider but unusable: %s", batch_id, exc
                        )
            last = found[-1] if found else None
            after = _remote_id(last.get("id")) if isinstance(last, dict) else None
            if page.get("has_more") is not True or after is None:
                return None
        return None

    def lines(
        self,
        file_id: str,
        *,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        max_bytes: int | None = None,
    ) -> Iterator[FileLine]:
        """The lines of a file, read as they arrive, each checked (read_line): one line of at
        most max_line_bytes in memory at a time. The file is read for at most file_timeout_s
        and max_bytes: past either, BatchFileCut once the lines that came were given (the file
        never ended: what came stands, the rest is read again). BatchFileUnreadable when the
        file cannot be read (an HTTP error: the file is named, not the endpoint or model),
        BatchRedirected for a redirect (never an empty file)."""
        self.gate.wait_for_turn(0, max_block_s=float("inf"))
        what = self._content_name(file_id)
        at = time.monotonic() + self.file_timeout_s
        try:
            with deadline.until(at):
                request = self._http.build_request("GET", self._url(self._content_path(file_id)))
                response = self._http.send(request, stream=True)
            try:
                self._check_file_answer(response, what)
                chunks = _bounded_chunks(response, at, max_bytes, what, self.file_timeout_s)
                for raw, overlong in bounded_lines(chunks, max_line_bytes):
                    yield self._read_line(raw, overlong=overlong, max_bytes=max_line_bytes)
            finally:
                response.close()
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise BatchUnreachable(f"connection error ({type(exc).__name__})") from None
        except httpx.TimeoutException:
            raise BatchFileUnreadable(f"reading {what} timed out") from None
        except httpx.TransportError as exc:
            raise BatchFileUnreadable(f"reading {what} broke off ({type(exc).__name__})") from None

    def _check_file_answer(self, response: httpx.Response, what: str) -> None:
        """Anything but a 200 is not the file: a 429 pauses the key, a redirect is
        BatchRedirected, another status BatchFileUnreadable."""
        status = response.status_code
        if status == 200:
            return
        log.warning("HTTP %s reading %s", status, what)
        if status == 429:
            error = classify_status(429, response.headers)
            assert isinstance(error, RateLimited)
            self.gate.rate_limited(error.retry_after_s)
            raise error
        if 300 <= status < 400 or status < 200:
            raise BatchRedirected(status)
        # An error, or a 2xx that is not the file's 200 (a 204): not its content.
        raise BatchFileUnreadable(f"{what} could not be read (HTTP {status})", http_status=status)

    def _content_path(self, file_id: str) -> str:
        """Where an output or error file is read."""
        return f"files/{file_id}/content"

    def _content_name(self, file_id: str) -> str:
        """How a user is told which output or error file could not be read."""
        return f"file {file_id}"

    #: How one line of it is read and checked.
    _read_line = staticmethod(read_line)


class BatchFileUnreadable(TransientModelError):
    """An output or error file the provider would not (or could not) give whole."""

    error_type = "BatchFileUnreadable"


class BatchFileCut(BatchFileUnreadable):
    """A file that did not end within its time or byte bound: the lines read before stand."""


def _bounded_chunks(
    response: httpx.Response, at: float, max_bytes: int | None, what: str, timeout_s: float
) -> Iterator[bytes]:
    """The body's chunks until it ends, or BatchFileCut once it passes `at` or max_bytes."""
    chunks, seen = response.iter_bytes(), 0
    while True:
        try:
            with deadline.until(at):
                chunk = next(chunks, None)
        except httpx.TimeoutException:
            if not deadline.passed(at):
                raise
            raise BatchFileCut(f"{what} did not end within {timeout_s:g} s") from None
        if chunk is None:
            return
        seen += len(chunk)
        if max_bytes is not None and seen > max_bytes:
            yield chunk[: len(chunk) - (seen - max_bytes)]  # the lines within the bound stand
            raise BatchFileCut(f"{what} did not end within {max_bytes} bytes")
        yield chunk
