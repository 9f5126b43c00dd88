"""The loopback provider's Batch API: files and batches, as OpenAI's endpoints behave.

`POST /v1/files` (multipart, purpose=batch), `GET /v1/files/{id}/content`, `POST /v1/batches`,
`GET /v1/batches/{id}`, `GET /v1/batches` (newest first, limit/after), `POST
/v1/batches/{id}/cancel`. Files live in a temporary folder; each batch is processed by a thread
of its own, line by line, with the provider's faults (FakeProvider.line_answer) and its
settings: batch_delay_s (validating), batch_line_s (per line), batch_expire_after (lines, then
expired: the rest go to the error file as batch_expired), batch_hold (stays in progress until
cancelled or released by configuring it off). Output lines succeed, failed lines go to the
error file, as OpenAI writes them.

The hostile modes a test sets (`FakeBatches.configure(**BatchFaults fields)`) are described in
fake_batch_faults.py; Message Batches, the same batches in Anthropic's shapes, are in
fake_message_batches.py.

What a test checks is recorded: `lines` (one RequestRecord per line processed), `uploaded`
(file id -> its number of lines), `created` (every batch created, in order) and
`processing_s` (the seconds batches spent processing, summed) and busy_s() (the provider's own
time: seconds during which any batch was processing).
"""

from __future__ import annotations

import json
import secrets
import shutil
import tempfile
import threading
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from .fake_anthropic import anthropic_error
from .fake_batch_faults import (
    ABSENT,
    LINE_FAULTS,
    BatchFaults,
    Endless,
    Redirect,
    call_kind,
    dressed,
    query_params,
)
from .fake_message_batches import MessageBatches

#: ABSENT is imported from here by tests: what a poll_fields value drops.
__all__ = ["ABSENT", "FakeBatches"]


class FakeBatches(MessageBatches):
    """The Batch API of one FakeProvider: its files, its batches and the thread that processes
    each."""

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
            return status, anthropic_error(status, "Not Found: " + path)
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
            return status, dressed(answer, self.faults.create_fields) if status == 200 else answer
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
                return 200, dressed(batch, self.faults.poll_fields)
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
        query = query_params(target)
        limit = int(query.get("limit", 20))
        with self.lock:
            ids = [i for i in reversed(self.created) if not self.batches[i]["anthropic"]]
            if query.get("after") in ids:
                ids = ids[ids.index(query["after"]) + 1 :]
            page = [dressed(self.batches[i], self.faults.poll_fields) for i in ids[:limit]]
        return {
            "object": "list",
            "data": page,
            "has_more": len(ids) > limit,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
        }

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
