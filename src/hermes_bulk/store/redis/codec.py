"""Records as the Redis store keeps them: hash fields, list entries, script arguments and replies.

The layouts are in keys.py, an item's state fields in item_state.py; the Lua scripts read the
same fields.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import replace

from ..compression import pack, unpack
from ..protocol import (
    CREATING,
    Event,
    JobRecord,
    JobSpec,
    NewItem,
    spec_from_json,
)
from ..protocol import cost_rates as records_cost_rates

#: A 128-bit hash spelled in hex ("b2:" + 32 digits for contents, 32 digits for answer keys) is
#: stored as its 16 bytes: a content hash behind a NUL byte (no text hash starts with one), so
#: it reads back as it was given; an answer key is only ever looked up, never read back.
_CONTENT_HASH = re.compile(r"b2:[0-9a-f]{32}")
_ANSWER_KEY = re.compile(r"[0-9a-f]{32}")
_PACKED = b"\x00"

#: What a result or a content is stored as, and read back from (store/compression.py): every
#: write of either goes through `stored`, every read through `stored_text`.
stored, stored_text = pack, unpack


def text(value: bytes | str | None) -> str | None:
    return value.decode("utf-8") if isinstance(value, bytes) else value


def decode_hash(raw: dict | list) -> dict[str, str]:
    if isinstance(raw, list):  # a script's HGETALL reply is flat
        raw = dict(zip(raw[::2], raw[1::2], strict=True))
    return {text(k): text(v) for k, v in raw.items()}


def seconds(ms: str | None) -> float | None:
    return float(ms) / 1000 if ms else None


def opt(value: int | str | None) -> str:
    """'' stands for None in ARGV."""
    return "" if value is None else str(value)


def cost_rates(spec: JobSpec) -> str:
    """records.cost_rates as META keeps them for the scripts: each float's repr, which Lua's
    tonumber reads back to the same double ('' without a price)."""
    rates = records_cost_rates(spec)
    return "" if rates is None else " ".join(repr(float(rate)) for rate in rates)


def job_from_meta(meta: dict[str, str]) -> JobRecord | None:
    """The JobRecord, or None when the job is unknown or still being created."""
    if not meta or meta.get("state") == CREATING:
        return None
    spec = spec_from_json(meta["spec"])
    max_tokens = int(meta["max_tokens"]) if meta.get("max_tokens") else None
    # What run/resume may change lives in META beside the spec (update_job.lua, set_state.lua).
    changed = {
        "max_tokens": max_tokens,
        "max_cost": int(meta["max_cost"]) if meta.get("max_cost") else None,
        "concurrency": int(meta.get("concurrency") or spec.concurrency),
        "rpm": int(meta["rpm"]) if meta.get("rpm") else spec.rpm,
        "tpm": int(meta["tpm"]) if meta.get("tpm") else spec.tpm,
    }
    if any(getattr(spec, k) != v for k, v in changed.items()):
        spec = replace(spec, **changed)
    n = {
        k: int(meta[k])
        for k in (
            "total",
            "pending",
            "running",
            "completed",
            "failed",
            "tokens_in",
            "tokens_out",
            "tokens_charged",
            "tokens_reserved",
            "estimated_tokens",
            "skipped",
        )
    }
    return JobRecord(
        spec=spec,
        created_at=float(meta["created_at_ms"]) / 1000,
        state=meta["state"],
        pause_reason=meta.get("pause_reason"),
        last_claim_at=seconds(meta.get("last_claim_at_ms")),
        run_at=seconds(meta.get("run_at_ms")),
        interrupted=meta.get("interrupted"),
        interrupted_at=seconds(meta.get("interrupted_at_ms")),
        reused=int(meta.get("reused") or 0),
        tokens_saved=int(meta.get("tokens_saved") or 0),
        tokens_cached=int(meta.get("tokens_cached") or 0),
        tokens_written=int(meta.get("tokens_written") or 0),
        cost_nusd=int(meta.get("cost") or 0),
        list_nusd=int(meta.get("list_cost") or 0),
        saved_nusd=int(meta.get("saved_cost") or 0),
        sample=tuple(json.loads(meta["sample"])) if meta.get("sample") else None,
        cost_reserved=int(meta.get("cost_reserved") or 0),
        worst_tokens=int(meta.get("worst_tokens") or 0),
        tokens_unkept=int(meta.get("tokens_unkept") or 0),
        cost_unkept=int(meta.get("cost_unkept") or 0),
        **n,
    )


def content_field(content_hash: str) -> bytes:
    """How a content hash is stored: the field of the contents hash and in an items record."""
    if _CONTENT_HASH.fullmatch(content_hash):
        return _PACKED + bytes.fromhex(content_hash[3:])
    return content_hash.encode("utf-8")


def content_hash_of(field: bytes | str) -> str:
    """The content hash that content_field stored."""
    if isinstance(field, bytes) and len(field) == 17 and field[:1] == _PACKED:
        return "b2:" + field[1:].hex()
    return text(field)


def answer_field(key: str) -> bytes:
    """How an answer key is stored: in P:answers, the job's keys hash and its keys buckets."""
    return bytes.fromhex(key) if _ANSWER_KEY.fullmatch(key) else key.encode("utf-8")


def item_head(item: NewItem) -> bytes:
    """An item's items record: "<what its claims reserve>\t<content field>" (the scripts read
    both; NewItem.claim_tokens, its worst case)."""
    return f"{item.claim_tokens}\t".encode() + content_field(item.content_hash)


def item_source(item: NewItem) -> str:
    """An item's sources record (what processing it needs, dropped when it completes)."""
    return json.dumps([item.origin, item.offset, item.stat_sig], separators=(",", ":"))


def parse_head(raw: bytes) -> tuple[int, bytes]:
    """(estimate, content field) of an items record."""
    estimate, field = raw.split(b"\t", 1)
    return int(estimate), field


def parse_source(raw: bytes) -> tuple[str, int, str]:
    """(origin, offset, stat_sig) of a sources record."""
    origin, offset, stat_sig = json.loads(raw)
    return origin, offset, stat_sig


def event_body(e: Event) -> str:
    return json.dumps([e.kind, e.message, e.item_index, e.error_type, e.http_status])


def event_args(events: Iterable[Event]) -> list:
    args: list = []
    for e in events:
        args += [e.at * 1000 if e.at else 0, event_body(e)]
    return args


def parse_event(raw: bytes) -> Event:
    at_ms, body = text(raw).split("\t", 1)
    kind, message, index, error_type, http_status = json.loads(body)
    return Event(kind, message, index, error_type, http_status, at=float(at_ms) / 1000)
