"""The loopback provider's Batch API: files and batches, as OpenAI's endpoints behave.

`POST /v1/files` (multipart, purpose=batch), `GET /v1/files/{id}/content`, `POST /v1/batches`,
`GET /v1/batches/{id}`, `GET /v1/batches` (newest first, limit/after), `POST
/v1/batches/{id}/cancel`. Files live in a temporary folder; each batch is processed by a thread
of its own, line by line, with the provider's faults (FakeProvider.line_answer) and its
settings: batch_delay_s (validating), batch_line_s (per line), batch_expire_after (lines, then
expired: the rest go to the error file as batch_expired), batch_hold (stays in progress until
cancelled or released by configuring it off). Output lines succeed, failed lines go to the
error file, as OpenAI writes them.

Hostile modes (`FakeBatches.configure(**BatchFaults fields)`), the ways a buggy or hostile Batch API
(or a proxy before it) answers: `line_faults` {substring of an item: kind} writes that item's output
line wrong (LINE_FAULTS); `create_fields` / `poll_fields` are merged into the answer to a create /
every other answer about a batch: poll, cancel, list (ABSENT drops a field); `files_missing` answers
404 for every file's content; `ignore_cancel` answers a cancel but goes on; `foreign_lines` writes
the first batch's output lines (another job's answers) at the start of every later batch's output
file. Message Batches get the same modes in Anthropic's shapes (create_fields and poll_fields
dress the message_batch objects).

What a test checks is recorded: `lines` (one RequestRecord per line processed), `uploaded`
(file id -> its number of lines), `created` (every batch created, in order) and
`processing_s` (the seconds batches spent processing, summed) and busy_s() (the provider's own
time: seconds during which any batch was processing).
"""

from __future__ import annotations

import datetime
import json
import re
import secrets
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

#: A Message Batches request's custom_id, as Anthropic checks it.
_MESSAGE_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _query(target: str) -> dict[str, str]:
    """A request target's query parameters (the fake's clients send plain ones)."""
    if "?" not in target:
        return {}
    return dict(p.split("=", 1) for p in target.split("?", 1)[1].split("&") if "=" in p)


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat().replace("+00:00", "Z")


#: A field value in create_fields / poll_fields that leaves the field out of the answer.
ABSENT = "<absent>"
#: How line_faults write an item's output line:
#:   not_object          `[1, 2, 3]`
#:   not_json            its custom_id, then JSON cut short
#:   no_custom_id        the answer, without a custom_id
#:   missing             no line at all (the batch completes without answering it)
#:   bad_status          status_code "200" (a string); Message Batches: a result type that is a list
#:   bad_body            status 200 and a body that is a list; Message Batches: the message a list
#:   huge                the answer padded to huge_line_bytes (custom_id first), then a newline
#:   huge_unterminated   the same, last in the file, with no newline after it
LINE_FAULTS = (
    "not_object",
    "not_json",
    "no_custom_id",
    "missing",
    "bad_status",
    "bad_body",
    "huge",
    "huge_unterminated",
)


@dataclass
class BatchFaults:
    line_faults: dict[str, str] = field(default_factory=dict)
    create_fields: dict[str, Any] = field(default_factory=dict)
    poll_fields: dict[str, Any] = field(default_factory=dict)
    files_missing: bool = False
    ignore_cancel: bool = False
    foreign_lines: bool = False
    huge_line_bytes: int = 1024 * 1024
    #: {kind of call: a 3xx status} answered (with a Location elsewhere) to that kind of call:
    #: upload, create, get, list, cancel, content (an output file, a batch's results)
    redirects: dict[str, int] = field(default_factory=dict)
    #: A status (400, 404, 405) answered to every upload and batch create: no batch API here
    no_batch_api: int | None = None
    #: An output file or results that never end: "blank" (the lines, then newlines for ever),
    #: "bytes" (the lines, then bytes without a newline for ever)
    endless: str | None = None


#: The kinds of call `redirects` names.
CALL_KINDS = ("upload", "create", "get", "list", "cancel", "content")


@dataclass(frozen=True)
class Redirect:
    """An answer that sends the client elsewhere (its Location)."""

    location: str


@dataclass(frozen=True)
class Endless:
    """A file's content, then `kind` (Endless.FILL) for ever."""

    path: Path
    kind: str

    FILL = {"blank": b"\n" * 65536, "bytes": b"x" * 65536}


def call_kind(method: str, parts: list[str]) -> str | None:
    """Which kind of Batch API call a request is (CALL_KINDS), on either protocol."""
    if parts[:2] == ["messages", "batches"]:
        parts = ["batches", *parts[2:]]
        if parts[2:] == ["results"]:
            return "content" if method == "GET" else None
    if method == "POST":
        return {("files",): "upload", ("batches",): "create"}.get(tuple(parts)) or (
            "cancel" if parts[-1:] == ["cancel"] else None
        )
    if parts == ["batches"]:
        return "list"
    if len(parts) == 2 and parts[0] == "batches":
        return "get"
    return "content" if parts[:1] == ["files"] and parts[2:] == ["content"] else None


def _dressed(batch: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(batch)
    for key, value in changes.items():
        if value == ABSENT:
            out.pop(key, None)
        else:
            out[key] = value
    return out


class FakeBatches:
    def __init__(self, provider: Any) -> None:
        self.provider = provider
        self.dir = Path(tempfile.mkdtemp(prefix="fake-batches-"))
        self.lock = threading.Lock()
        self.files: dict[str, Path] = {}
        self.uploaded: dict[str, int] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self.created: list[str] = []
        self.lines: list[Any] = []
        self.processing_s = 0.0
        self.busy: list[
            tuple[float, float]
        ] = []  # (start, end) of each batch's processing, monotonic
        self._threads: list[threading.Thread] = []
        self._closing = False
        self.faults = BatchFaults()
        self.file_gets: list[str] = []  # every file whose content was asked for, in order
        self.cancels: list[str] = []  # every batch a cancel was asked for, in order
        self.calls: list[str] = []  # the kind of every Batch API call (CALL_KINDS), in order

    def configure(self, **changes: Any) -> None:
        """Set hostile modes (BatchFaults' fields)."""
        known = {f.name for f in fields(BatchFaults)}
        for key, value in changes.items():
            if key not in known:
                raise ValueError(f"unknown fake-batches fault {key!r}")
            if key == "line_faults" and set(value.values()) - set(LINE_FAULTS):
                raise ValueError(f"unknown line fault in {value!r}")
            setattr(self.faults, key, value)

    def close(self) -> None:
        self._closing = True
        for thread in self._threads:
            thread.join(5)
        shutil.rmtree(self.dir, ignore_errors=True)

    def busy_s(self) -> float:
        """Seconds during which at least one batch was being processed (overlaps counted once)."""
        total, reach = 0.0, float("-inf")
        with self.lock:
            spans = sorted(self.busy)
        for start, end in spans:
            if end > reach:
                total += end - max(start, reach)
                reach = end
        return total

    def bodies(self) -> list[dict[str, Any]]:
        """Every request body uploaded in batch files, in order."""
        out = []
        for file_id in self.uploaded:
            with self.files[file_id].open() as handle:
                out += [json.loads(line)["body"] for line in handle if line.strip()]
        return out

    # Routing ------------------------------------------------------------------------------
    def route(self, method: str, path: str, target: str, body: bytes, headers: dict[str, str]):
        parts = [p for p in path.split("/") if p]
        if parts and parts[0] == "v1":
            parts = parts[1:]
        kind = call_kind(method, parts)
        with self.lock:
            self.calls.append(kind or "other")
        if kind in self.faults.redirects:
            return self.faults.redirects[kind], Redirect("http://127.0.0.2:9/elsewhere" + path)
        if kind in ("upload", "create") and self.faults.no_batch_api:
            status = self.faults.no_batch_api
            return status, self.provider.anthropic_error(status, "Not Found: " + path)
        status, answer = self._route(method, parts, target, body, headers)
        if kind == "content" and self.faults.endless and isinstance(answer, Path):
            return status, Endless(answer, self.faults.endless)
        return status, answer

    def _route(
        self, method: str, parts: list[str], target: str, body: bytes, headers: dict[str, str]
    ):
        if parts[:2] == ["messages", "batches"]:
            return self._message_batches(method, parts[2:], target, body)
        if method == "POST" and parts == ["files"]:
            return self._upload(body, headers.get("content-type", ""))
        if method == "GET" and len(parts) == 3 and parts[0] == "files" and parts[2] == "content":
            path_ = self.files.get(parts[1])
            with self.lock:
                self.file_gets.append(parts[1])
            if self.faults.files_missing or path_ is None:
                return 404, {"error": {"message": "no such file"}}
            return (
                200,
                path_,
            )  # streamed from disk (a file may be far larger than memory should hold)
        if method == "POST" and parts == ["batches"]:
            status, answer = self._create(json.loads(body or b"{}"))
            return status, _dressed(answer, self.faults.create_fields) if status == 200 else answer
        if method == "GET" and parts == ["batches"]:
            return 200, self._list(target)
        if len(parts) >= 2 and parts[0] == "batches":
            with self.lock:
                batch = self.batches.get(parts[1])
                if batch is None or batch["anthropic"]:  # a message batch is not a batch here
                    return 404, {"error": {"message": "no such batch"}}
                if method == "POST" and parts[2:] == ["cancel"]:
                    self.cancels.append(parts[1])
                    if not self.faults.ignore_cancel and batch["status"] not in (
                        "completed",
                        "failed",
                        "expired",
                        "cancelled",
                    ):
                        batch["status"], batch["cancelling_at"] = "cancelling", int(time.time())
                return 200, _dressed(batch, self.faults.poll_fields)
        return 404, {"error": {"message": "not found"}}

    def _upload(self, body: bytes, content_type: str):
        boundary = content_type.split("boundary=", 1)[-1].strip('"').encode()
        content, purpose = None, None
        for part in body.split(b"--" + boundary):
            if b"\r\n\r\n" not in part:
                continue
            head, data = part.split(b"\r\n\r\n", 1)
            data = data[:-2] if data.endswith(b"\r\n") else data
            if b'name="file"' in head:
                content = data
            elif b'name="purpose"' in head:
                purpose = data.decode()
        if content is None or purpose != "batch":
            return 400, {"error": {"message": "a file with purpose=batch is expected"}}
        file_id = "file-" + secrets.token_hex(8)
        path = self.dir / file_id
        path.write_bytes(content)
        with self.lock:
            self.files[file_id] = path
            self.uploaded[file_id] = content.count(b"\n") + (
                0 if content.endswith(b"\n") or not content else 1
            )
        return 200, {
            "id": file_id,
            "object": "file",
            "bytes": len(content),
            "purpose": "batch",
            "created_at": int(time.time()),
            "filename": "batch.jsonl",
        }

    def _create(self, req: dict[str, Any], *, anthropic: bool = False):
        if (
            req.get("input_file_id") not in self.files
            or req.get("endpoint") != "/v1/chat/completions"
        ):
            return 400, {"error": {"message": "unknown input file or endpoint"}}
        batch_id = ("msgbatch_" if anthropic else "batch_") + secrets.token_hex(8)
        batch = {
            "id": batch_id,
            "object": "batch",
            "endpoint": req["endpoint"],
            "input_file_id": req["input_file_id"],
            "completion_window": req.get("completion_window"),
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": int(time.time()),
            "in_progress_at": None,
            "completed_at": None,
            "expired_at": None,
            "cancelled_at": None,
            "request_counts": {
                "total": self.uploaded[req["input_file_id"]],
                "completed": 0,
                "failed": 0,
            },
            "metadata": req.get("metadata") or {},
            # Message Batches: the results' counts by Anthropic's kinds, and when a cancel came
            "anthropic": anthropic,
            "results": {"succeeded": 0, "errored": 0, "canceled": 0, "expired": 0},
        }
        with self.lock:
            self.batches[batch_id] = batch
            self.created.append(batch_id)
        thread = threading.Thread(
            target=self._process, args=(batch_id,), daemon=True, name="fake-batch"
        )
        self._threads.append(thread)
        thread.start()
        return 200, dict(batch)

    def _list(self, target: str) -> dict[str, Any]:
        query = _query(target)
        limit = int(query.get("limit", 20))
        with self.lock:
            ids = [i for i in reversed(self.created) if not self.batches[i]["anthropic"]]
            if query.get("after") in ids:
                ids = ids[ids.index(query["after"]) + 1 :]
            page = [_dressed(self.batches[i], self.faults.poll_fields) for i in ids[:limit]]
        return {
            "object": "list",
            "data": page,
            "has_more": len(ids) > limit,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
        }

    # Message Batches (Anthropic) -------------------------------------------------------------
    def _message_batches(self, method: str, rest: list[str], target: str, body: bytes):
        """POST /v1/messages/batches, GET …/{id}, GET … (newest first, limit/after_id),
        POST …/{id}/cancel, GET …/{id}/results: the same batches underneath, in Anthropic's
        shapes; a request's custom_id must match ^[a-zA-Z0-9_-]{1,64}$, as Anthropic's must."""
        if method == "POST" and not rest:
            return self._create_message_batch(body)
        if method == "GET" and not rest:
            return 200, self._list_message_batches(target)
        with self.lock:
            batch = self.batches.get(rest[0]) if rest else None
            if batch is None or not batch.get("anthropic"):
                return 404, self.provider.anthropic_error(404, "no such message batch")
            if method == "POST" and rest[1:] == ["cancel"]:
                self.cancels.append(rest[0])
                if not self.faults.ignore_cancel and batch["status"] in (
                    "validating",
                    "in_progress",
                ):
                    batch["status"], batch["cancelling_at"] = "cancelling", int(time.time())
                return 200, self._message_batch_view(batch)
            if method == "GET" and not rest[1:]:
                return 200, self._message_batch_view(batch)
            if method == "GET" and rest[1:] == ["results"]:
                path_ = self.files.get(batch.get("output_file_id") or "")
                self.file_gets.append(rest[0])
                if self.faults.files_missing or path_ is None:
                    return 404, self.provider.anthropic_error(404, "the batch has no results yet")
                return 200, path_
        return 404, self.provider.anthropic_error(404, "not found")

    def _create_message_batch(self, body: bytes):
        try:
            requests = json.loads(body or b"{}").get("requests")
        except (ValueError, AttributeError):
            requests = None
        ids = [r.get("custom_id") for r in requests or [] if isinstance(r, dict)]
        if (
            not isinstance(requests, list)
            or not requests
            or len(ids) != len(requests)
            or len(set(ids)) != len(ids)
            or not all(isinstance(i, str) and _MESSAGE_CUSTOM_ID.match(i) for i in ids)
            or not all(isinstance(r.get("params"), dict) for r in requests)
        ):
            return 400, self.provider.anthropic_error(
                400, "requests: each needs a unique custom_id and params"
            )
        file_id = "file-" + secrets.token_hex(8)
        path = self.dir / file_id
        with path.open("w") as out:
            for r in requests:
                chat = self.provider.as_chat_request(r["params"])
                out.write(json.dumps({"custom_id": r["custom_id"], "body": chat, **r}) + "\n")
        with self.lock:
            self.files[file_id] = path
            self.uploaded[file_id] = len(requests)
        status, created = self._create(
            {"input_file_id": file_id, "endpoint": "/v1/chat/completions"}, anthropic=True
        )
        with self.lock:
            return status, self._message_batch_view(
                self.batches[created["id"]], self.faults.create_fields
            )

    def _list_message_batches(self, target: str) -> dict[str, Any]:
        query = _query(target)
        limit = int(query.get("limit", 20))
        with self.lock:
            ids = [i for i in reversed(self.created) if self.batches[i].get("anthropic")]
            if query.get("after_id") in ids:
                ids = ids[ids.index(query["after_id"]) + 1 :]
            page = [self._message_batch_view(self.batches[i]) for i in ids[:limit]]
        return {
            "data": page,
            "has_more": len(ids) > limit,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
        }

    def _message_batch_view(
        self, batch: dict[str, Any], dress: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """A batch as Anthropic's message_batch object (under the lock), dressed with `dress`
        (by default poll_fields)."""
        status = batch["status"]
        processing = {"validating": "in_progress", "in_progress": "in_progress"}.get(
            status, "canceling" if status == "cancelling" else "ended"
        )
        counts = dict(batch["results"])
        total = batch["request_counts"]["total"]
        counts["processing"] = 0 if processing == "ended" else total - sum(counts.values())
        ended = processing == "ended"
        return _dressed(
            {
                "id": batch["id"],
                "type": "message_batch",
                "processing_status": processing,
                "request_counts": counts,
                "created_at": _iso(batch["created_at"]),
                "expires_at": _iso(batch["created_at"] + 86_400),
                "ended_at": _iso(
                    batch.get("completed_at")
                    or batch.get("cancelled_at")
                    or batch.get("expired_at")
                )
                if ended
                else None,
                "cancel_initiated_at": _iso(batch["cancelling_at"])
                if batch.get("cancelling_at")
                else None,
                "archived_at": None,
                "results_url": f"{self.provider.base_url}/messages/batches/{batch['id']}/results"
                if ended
                else None,
            },
            self.faults.poll_fields if dress is None else dress,
        )

    def _answer_message_line(
        self, batch: dict[str, Any], line: dict[str, Any], out, last: list[bytes]
    ) -> int:
        """One Message Batches request answered into the results file, in Anthropic's shape (a
        line fault of its item writes it wrong, as _answer_line does)."""
        status, body = self.provider.message_line_answer(line["params"], self.lines)
        with self.lock:
            batch["results"]["succeeded" if status == 200 else "errored"] += 1
        entry = {"custom_id": line["custom_id"]}
        fault = self._line_fault(line)
        if fault is not None:
            answer = {**entry, "result": {"type": "succeeded", "message": body}}
            self._write_fault(
                fault,
                answer,
                out,
                last,
                bad_status={**entry, "result": {"type": ["succeeded"], "message": body}},
                bad_body={**entry, "result": {"type": "succeeded", "message": [1, 2, 3]}},
                huge_head=json.dumps(entry)[:-1]
                + ', "result": {"type": "succeeded", "message": {"pad": "',
            )
            return status
        if status == 200:
            result: dict[str, Any] = {"type": "succeeded", "message": body}
        else:
            result = {
                "type": "errored",
                "error": body or self.provider.anthropic_error(500, "fake: dropped"),
            }
        out.write(json.dumps({**entry, "result": result}) + "\n")
        return status

    def _line_fault(self, line: dict[str, Any]) -> str | None:
        """The line fault configured for this line's item, if any."""
        item = self.provider.item_of(line["body"])
        return next(
            (kind for marker, kind in self.faults.line_faults.items() if marker in item), None
        )

    def _expire_line(self, batch: dict[str, Any], line: dict[str, Any], out, err) -> None:
        """A request the batch's window closed on: batch_expired in the error file (OpenAI), an
        expired result (Anthropic)."""
        if batch["anthropic"]:
            self._end_message_line(batch, line, out, "expired")
            return
        err.write(
            json.dumps(
                {
                    "id": "req_" + secrets.token_hex(6),
                    "custom_id": line["custom_id"],
                    "response": None,
                    "error": {
                        "code": "batch_expired",
                        "message": "This request could not be executed "
                        "before the completion window expired.",
                    },
                }
            )
            + "\n"
        )

    def _end_message_line(self, batch: dict[str, Any], line: dict[str, Any], out, kind: str):
        """A request the batch ended before answering: its result says canceled or expired."""
        out.write(json.dumps({"custom_id": line["custom_id"], "result": {"type": kind}}) + "\n")
        with self.lock:
            batch["results"][kind] += 1

    # Processing ---------------------------------------------------------------------------
    def _status(self, batch_id: str) -> str:
        with self.lock:
            return self.batches[batch_id]["status"]

    def _answer_line(self, line: dict[str, Any], out, err, last: list[bytes]) -> int:
        """Answer one line into the output (a success) or error file; its status code. A line fault
        of the item writes it wrong (an unterminated line goes in `last`, written at the end)."""
        status, body = self.provider.line_answer(line["body"], self.lines)
        entry = {"id": "batch_req_" + secrets.token_hex(6), "custom_id": line["custom_id"]}
        fault = self._line_fault(line)
        if fault is not None:
            response = {"status_code": 200, "request_id": "req_x", "body": body}
            answer = {**entry, "response": response, "error": None}
            self._write_fault(
                fault,
                answer,
                out,
                last,
                bad_status={**answer, "response": {**response, "status_code": "200"}},
                bad_body={**answer, "response": {**response, "body": [1, 2, 3]}},
                huge_head=json.dumps(entry)[:-1]
                + ', "response": {"status_code": 200, "body": {"pad": "',
            )
            return status
        if status == 200:
            out.write(
                json.dumps(
                    {
                        **entry,
                        "response": {"status_code": 200, "request_id": "req_x", "body": body},
                        "error": None,
                    }
                )
                + "\n"
            )
        elif status == 0:
            err.write(
                json.dumps(
                    {
                        **entry,
                        "response": None,
                        "error": {"code": "server_error", "message": "fake: dropped"},
                    }
                )
                + "\n"
            )
        else:
            err.write(
                json.dumps(
                    {
                        **entry,
                        "response": {"status_code": status, "request_id": "req_x", "body": body},
                        "error": None,
                    }
                )
                + "\n"
            )
        return status

    def _write_fault(
        self,
        fault: str,
        answer: dict[str, Any],
        out,
        last: list[bytes],
        *,
        bad_status: dict[str, Any],
        bad_body: dict[str, Any],
        huge_head: str,
    ) -> None:
        """An item's line written as LINE_FAULTS says, from its well-formed `answer` and the
        protocol's own wrong shapes (`bad_status`, `bad_body`, the start of a huge line)."""
        if fault == "missing":
            return
        if fault == "not_object":
            out.write("[1, 2, 3]\n")
        elif fault == "not_json":
            out.write(json.dumps(answer)[:-10] + "\n")  # cut short: its custom_id is still there
        elif fault == "no_custom_id":
            out.write(json.dumps({k: v for k, v in answer.items() if k != "custom_id"}) + "\n")
        elif fault == "bad_status":
            out.write(json.dumps(bad_status) + "\n")
        elif fault == "bad_body":
            out.write(json.dumps(bad_body) + "\n")
        # huge, huge_unterminated: the start of a well-formed line, then padding far past any limit
        elif fault == "huge":
            self._pad(out, huge_head, self.faults.huge_line_bytes)
            out.write('"}}}\n')
        else:
            last.append(huge_head.encode())

    def _write_foreign(self, batch_id: str, out) -> None:
        """foreign_lines: the first batch's output (another job's answers), before this batch's
        own."""
        if self.faults.foreign_lines and self.created and self.created[0] != batch_id:
            first = self.batches[self.created[0]].get("output_file_id")
            if first in self.files:
                out.write(self.files[first].read_text())

    def _write_last(self, last: list[bytes], out) -> None:
        """An unterminated huge line: its head, then padding to the end of the file."""
        for head in last:
            self._pad(out, head.decode(), self.faults.huge_line_bytes)

    @staticmethod
    def _pad(out, head: str, size: int) -> None:
        out.write(head)
        chunk = "x" * (1024 * 1024)
        left = max(0, size - len(head))
        while left:
            out.write(chunk[: min(left, len(chunk))])
            left -= min(left, len(chunk))

    def _validate(self, batch_id: str) -> None:
        """batch_delay_s in `validating`, unless cancelled first."""
        deadline = time.monotonic() + self.provider.config.batch_delay_s
        while (
            time.monotonic() < deadline
            and not self._closing
            and self._status(batch_id) == "validating"
        ):
            time.sleep(0.01)

    def _process(self, batch_id: str) -> None:
        cfg = self.provider.config
        self._validate(batch_id)
        with self.lock:
            batch = self.batches[batch_id]
            if batch["status"] == "validating":
                batch["status"], batch["in_progress_at"] = "in_progress", int(time.time())
        started = time.monotonic()
        out_path, err_path = self.dir / f"{batch_id}.out", self.dir / f"{batch_id}.err"
        done = expired = 0
        last: list[bytes] = []
        with (
            self.files[batch["input_file_id"]].open() as lines,
            out_path.open("w") as out,
            err_path.open("w") as err,
        ):
            self._write_foreign(batch_id, out)
            owed = 0.0
            for raw in lines:
                if not raw.strip():
                    continue
                while (
                    cfg.batch_hold and not self._closing and self._status(batch_id) == "in_progress"
                ):
                    time.sleep(0.01)
                line = json.loads(raw)
                if self._closing or self._status(batch_id) != "in_progress":
                    if not batch["anthropic"] or self._closing:
                        break  # cancelled: the lines not processed are not answered
                    self._end_message_line(batch, line, out, "canceled")
                    continue  # Message Batches give every request a result: canceled
                if cfg.batch_expire_after is not None and done >= cfg.batch_expire_after:
                    expired += 1
                    self._expire_line(batch, line, out, err)
                    continue
                status = (
                    self._answer_message_line(batch, line, out, last)
                    if batch["anthropic"]
                    else self._answer_line(line, out, err, last)
                )
                done += 1
                with self.lock:
                    counts = batch["request_counts"]
                    counts["completed" if status == 200 else "failed"] += 1
                owed += cfg.batch_line_s
                if owed >= 0.01:
                    time.sleep(owed)
                    owed = 0.0
            self._write_last(last, out)
        with self.lock:
            self.processing_s += time.monotonic() - started
            self.busy.append((started, time.monotonic()))
            for path, key in ((out_path, "output_file_id"), (err_path, "error_file_id")):
                # An ended message batch always has its results, though they may be empty.
                if path.stat().st_size or (batch["anthropic"] and key == "output_file_id"):
                    file_id = "file-" + secrets.token_hex(8)
                    self.files[file_id] = path
                    batch[key] = file_id
            now = int(time.time())
            if batch["status"] == "cancelling":
                batch["status"], batch["cancelled_at"] = "cancelled", now
            elif expired:
                batch["status"], batch["expired_at"] = "expired", now
            elif not self._closing:
                batch["status"], batch["completed_at"] = "completed", now
