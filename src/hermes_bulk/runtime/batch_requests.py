"""What a batch sends: our ids of batches and requests, the binding of a line of the
provider's answer to the request it answers, and the requests file written from the store."""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path

from .. import sources
from ..errors import SourceUnusable
from ..files import private_dir
from ..jobs import prompt
from ..providers.batch_api import MAX_BATCH_BYTES
from ..store.protocol import BatchRecord, ItemError, JobRecord


def new_batch_id() -> str:
    """Our id of a batch: 16 hex digits (12 mark a batch whose requests are named `item-N`)."""
    return secrets.token_hex(8)


def custom_id(job_id: str, batch_id: str, index: int) -> str:
    """A request's custom_id: the job, the batch it is sent in and the item (short, and only
    [A-Za-z0-9_-] as OpenAI asks), so an answer is taken only for the request it answers."""
    return f"hb-{job_id}-{batch_id}-{index}"


_CUSTOM_ID = re.compile(r"^hb-([A-Za-z0-9]{1,64})-([A-Za-z0-9]{1,64})-(\d{1,9})$")
_LEGACY_CUSTOM_ID = re.compile(r"^item-(\d{1,9})$")
_LEGACY_BATCH_ID = re.compile(r"^[0-9a-f]{12}$")


def bound_index(line_id: object, job_id: str, batch_id: str) -> int | None:
    """The item a line's custom_id names when it is a request of this job sent in this batch;
    else None. `item-N` (unbound) is taken only from a batch whose id has 12 digits."""
    if not isinstance(line_id, str):
        return None
    match = _CUSTOM_ID.match(line_id)
    if match:
        return int(match[3]) if (match[1], match[2]) == (job_id, batch_id) else None
    match = _LEGACY_CUSTOM_ID.match(line_id)
    return int(match[1]) if match and _LEGACY_BATCH_ID.match(batch_id) else None


class RequestsFile:
    """The batch's requests file (a part of BatchDriver, batch_driver.py, whose state it uses)."""

    def _write_file(self, job: JobRecord, batch: BatchRecord) -> Path | None:
        """The batch's JSONL file, written from the store item by item (never whole in memory).
        Items whose source changed fail here, as a live call's would; items past the byte limit go
        back to pending (the next batch takes them). None when no line was written."""
        spec = job.spec
        client, api = self.client_for(job), self.api_for(job)
        schema = json.loads(spec.schema) if spec.schema else None
        folder = private_dir(self.jobs_dir / job.job_id / "batches")
        path = folder / f"{batch.batch_id}.jsonl"
        written = size = 0
        with path.open("w", encoding="utf-8") as out:
            path.chmod(0o600)
            for item in self.store.iter_batch_items(job.job_id, batch.batch_id):
                error = self._source_error(job, item)
                if error is not None:
                    self.store.fail_item(job.job_id, item.index, batch.owner, error)
                    continue
                messages = prompt.item_messages(spec, item.name, item.content, item.content_hash)
                body = client.request_body(
                    messages,
                    max_tokens=spec.max_output_tokens,
                    json_schema=schema,
                    options=spec.options,
                )
                request = api.request_line(custom_id(job.job_id, batch.batch_id, item.index), body)
                line = json.dumps(request, ensure_ascii=False) + "\n"
                encoded = len(line.encode("utf-8"))
                if size + encoded > MAX_BATCH_BYTES:
                    self.store.release_item(job.job_id, item.index, batch.owner)
                    continue
                out.write(line)
                size += encoded
                written += 1
        if not written:
            path.unlink(missing_ok=True)
            return None
        return path

    def _source_error(self, job: JobRecord, item) -> ItemError | None:
        spec = job.spec
        try:
            changed = sources.source_changed(
                spec.source_kind,
                spec.source,
                item.origin,
                item.offset,
                item.index,
                item.stat_sig,
                item.content_hash,
                max_item_bytes=self.max_item_bytes,
            )
        except SourceUnusable as exc:
            return ItemError(SourceUnusable.error_type, str(exc))
        return (
            ItemError("SourceChanged", "source content changed since the job was created")
            if changed
            else None
        )
