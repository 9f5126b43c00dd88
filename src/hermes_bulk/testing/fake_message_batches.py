"""Message Batches (Anthropic's `/v1/messages/batches`) on the loopback provider: the same
batches as the Batch API's underneath (fake_batches.py), created with the requests inline and
answered in Anthropic's shapes (message_batch objects, results by kind: succeeded, errored,
canceled, expired)."""

from __future__ import annotations

import datetime
import json
import re
import secrets
import time
from typing import Any

from .fake_anthropic import anthropic_error, as_chat_request
from .fake_batch_faults import dressed, query_params

#: A Message Batches request's custom_id, as Anthropic checks it.
_MESSAGE_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat().replace("+00:00", "Z")


class MessageBatches:
    """The Message Batches of FakeBatches (mixed into it: its batches, files, lock and faults are
    the ones used here)."""

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
                return 404, anthropic_error(404, "no such message batch")
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
                    return 404, anthropic_error(404, "the batch has no results yet")
                return 200, path_
        return 404, anthropic_error(404, "not found")

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
            return 400, anthropic_error(400, "requests: each needs a unique custom_id and params")
        file_id = "file-" + secrets.token_hex(8)
        path = self.dir / file_id
        with path.open("w") as out:
            for r in requests:
                chat = as_chat_request(r["params"])
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
        query = query_params(target)
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
        return dressed(
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
                "error": body or anthropic_error(500, "fake: dropped"),
            }
        out.write(json.dumps({**entry, "result": result}) + "\n")
        return status

    def _end_message_line(self, batch: dict[str, Any], line: dict[str, Any], out, kind: str):
        """A request the batch ended before answering: its result says canceled or expired."""
        out.write(json.dumps({"custom_id": line["custom_id"], "result": {"type": kind}}) + "\n")
        with self.lock:
            batch["results"][kind] += 1
