"""The rows SQLite keeps for jobs and items, and the records made of them (the Redis store's
counterpart is store/redis/codec.py)."""

from __future__ import annotations

import json
from dataclasses import replace

from ..compression import unpack
from ..protocol import ItemRecord, JobRecord, spec_from_json

#: The job columns a JobRecord is made of (job_from_row), in this order.
JOB_COLUMNS = (
    "id, created_at, spec, state, pause_reason, max_tokens, total, pending, running, completed, "
    "failed, tokens_in, tokens_out, tokens_charged, tokens_reserved, estimated_tokens, skipped, "
    "last_claim_at, run_at, interrupted, interrupted_at, reused, tokens_saved, tokens_cached, "
    "cost, list_cost, saved_cost, sample, max_cost, cost_reserved, tokens_written, tokens_unkept, "
    "cost_unkept, worst_tokens"
)


def job_from_row(row: tuple) -> JobRecord:
    spec = spec_from_json(row[2])
    if spec.max_tokens != row[5] or spec.max_cost != row[28]:  # resume changes them
        spec = replace(spec, max_tokens=row[5], max_cost=row[28])
    return JobRecord(
        spec=spec,
        created_at=row[1],
        state=row[3],
        pause_reason=row[4],
        total=row[6],
        pending=row[7],
        running=row[8],
        completed=row[9],
        failed=row[10],
        tokens_in=row[11],
        tokens_out=row[12],
        tokens_charged=row[13],
        tokens_reserved=row[14],
        estimated_tokens=row[15],
        skipped=row[16],
        last_claim_at=row[17],
        run_at=row[18],
        interrupted=row[19],
        interrupted_at=row[20],
        reused=row[21],
        tokens_saved=row[22],
        tokens_cached=row[23],
        cost_nusd=row[24],
        list_nusd=row[25],
        saved_nusd=row[26],
        sample=tuple(json.loads(row[27])) if row[27] else None,
        cost_reserved=row[29],
        tokens_written=row[30],
        tokens_unkept=row[31],
        cost_unkept=row[32],
        worst_tokens=row[33],
    )


#: The item columns an ItemRecord is made of (item_record), in the alias i.
ITEM_COLUMNS = (
    "i.idx, i.name, i.status, r.text, i.error_type, i.http_status, i.error_message, i.tokens_in, "
    "i.tokens_out, i.attempts, i.provider, i.model, i.reused_job, i.reused_idx, i.cost"
)


def item_record(r) -> ItemRecord:
    """An ItemRecord from the 15 ITEM_COLUMNS (and the content, if a 16th)."""
    return ItemRecord(
        *r[:3],
        unpack(r[3]),
        *r[4:12],
        content=unpack(r[15]) if len(r) > 15 else None,
        reused_from=None if r[12] is None else (r[12], r[13]),
        cost_nusd=r[14],
    )
