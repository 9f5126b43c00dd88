"""The loopback Batch API's hostile modes: the knobs (BatchFaults), the ways a line is written
wrong (LINE_FAULTS), and the answers that send a client elsewhere or never end.

Hostile modes (`FakeBatches.configure(**BatchFaults fields)`), the ways a buggy or hostile Batch API
(or a proxy before it) answers: `line_faults` {substring of an item: kind} writes that item's output
line wrong (LINE_FAULTS); `create_fields` / `poll_fields` are merged into the answer to a create /
every other answer about a batch: poll, cancel, list (ABSENT drops a field); `files_missing` answers
404 for every file's content; `ignore_cancel` answers a cancel but goes on; `foreign_lines` writes
the first batch's output lines (another job's answers) at the start of every later batch's output
file. Message Batches get the same modes in Anthropic's shapes (create_fields and poll_fields
dress the message_batch objects).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def query_params(target: str) -> dict[str, str]:
    """A request target's query parameters (the fake's clients send plain ones)."""
    if "?" not in target:
        return {}
    return dict(p.split("=", 1) for p in target.split("?", 1)[1].split("&") if "=" in p)


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


def dressed(batch: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(batch)
    for key, value in changes.items():
        if value == ABSENT:
            out.pop(key, None)
        else:
            out[key] = value
    return out
