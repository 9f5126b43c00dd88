"""Anthropic's Message Batches API, as the batch driver speaks to OpenAI's Batch API.

`MessageBatchApi` is `BatchApi` (the same calls through the key's shared wait, the same checked
answers) with Anthropic's shapes underneath, so runtime/batch_driver.py runs a Claude batch job
exactly as an OpenAI one: the same leases, bound custom_ids, strikes, cancels and ingest.

  - No file upload: the requests go inline in `POST /messages/batches`. `upload` keeps the
    written file (`<batch>.requests.jsonl`, in the job's folder) and returns `local:<its name>`,
    so the store still records, before the create, that the batch may exist at the provider;
    `create` reads it, sends it and removes it. A worker on another machine that takes the batch
    over finds no such file: the batch is given up as a failed create would be (its items get
    an attempt and go to a later batch) rather than sent twice.
  - `get` maps `processing_status` (in_progress, canceling, ended) and the five request counts
    onto RemoteBatch: an ended batch is `cancelled` once a cancel was asked, `expired` when
    requests expired, else `completed`; its results are its one "output file".
  - `lines` streams `GET /messages/batches/{id}/results` and reads each line into the FileLine
    an OpenAI output line would be: `succeeded` a 200 with the message as its body, `errored`
    the status its error type stands for, `canceled` / `expired` the batch's end (not the
    item's). Every field is checked (`read_result`): a line of another shape is a problem line,
    bound to its custom_id when one can be read.
  - `find`: Message Batches carry no metadata, so a batch created by a worker that died before
    recording it is looked for among the batches created since ours was opened, by its request
    count; adopted only when exactly one fits. A wrong one would do no harm beyond its cost:
    its lines name another batch's custom_ids and are ignored.
"""

from __future__ import annotations

import datetime
import logging
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from ..store.protocol import BatchRecord
from . import anthropic
from .batch_api import (
    DEFAULT_MAX_LINE_BYTES,
    FIND_PAGES,
    BatchAnswerInvalid,
    BatchApi,
    FileLine,
    RemoteBatch,
    _count,
    _remote_id,
    bound_object,
    checked_id,
)
from .client import Completion

log = logging.getLogger("hermes_bulk.providers.message_batches")

#: Anthropic takes up to 100,000 requests and 256 MB a batch; the driver sends at most its own
#: limits (50,000 and 200 MB, OpenAI's), which are below.
#: Batches asked for per page when looking for an unrecorded one (the API allows 1,000).
FIND_PAGE_SIZE = 100
LOCAL = "local:"
#: How the requests file of a batch not yet created is named (in the job's batches folder).
KEPT_SUFFIX = ".requests.jsonl"
PROCESSING = frozenset({"in_progress", "canceling", "ended"})
COUNTS = ("succeeded", "errored", "canceled", "expired", "processing")
#: The HTTP status each error type of a batch result stands for (as the live API answers it).
ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
#: How far before our batch was opened a provider's batch may have been created and still be
#: ours (clocks of the store and the provider differ).
FIND_SKEW_S = 300.0


class MessageBatchApi(BatchApi):
    """One endpoint's Message Batches API, for one worker."""

    def __init__(self, *, api_key: str | None, **kw: Any) -> None:
        super().__init__(api_key=None, **kw)
        self._http.headers.update(anthropic.auth_headers(api_key))

    KIND = "Message Batches"

    def request_line(self, custom_id: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"custom_id": custom_id, "params": body}

    def discard(self, input_file: str | None) -> None:
        kept = Path(input_file.removeprefix(LOCAL)) if input_file else None
        if input_file and input_file.startswith(LOCAL) and kept and kept.name.endswith(KEPT_SUFFIX):
            kept.unlink(missing_ok=True)

    def parse(self, body: Any, model: str) -> Completion:
        return anthropic.parse_message(body, endpoint=self.endpoint, model=model)

    def upload(self, path: Path) -> str:
        kept = path.with_name(path.stem + KEPT_SUFFIX)
        path.replace(kept)
        return LOCAL + str(kept)

    def create(self, input_file: str, *, window: str, metadata: dict[str, str]) -> RemoteBatch:
        kept = Path(input_file.removeprefix(LOCAL)) if input_file.startswith(LOCAL) else None
        handle = _open_kept(kept) if kept is not None else None
        if kept is None or handle is None:
            raise BatchAnswerInvalid(
                "the batch's requests are not on this machine (it was opened by a worker on "
                "another one); it is given up and its items go to a later batch"
            )
        with handle:  # closed here: a file left to the collector warns
            lines = [line.rstrip(b"\n") for line in handle if line.strip()]
        body = b'{"requests":[' + b",".join(lines) + b"]}"
        created = message_batch(
            self._json(
                "POST",
                "messages/batches",
                content=body,
                headers={"content-type": "application/json"},
            )
        )
        kept.unlink(missing_ok=True)
        return created

    def get(self, batch_id: str) -> RemoteBatch:
        return message_batch(self._json("GET", f"messages/batches/{batch_id}"), expect_id=batch_id)

    def cancel(self, batch_id: str) -> dict[str, Any]:
        return self._json("POST", f"messages/batches/{batch_id}/cancel")

    def find(
        self, batch: BatchRecord, *, recorded: frozenset[str] = frozenset()
    ) -> RemoteBatch | None:
        """The one batch created since ours was opened with as many requests as ours holds,
        among those not recorded as another batch of the job (`recorded`): the job's earlier
        batch of the same size, created within the clocks' skew, is never taken for this one."""
        since = batch.created_at - FIND_SKEW_S
        fits: list[RemoteBatch] = []
        after: str | None = None
        for _ in range(FIND_PAGES):
            params: dict[str, Any] = {
                "limit": FIND_PAGE_SIZE,
                **({"after_id": after} if after else {}),
            }
            page = self._json("GET", "messages/batches", params=params)
            found = page.get("data")
            if not isinstance(found, list):
                return None
            older = False
            for data in found:
                created = _created_at(data)
                if created is None or created < since:
                    older = True
                    continue
                try:
                    remote = message_batch(data)
                except BatchAnswerInvalid:
                    continue
                if _total(data) == batch.items and remote.id not in recorded:
                    fits.append(remote)
            after = _remote_id(page.get("last_id"))
            if older or page.get("has_more") is not True or after is None:
                break
        if len(fits) != 1:
            if fits:
                log.warning(
                    "batch %s: %d provider batches could be it; none is adopted",
                    batch.batch_id,
                    len(fits),
                )
            return None
        return fits[0]

    def _content_path(self, file_id: str) -> str:
        return f"messages/batches/{file_id}/results"  # the "file" is the batch: its results

    def _content_name(self, file_id: str) -> str:
        return f"the results of batch {file_id}"

    @staticmethod
    def _read_line(raw: bytes, *, overlong: bool, max_bytes: int) -> FileLine:
        return read_result(raw, overlong=overlong, max_bytes=max_bytes)


def _open_kept(path: Path) -> BinaryIO | None:
    """The requests file `upload` kept, opened for reading; None for anything else at that name.
    The name comes from the store, so it is checked before the file is read and then removed:
    a regular file of this user (not a link, FIFO or device), named `*.requests.jsonl`, in a
    job's `batches` folder."""
    if not path.name.endswith(KEPT_SUFFIX) or path.parent.name != "batches":
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    meta = os.fstat(fd)
    if not stat.S_ISREG(meta.st_mode) or meta.st_uid != os.geteuid():
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def message_batch(data: object, *, expect_id: str | None = None) -> RemoteBatch:
    """A message_batch object, checked field by field, as the RemoteBatch the driver reads."""
    if not isinstance(data, dict) or data.get("type", "message_batch") != "message_batch":
        raise BatchAnswerInvalid("the provider's batch answer is not a message batch")
    batch_id = checked_id(data, expect_id)
    status = data.get("processing_status")
    if status not in PROCESSING:
        raise BatchAnswerInvalid(
            f"the provider's answer about batch {batch_id} has an unknown status"
        )
    counts = data.get("request_counts")
    counts = counts if isinstance(counts, dict) else None
    read = {k: _count((counts or {}).get(k)) for k in COUNTS}
    if counts is None or any(v is None for v in read.values()):
        raise BatchAnswerInvalid(
            f"the provider's answer about batch {batch_id} has unreadable request counts"
        )
    if status == "ended":
        if data.get("cancel_initiated_at") and read["canceled"]:
            ours = "cancelled"
        elif read["expired"]:
            ours = "expired"
        else:
            ours = "completed"
    else:
        ours = "cancelling" if status == "canceling" else "in_progress"
    failed = (read["errored"] or 0) + (read["canceled"] or 0) + (read["expired"] or 0)
    ended = status == "ended"
    return RemoteBatch(
        batch_id, ours, read["succeeded"] or 0, failed, batch_id if ended else None, None
    )


def _created_at(data: object) -> float | None:
    text = data.get("created_at") if isinstance(data, dict) else None
    if not isinstance(text, str) or len(text) > 64:
        return None
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    return when.timestamp() if when.tzinfo else None


def _total(data: dict[str, Any]) -> int | None:
    counts = data.get("request_counts")
    if not isinstance(counts, dict):
        return None
    values = [
        _count(counts.get(k)) for k in ("succeeded", "errored", "canceled", "expired", "processing")
    ]
    return None if any(v is None for v in values) else sum(v or 0 for v in values)


def read_result(
    raw: bytes, *, overlong: bool = False, max_bytes: int = DEFAULT_MAX_LINE_BYTES
) -> FileLine:
    """A results line, checked, as the FileLine an OpenAI output line would be:
    `{"custom_id", "result": {"type": "succeeded", "message": {…}}}` is a 200 with the message as
    its body; `errored` is the status of its error type (500 when unknown); `canceled` and
    `expired` are the batch's end (`batch_cancelled`, `batch_expired`)."""
    bound = bound_object(raw, overlong=overlong, max_bytes=max_bytes)
    if isinstance(bound, FileLine):
        return bound
    custom_id, data = bound
    result = data.get("result")
    kind = result.get("type") if isinstance(result, dict) else None
    if kind == "succeeded":
        message = result.get("message")
        if not isinstance(message, dict):
            return FileLine(custom_id, problem="a line whose answer is not an object")
        return FileLine(
            custom_id,
            data={
                "custom_id": custom_id,
                "response": {"status_code": 200, "body": message},
                "error": None,
            },
        )
    if kind == "errored":
        error = result.get("error")
        inner = error.get("error") if isinstance(error, dict) else None
        error_type = inner.get("type") if isinstance(inner, dict) else None
        status = ERROR_STATUS.get(error_type, 500) if isinstance(error_type, str) else 500
        return FileLine(
            custom_id,
            data={
                "custom_id": custom_id,
                "response": {"status_code": status, "body": None},
                "error": None,
            },
        )
    if kind in ("canceled", "expired"):
        code = "batch_cancelled" if kind == "canceled" else "batch_expired"
        return FileLine(
            custom_id, data={"custom_id": custom_id, "response": None, "error": {"code": code}}
        )
    return FileLine(custom_id, problem="a line whose result is of no known type")
