"""A job's status and the records `status`, `list` and `show` read: the state shown (derived from
the run state, the counts and who is alive), the live facts beside it, and their `--json` shapes.
Rendering them for people is frontends/views.py's job."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ..fleet import endpoints
from ..fleet.liveness import Unserved, answering, heartbeat_interval, interruption
from ..store.protocol import (
    BATCH_DONE,
    FAILED,
    RUNNING,
    BatchRecord,
    Event,
    ItemDetail,
    JobRecord,
    PauseState,
    WorkerInfo,
)
from . import prices

if TYPE_CHECKING:
    from ..config.settings import Settings
    from .service import Jobs

# States `status` shows (the seed's table).
STATES = (
    "not_started",
    "processing",
    "paused",
    "waiting_for_worker",
    "awaiting_recovery",
    "completed",
    "completed_with_errors",
    "failed",
)


@dataclass(frozen=True)
class ItemShown:
    """One item for `show`: its record and content, the messages sent for it, and its events."""

    job: JobRecord
    detail: ItemDetail
    messages: list[
        dict[str, str]
    ]  # as prompt.build_messages frames the item; [] once its content is dropped
    attempts: list[Event]  # the item's recorded events: failed attempts, waits, its failure

    def as_dict(self) -> dict:
        """`show --json`."""
        item = self.detail.item
        error = (
            None
            if item.status != FAILED or not item.error_type
            else {
                "error_type": item.error_type,
                "http_status": item.http_status,
                "message": item.error_message,
            }
        )
        return {
            "job_id": self.job.job_id,
            "item": item.name,
            "number": item.index + 1,
            "status": item.status,
            "tokens_in": item.tokens_in,
            "tokens_out": item.tokens_out,
            "result": item.result,
            "error": error,
            "messages": self.messages,
            "events": [
                {
                    "kind": e.kind,
                    "at": e.at,
                    "error_type": e.error_type,
                    "http_status": e.http_status,
                    "message": e.message,
                }
                for e in self.attempts
            ],
        }


@dataclass(frozen=True)
class JobStatus:
    job: JobRecord
    state: str
    rate_limit: PauseState | None
    live_workers: int
    events: list[Event] = field(default_factory=list)
    budget_held_until: float | None = None  # the request budget holds the job until then
    max_concurrency: int | None = None  # the cap in force where the job's items run
    max_concurrency_setting: int | None = (
        None  # the setting now: in force once those workers restart
    )
    event_names: dict[int, str] = field(
        default_factory=dict
    )  # item index -> name, for the events shown
    #: awaiting recovery: why its workers stopped (worker_stop: gracefully; orphaned: a crash, a
    #: Hermes gateway or run --wait that exited); else None
    interrupted: str | None = None
    batches: list[BatchRecord] = field(default_factory=list)  # a batch job's provider batches
    #: a batch job: how often its batches are polled (its --poll, else this process's setting)
    poll_s: float | None = None
    #: a running job: the threads of the live workers that serve it (their sum; 0: none live)
    live_threads: int | None = None
    #: every live worker that answers, whether or not it serves this job
    live_workers_total: int = 0
    #: the live workers that answer and do not serve this job, each with why (liveness.Unserved)
    unserved: list[Unserved] = field(default_factory=list)
    #: the endpoint this process is configured for (its public URL and protocol), to word the
    #: command that starts a worker for the job's; None where there is none (inside Hermes)
    here: tuple[str, str] | None = None

    @property
    def concurrency(self) -> int:
        """Items of the job that run at once: its --concurrency, capped by max_concurrency in force
        and, while live workers serve it, by their threads."""
        cap = min(self.job.spec.concurrency, self.max_concurrency or self.job.spec.concurrency)
        return min(cap, self.live_threads) if self.live_threads else cap

    def as_dict(self) -> dict:
        """The `status --json` shape (a binding contract: keys are only ever added)."""
        j = self.job
        return {
            "job_id": j.job_id,
            "state": self.state,
            "total": j.total,
            "completed": j.completed,
            "failed": j.failed,
            "pending": j.pending,
            "running": j.running,
            "tokens_in": j.tokens_in,
            "tokens_out": j.tokens_out,
            "estimated_tokens": j.projected_tokens,
            "concurrency": j.spec.concurrency,
            "skipped": j.skipped,
            "pause_reason": j.pause_reason,
            "max_tokens": j.spec.max_tokens,
            "max_cost_usd": None if j.spec.max_cost is None else prices.usd(j.spec.max_cost),
            "cost_reserved_usd": prices.usd(j.cost_reserved),
            "tokens_charged": j.tokens_charged,
            "tokens_unkept": j.tokens_unkept,
            "tokens_reserved": j.tokens_reserved,
            "worst_case_tokens": j.worst_tokens or None,
            "rate_limited_until": self.rate_limit.until if self.rate_limit else None,
            "instruction": j.spec.instruction,
            "source": j.spec.source,
            "created_at": j.created_at,
            "live_workers": self.live_workers,
            "live_workers_total": self.live_workers_total,
            "workers_elsewhere": [_unserved_dict(u) for u in self.unserved],
            "budget_held_until": self.budget_held_until,
            "rpm": j.spec.rpm,
            "tpm": j.spec.tpm,
            "interrupted": self.interrupted,
            "reused": j.reused,
            "tokens_saved": j.tokens_saved,
            "mode": j.spec.mode,
            "batches": [_batch_dict(b, self.poll_s) for b in self.batches],
            "concurrency_in_force": self.concurrency,
            "endpoint": j.spec.endpoint,
            "protocol": j.spec.protocol if j.spec.client == "http" else None,
            "request_options": j.spec.options or {},
            "max_output_tokens": j.spec.max_output_tokens,
            "system": j.spec.system,
            "template": j.spec.template,
            "fields": list(j.spec.fields) if j.spec.fields else None,
            "tokens_cached": j.tokens_cached,
            "tokens_cache_written": j.tokens_written,
            "sample": [i + 1 for i in j.sample] if j.sample else None,
            **_cost_dict(prices.job_cost(j)),
        }


def _unserved_dict(u: Unserved) -> dict:
    """A live worker that does not serve the job in `status --json` (reason: liveness's
    ONLY_OTHER_JOB … NO_BATCHES; endpoint, protocol, batches: null where it does not say)."""
    return {
        "worker": u.worker.worker_id,
        "reason": u.reason,
        "endpoint": u.offer.endpoint,
        "protocol": u.offer.protocol,
        "batches": u.offer.batches,
        "only_job": u.offer.only_job,
    }


def _cost_dict(cost: prices.JobCost) -> dict:
    """A job's money in `status --json` (USD; null without a price, price_unknown says why)."""
    return {
        "cost_usd": cost.spent,
        "cost_unkept_usd": cost.unkept,
        "estimated_cost_usd": cost.estimated,
        "worst_case_cost_usd": cost.worst_case,
        "saved_usd": cost.saved,
        "saved_by_reuse_usd": cost.saved_by_reuse,
        "saved_by_batch_usd": cost.saved_by_batch,
        "cache_read_usd": cost.cache_read,
        "cache_saved_usd": cost.cache_saved,
        "cache_written_usd": cost.cache_written,
        "price": cost.price.as_dict() if cost.price else None,
        "price_unknown": cost.unknown,
    }


def next_poll(b: BatchRecord, poll_s: float | None) -> float | None:
    """When an open batch is asked about next: a poll after the last one (after its submission or
    creation, before its first); None once it has ended."""
    if not b.open or poll_s is None:
        return None
    return (b.polled_at or b.submitted_at or b.created_at) + poll_s


def shown_batches(job: JobRecord, batches: list[BatchRecord]) -> list[BatchRecord]:
    """A job's batches as `status` shows them. Once every item is answered no batch is open:
    a worker ingests a batch's answers before it closes the batch, so in between the job is
    finished beside a batch still recorded open, which will not be polled again."""
    if not job.finished:
        return batches
    return [
        replace(b, status=BATCH_DONE, final_status=b.final_status or b.status) if b.open else b
        for b in batches
    ]


def _batch_dict(b: BatchRecord, poll_s: float | None) -> dict:
    """One batch in `status --json` (id: the provider's batch id once it has one; status: the
    provider's at its end once ingested, "done" for one closed before it reached the provider;
    polled_at: when a worker last asked the provider; next_poll_at: when one asks next, null once
    it has ended)."""
    return {
        "id": b.provider_id or b.batch_id,
        "status": b.final_status or b.status,
        "items": b.items,
        "completed": b.completed,
        "failed": b.failed,
        "submitted_at": b.submitted_at,
        "run_rest_live": b.run_rest_live,
        "polled_at": b.polled_at,
        "next_poll_at": next_poll(b, poll_s),
    }


def derive_state(job: JobRecord, live_workers: int) -> str:
    """What `status` shows, from the persisted run state, the counts and worker liveness."""
    if job.finished:
        if job.failed == 0:
            return "completed"
        return "failed" if job.completed == 0 else "completed_with_errors"
    if job.state == RUNNING:
        # live_workers: those that can serve this job. Without one, a job whose items some
        # worker claimed since it was run was cut off; one never picked up waits for a worker.
        if live_workers:
            return "processing"
        return "awaiting_recovery" if interruption(job) else "waiting_for_worker"
    return job.state  # not_started, paused, awaiting_recovery


def state_label(state: str) -> str:
    return "waiting for a worker" if state == "waiting_for_worker" else state.replace("_", " ")


def job_status(jobs: Jobs, job: JobRecord, workers: list[WorkerInfo], events: int = 0) -> JobStatus:
    """The job's status, given the live workers (read once for a whole `list`) and how many of
    its newest events to show."""
    settings, store = jobs.settings, jobs.store
    now, beat = store.now(), heartbeat_interval(settings.lease_seconds)
    answer = [w for w in workers if answering(w, now, heartbeat_s=beat)]
    capable = jobs.liveness.capable_workers(job, answer)
    live = len(capable)
    rate_limit = (
        jobs.backend.limits.pause_state(job.spec.provider_key) if job.spec.provider_key else None
    )
    shown = store.list_events(job.job_id, events) if events else []
    # Names are looked up for the events shown only (by index), never the whole job's items.
    names = store.item_names(job.job_id, [e.item_index for e in shown if e.item_index is not None])
    state = derive_state(job, live)
    batch = job.spec.mode == "batch"
    return JobStatus(
        job=job,
        state=state,
        rate_limit=rate_limit,
        live_workers=live,
        events=shown,
        event_names=names,
        interrupted=interruption(job) if state == "awaiting_recovery" else None,
        budget_held_until=jobs.request_gate.held_until(job) if job.state == RUNNING else None,
        max_concurrency=jobs.max_concurrency_for(job),
        live_threads=sum(w.threads for w in capable) if job.state == RUNNING else None,
        live_workers_total=len(answer),
        unserved=jobs.liveness.unserving_workers(job, answer),
        here=here(settings),
        max_concurrency_setting=settings.max_concurrency,
        batches=shown_batches(job, store.list_batches(job.job_id)) if batch else [],
        poll_s=job.spec.batch_poll_s or settings.batch_poll_seconds if batch else None,
    )


def here(settings: Settings) -> tuple[str, str]:
    """This process's endpoint: (public URL, protocol)."""
    endpoint = settings.endpoint
    return (endpoints.endpoint_url(endpoint.base_url), endpoint.protocol)
