"""A job's life after it is created: run, pause, resume, retry and delete, each a transition the
store makes atomically (store.set_state names the states it may leave), with the changes a
command brings (--concurrency, --rpm, --tpm, a larger limit) recorded on the job first."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import InputError, InvalidTransition, UsageError
from ..files import remove_tree
from ..store.protocol import (
    AWAITING_RECOVERY,
    NOT_STARTED,
    PAUSE_COST_LIMIT,
    PAUSE_TOKEN_LIMIT,
    PAUSE_USER,
    PAUSED,
    RUNNING,
    Event,
    JobRecord,
    claim_cost,
)
from ..words import count
from . import hints, prices
from .creating import check_priced
from .status import derive_state, state_label

if TYPE_CHECKING:
    from .service import Jobs


def run(
    jobs: Jobs,
    job_ref: str | None,
    *,
    concurrency: int | None = None,
    rpm: int | None = None,
    tpm: int | None = None,
    sample: int | None = None,
) -> JobRecord:
    """Continue a job: return items of dead workers to the queue, mark it running, send
    triggers. concurrency, rpm, tpm: new values recorded on the job first (a running job takes
    them at its next claims, and a raised concurrency gets its extra triggers at once).
    sample: run only that many pending items, spread over the job, then pause it
    (store.set_sample); without it, a sample not yet done goes on (_choose_sample)."""
    job = jobs.get(job_ref)
    if job.finished:
        raise InvalidTransition(
            f"Job {job.job_id} has no pending items"
            + (
                f"; {job.failed} failed: run {hints.process(job, 'retry', jobs.cmd)}"
                if job.failed
                else "."
            )
        )
    if sample is not None:
        _check_sample(jobs, job)
    _change(jobs, job, concurrency=concurrency, rpm=rpm, tpm=tpm)
    jobs.liveness.recover_dead()
    jobs.store.release_expired_leases()
    chosen = _choose_sample(jobs, job, sample)
    updated = jobs.store.set_state(
        job.job_id,
        RUNNING,
        from_states=[NOT_STARTED, RUNNING, AWAITING_RECOVERY, PAUSED],
        event=Event(
            "run",
            f"sampling {count(len(chosen), 'item')} spread over the job, then pausing"
            if sample is not None
            else f"continuing its sample of {count(len(chosen), 'item')}, then pausing"
            if chosen
            else "processing pending items",
        ),
    )
    return _start(jobs, updated or job)


def _check_sample(jobs: Jobs, job: JobRecord) -> None:
    """run --sample: for a live job that is not running now."""
    if job.spec.mode == "batch":
        raise UsageError(
            "--sample is for live jobs: a batch job's items go to the provider in batches. "
            "Create a job without --batch over the same source to try the instruction first; "
            "its answers are reused."
        )
    if job.state == RUNNING:
        raise InvalidTransition(
            f"Job {job.job_id} is running; pause it first "
            f"({jobs.cmd} pause {job.job_id}), then run a sample."
        )


def _choose_sample(jobs: Jobs, job: JobRecord, sample: int | None) -> list[int]:
    """Record run --sample's items on the job (store.set_sample). Without --sample, a sample
    not yet done is kept: it survives every pause, resume and recovery until its items have
    settled (the store then clears it), so a run that continues it still stops after it."""
    if sample is None:
        return list(job.sample or ())
    chosen = jobs.store.sample_pending(job.job_id, sample)
    if not chosen:
        raise InvalidTransition(
            f"Job {job.job_id} has no pending item to sample"
            + (" (the rest wait on items running now)." if job.pending else ".")
        )
    jobs.store.set_sample(job.job_id, chosen)
    return chosen


def _change(
    jobs: Jobs, job: JobRecord, *, concurrency: int | None, rpm: int | None, tpm: int | None
) -> None:
    """Record --concurrency, --rpm, --tpm on the job (every worker on every machine applies
    them)."""
    if concurrency is not None and concurrency > jobs.settings.max_concurrency:
        raise UsageError(
            f"--concurrency {concurrency} is more than max_concurrency "
            f"({jobs.settings.max_concurrency}); lower it, or raise "
            f"{jobs.setting_name('max_concurrency')}."
        )
    changes = {
        k: v
        for k, v in (("concurrency", concurrency), ("rpm", rpm), ("tpm", tpm))
        if v is not None and v != getattr(job.spec, k)
    }
    if not changes:
        return
    jobs.store.update_job(job.job_id, **changes)
    jobs.store.add_events(
        job.job_id,
        [
            Event(
                "changed",
                ", ".join(
                    f"{k} {v} (was {getattr(job.spec, k) or 'unset'})" for k, v in changes.items()
                ),
            )
        ],
    )


def _start(jobs: Jobs, job: JobRecord) -> JobRecord:
    fresh = jobs.store.get_job(job.job_id) or job
    slots = min(fresh.spec.concurrency, jobs.settings.max_concurrency) - fresh.running
    if slots > 0 and fresh.pending > 0:
        jobs.backend.trigger(job.job_id, 0, min(slots, fresh.pending))
    return fresh


def pause(jobs: Jobs, job_ref: str | None) -> JobRecord:
    job = jobs.get(job_ref)
    if job.finished:  # nothing left to hold back: saying "paused" would be untrue
        raise InvalidTransition(
            f"Job {job.job_id} is already {state_label(derive_state(job, 0))}; nothing changed."
        )
    updated = jobs.store.set_state(
        job.job_id,
        PAUSED,
        from_states=[NOT_STARTED, RUNNING, AWAITING_RECOVERY],
        pause_reason=PAUSE_USER,
        event=Event("paused", "paused by the user"),
    )
    if updated is None:
        raise InvalidTransition(f"Job {job.job_id} is already paused.")
    return updated


def resume(
    jobs: Jobs,
    job_ref: str | None,
    *,
    max_tokens: int | None = None,
    max_cost: int | None = None,
    concurrency: int | None = None,
    rpm: int | None = None,
    tpm: int | None = None,
) -> JobRecord:
    """max_cost: --max-cost in nano-USD."""
    job = jobs.get(job_ref)
    check_priced(job.spec, max_cost)
    _check_token_limit(jobs, job, max_tokens)
    _check_cost_limit(jobs, job, max_cost)
    if job.state != PAUSED:
        raise InvalidTransition(
            f"Job {job.job_id} is not paused; to continue it, run: "
            f"{hints.process(job, 'run', jobs.cmd)}"
        )
    _change(jobs, job, concurrency=concurrency, rpm=rpm, tpm=tpm)
    notes = [f"--max-tokens {max_tokens}"] if max_tokens is not None else []
    if max_cost is not None:
        notes.append(f"--max-cost {prices.format_usd(prices.usd(max_cost))}")
    updated = jobs.store.set_state(
        job.job_id,
        RUNNING,
        from_states=[PAUSED],
        max_tokens=max_tokens,
        max_cost=max_cost,
        event=Event("resumed", "resumed" + (" with " + " ".join(notes) if notes else "")),
    )
    if updated is None:
        raise InvalidTransition(
            f"Job {job.job_id} is not paused; to continue it, run: "
            f"{hints.process(job, 'run', jobs.cmd)}"
        )
    return _start(jobs, updated)


def _next_reservation(jobs: Jobs, job: JobRecord) -> tuple[int, int] | None:
    """What the paused job's next claim would reserve: (tokens, nano-USD at the price its
    claims pay), or None when nothing is pending. A read: a claim's own check covers what
    changes after it."""
    tokens = jobs.store.next_item_estimate(job.job_id) if job.state == PAUSED else None
    if tokens is None:
        return None
    return tokens, claim_cost(job.spec, tokens)


def _check_token_limit(jobs: Jobs, job: JobRecord, max_tokens: int | None) -> None:
    """resume: a new --max-tokens must be above what is used, and leave room for the next
    item beside what is charged (else the job would pause again at once); without one, a
    job paused at its limit needs one."""
    if max_tokens is not None and max_tokens < job.tokens_charged + job.tokens_reserved:
        raise InputError(
            f"--max-tokens {max_tokens} is below what the job has already used "
            f"({job.tokens_charged + job.tokens_reserved}); give a larger limit."
        )
    limit = job.spec.max_tokens if max_tokens is None else max_tokens
    nxt = _next_reservation(jobs, job) if limit is not None else None
    if nxt is None or job.tokens_charged + nxt[0] <= limit:
        return  # one it fits under is fine even if the job paused there before
    if max_tokens is not None:
        raise InputError(
            f"--max-tokens {max_tokens} leaves no room for the next item: "
            f"{job.tokens_charged} charged + about {nxt[0]} for it would exceed it; give at "
            f"least {job.tokens_charged + nxt[0]}."
        )
    if job.pause_reason == PAUSE_TOKEN_LIMIT:
        raise InputError(
            f"Job {job.job_id} paused at its token limit ({job.spec.max_tokens}); resume it "
            f"with a larger one: {hints.process(job, 'resume', jobs.cmd, '--max-tokens N')}"
        )


def _check_cost_limit(jobs: Jobs, job: JobRecord, max_cost: int | None) -> None:
    """resume: _check_token_limit in money (--max-cost, nano-USD)."""
    usd = prices.format_usd
    spent = job.cost_nusd + job.cost_reserved
    if max_cost is not None and max_cost < spent:
        raise InputError(
            f"--max-cost {usd(prices.usd(max_cost))} is below what the job has already spent "
            f"({usd(prices.usd(spent))}); give a larger limit."
        )
    limit = job.spec.max_cost if max_cost is None else max_cost
    nxt = _next_reservation(jobs, job) if limit is not None else None
    if nxt is None or job.cost_nusd + nxt[1] <= limit:
        return
    least = usd(prices.usd(job.cost_nusd + nxt[1]))
    if max_cost is not None:
        raise InputError(
            f"--max-cost {usd(prices.usd(max_cost))} leaves no room for the next item: "
            f"{usd(prices.usd(job.cost_nusd))} spent + about {usd(prices.usd(nxt[1]))} for "
            f"it would exceed it; give at least {least}."
        )
    if job.pause_reason == PAUSE_COST_LIMIT:
        raise InputError(
            f"Job {job.job_id} paused at its cost limit "
            f"({usd(prices.usd(job.spec.max_cost or 0))}); resume it with a larger one: "
            f"{hints.process(job, 'resume', jobs.cmd, '--max-cost USD')}"
        )


def retry(jobs: Jobs, job_ref: str | None) -> tuple[JobRecord, int]:
    """Failed items back to the queue; processing starts at once unless the job is paused."""
    job = jobs.get(job_ref)
    n = jobs.store.retry_failed(job.job_id)
    if n == 0:
        raise InvalidTransition(f"Job {job.job_id} has no failed items.")
    jobs.store.add_events(
        job.job_id, [Event("retry", f"{count(n, 'failed item')} returned to the queue")]
    )
    if job.state == PAUSED:
        return jobs.get(job.job_id), n
    updated = jobs.store.set_state(
        job.job_id, RUNNING, from_states=[NOT_STARTED, RUNNING, AWAITING_RECOVERY]
    )
    return _start(jobs, updated or job), n


def delete(jobs: Jobs, job_ref: str, *, abandon_batches: bool = False) -> str:
    """Remove the job. A batch job's batches still open at the provider are cancelled there
    first (they are paid for); when that fails nothing is deleted, unless abandon_batches."""
    job = jobs.get(job_ref)
    if job.running and job.state == RUNNING and jobs.liveness.live_worker_ids():
        raise InvalidTransition(f"Job {job.job_id} has items in progress; pause it first.")
    if job.spec.mode == "batch" and not abandon_batches:
        if jobs.cancel_batches is not None:
            jobs.cancel_batches(jobs, job)
        elif any(b.open for b in jobs.store.list_batches(job.job_id)):
            raise InvalidTransition(
                f"Job {job.job_id} was not deleted: its batches may still run at the provider, "
                f"and {jobs.cmd} cannot cancel them here; delete it with hermes-bulk delete, "
                "or cancel them at the provider and delete it with --abandon-batches."
            )
    jobs.store.delete_job(job.job_id)
    remove_tree(jobs.job_dir(job.job_id), jobs.settings.jobs_dir)
    return job.job_id
