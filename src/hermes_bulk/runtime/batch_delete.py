"""What `delete` does to a batch job's batches at the provider: each open one cancelled, or
the delete refused, naming them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config.provider import ANTHROPIC
from ..errors import InvalidTransition, ModelError, PermanentModelError
from ..providers.batch_api import TERMINAL, BatchApi
from ..providers.message_batches import MessageBatchApi
from ..providers.pacing import LongWait
from ..store.protocol import JobRecord
from ..words import count
from .batch_submit import recorded_ids

if TYPE_CHECKING:
    from ..jobs.service import Jobs

#: How long `delete` sits out a shared 429 pause before it cancels a batch job's batches at the
#: provider; a longer pause refuses the delete, saying how long.
DELETE_WAIT_S = 10.0


def cancel_open_batches(jobs: Jobs, job: JobRecord) -> None:
    """Cancel at the provider every open batch of the job that may still run there: one with
    the provider's id and no final status, and one left preparing with its file uploaded (a
    worker may have created it before it was killed: looked for by its metadata). Raises,
    naming the batches, when the provider cannot be asked (docs/decisions.md). The Jobs of every
    front end that can reach a provider (`hermes-bulk`, `/bulk`, the dashboard) delete with this."""
    open_ = [
        b
        for b in jobs.store.list_batches(job.job_id)
        if b.open
        and (b.provider_id and b.status not in TERMINAL or not b.provider_id and b.input_file)
    ]
    if not open_:
        return
    ids = ", ".join(b.provider_id or b.batch_id for b in open_)
    own = jobs.settings.endpoint
    speaker = MessageBatchApi if own.protocol == ANTHROPIC else BatchApi
    api = speaker(
        base_url=own.base_url,
        provider_key=job.spec.provider_key,
        limits=jobs.backend.limits,
        api_key=own.api_key,
        timeout_s=min(jobs.settings.request_timeout_seconds, 30.0),
        max_wait_s=DELETE_WAIT_S,
    )
    try:
        for batch in open_:
            remote_id = batch.provider_id
            if remote_id is None:
                found = api.find(batch, recorded=recorded_ids(jobs.store, job.job_id))
                if found is None or found.status in TERMINAL:
                    continue  # never created, or ended: nothing runs
                remote_id = found.id
            try:
                api.cancel(remote_id)
            except PermanentModelError as exc:
                # Refused: unknown there (404), or it ended before the cancel arrived.
                if exc.http_status != 404 and api.get(remote_id).status not in TERMINAL:
                    raise
    except LongWait as wait:
        raise InvalidTransition(
            f"Job {job.job_id} was not deleted: the provider asked every worker on this key to "
            f"wait {wait.seconds:.0f} s more (HTTP 429) before its {count(len(open_), 'batch')} "
            f"({ids}) can be cancelled; delete it again then, or cancel them at the provider and "
            "delete it with --abandon-batches."
        ) from None
    except ModelError as exc:
        raise InvalidTransition(
            f"Job {job.job_id} was not deleted: its {count(len(open_), 'batch')} at the provider "
            f"({ids}) could not be cancelled ({exc}); check {jobs.setting_name('base_url')} and "
            "delete it again, or cancel them at the provider and delete it with --abandon-batches."
        ) from None
    finally:
        api.close()
