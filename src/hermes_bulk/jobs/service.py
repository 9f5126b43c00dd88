"""The one service API: create, run, status, pause, resume, retry, export, list, delete.

The CLI and the `/bulk` command both call this module and nothing below it, so they behave the
same. Functions take and return plain records; rendering is `frontends/views.py`'s job.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ..config.backend_url import SqliteUrl, parse_backend_url
from ..config.fields import env_name
from ..config.provider import OPENAI
from ..credentials import fixed_salt_record
from ..errors import ConfigError, InputError, InvalidTransition, JobNotFound, NoDatabase, UsageError
from ..files import private_dir, remove_tree
from ..fleet import endpoints
from ..fleet.broker import Backend, open_backend
from ..fleet.liveness import Liveness, Unserved, answering, heartbeat_interval, interruption
from ..providers.pacing import OpenGate, RequestGate, provider_key
from ..store.protocol import (
    AWAITING_RECOVERY,
    BATCH_DONE,
    FAILED,
    LEARN_AFTER,
    NOT_STARTED,
    PAUSE_COST_LIMIT,
    PAUSE_TOKEN_LIMIT,
    PAUSE_USER,
    PAUSED,
    RUNNING,
    BatchRecord,
    Event,
    ItemDetail,
    ItemRecord,
    JobRecord,
    JobSpec,
    JobStore,
    NewItem,
    PauseState,
    WorkerInfo,
    claim_cost,
    usd_text,
    worst_case_nusd,
)
from ..store.sqlite.database import is_open_sqlite_file
from ..words import count
from . import bounds, hints, model_options, prices, prompt, templates

if TYPE_CHECKING:
    from ..config.settings import Settings
    from ..sources import Skipped, Source, SourceItem

# sources (create) and export (export, delete) are imported where used: `list` and `status` start
# without them (docs/benchmarks.md, row 7).

# Items per transaction while creating, and the content bytes one may hold: memory stays flat,
# and commits stay few (a million-row CSV took 55 s in batches of 2,000, 31 s in 20,000: each
# batch rewrites the index pages it touches, and a bigger batch touches fewer per item).
ADD_BATCH = 20_000
#: Items a dry run classifies per look-up in the answer index.
PLAN_LOOKUP_ITEMS = 1000
#: How many of the newest jobs create looks through for an output allowance learned before.
LEARN_FROM_JOBS = 100
ADD_BATCH_BYTES = 16 * 1024 * 1024
SKIPPED_SHOWN = 20
#: Cancels a batch job's open batches at the provider before it is deleted; raises
#: InvalidTransition, naming them, when the provider cannot be asked.
BatchCanceller = Callable[["Jobs", JobRecord], None]

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


def _begins_with_bom(path: Path) -> bool:
    """Whether a file begins with a UTF-8 byte-order mark (opened as every source is: a FIFO in
    its place does not hang; what cannot be read has none, and the read of items says why)."""
    import codecs

    from ..errors import HermesBulkError
    from ..sources.regular_files import open_file

    try:
        with open_file(path) as f:
            return f.read(3) == codecs.BOM_UTF8
    except (OSError, HermesBulkError):
        return False


def _first_request(spec: JobSpec, name: str, text: str, digest: str) -> dict[str, Any]:
    """The request create --dry-run shows for the first item: built as a worker sends it, in the
    job's protocol (Hermes' own client is shown as a chat request to its model)."""
    from ..providers.bodies import request_body  # the HTTP client's modules: a dry run's only

    http = spec.client == "http"
    return request_body(
        spec.protocol if http else OPENAI,
        spec.model if http else "(Hermes' model)",
        prompt.build_messages(spec.instruction, name, text, digest, spec.system),
        max_tokens=spec.max_output_tokens,
        json_schema=json.loads(spec.schema) if spec.schema else None,
        options=spec.options,
    )


def _check_fits_alone(spec: JobSpec, name: str, worst: int) -> None:
    """create: an item whose worst case is over --max-tokens or --max-cost could never be
    claimed (the job would pause at it with nothing spent); refuse the limit with the figure."""
    out = f"{spec.output_bound:,} output tokens"
    if spec.max_tokens is not None and worst > spec.max_tokens:
        raise InputError(
            f"--max-tokens {spec.max_tokens:,} is below what item {name} may use: up to "
            f"{worst:,} tokens ({out} at most); raise it, or lower --max-output-tokens."
        )
    cost = claim_cost(spec, worst)
    if spec.max_cost is not None and cost > spec.max_cost:
        raise InputError(
            f"--max-cost {usd_text(spec.max_cost)} is below what item {name} may cost: up to "
            f"{usd_text(cost)} ({worst:,} tokens, {out} at most); raise it, or lower "
            "--max-output-tokens."
        )


def _check_priced(spec: JobSpec, max_cost: int | None) -> None:
    """--max-cost is reckoned at the job's price: a job without one cannot take it."""
    if max_cost is not None and spec.price is None:
        why = spec.price_unknown or "it was created before jobs had prices"
        raise ConfigError(f"--max-cost needs the job's price, and there is none: {why}.")


@dataclass(frozen=True, slots=True)
class Plan:
    """create --dry-run: what the job would hold and the first request it would send."""

    items: int
    skipped: int
    estimated_tokens: int
    worst_tokens: int  #: what the items to run reserve at most, each once (their worst cases)
    worst_nusd: int  #: what that may cost at the job's price (records.worst_case_nusd)
    output_bound: int  #: the max_tokens each request carries
    output_allowance: int
    max_tokens: int | None
    first_item: str | None
    request: dict[str, Any]
    reused: int = 0  #: items an earlier job answered (the job reuses): not asked
    repeats: int = 0  #: items asking what an earlier item of the job asks: not asked again
    allowance_from: str | None = None  #: the earlier job output_allowance was learned from
    price: prices.Price | None = None  #: what the job would pay per million tokens
    price_unknown: str | None = None  #: why it has no price
    max_cost: int | None = None  #: --max-cost, nano-USD

    @property
    def estimated_cost_usd(self) -> float | None:
        """The estimate in USD at the job's price (None without one)."""
        if self.price is None:
            return None
        return prices.usd(
            prices.estimate_nusd(
                self.price, self.estimated_tokens, self.to_run, self.output_allowance
            )
        )

    @property
    def to_run(self) -> int:
        return self.items - self.reused - self.repeats

    @property
    def worst_case_cost_usd(self) -> float | None:
        """The most the items to run may cost, each asked once (None without a price)."""
        return None if self.price is None else prices.usd(self.worst_nusd)


@dataclass(frozen=True)
class Created:
    job: JobRecord
    skipped: list[Skipped]  # the first few; job.skipped has the count


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


class Jobs:
    """Job operations over one backend.

    `cmd` and `setting_name` are how messages name commands and settings to the user:
    `hermes-bulk` and HERMES_BULK_* on the command line, `/bulk` and config.yaml keys in Hermes.
    """

    def __init__(
        self,
        settings: Settings,
        backend: Backend | None = None,
        request_gate: RequestGate | None = None,
        *,
        cmd: str = "hermes-bulk",
        setting_name: Callable[[str], str] = env_name,
        cancel_batches: BatchCanceller | None = None,
    ) -> None:
        self.settings = settings
        #: How `delete` cancels a batch job's open batches at the provider. The jobs API speaks to
        #: no provider: a front end that can reach one hands in runtime.batch_driver's.
        self.cancel_batches = cancel_batches
        self.cmd, self.setting_name = cmd, setting_name
        # A SQLite file that is not there yet is made by the first command that writes (create);
        # until then reads answer from nothing, so a mistyped path or a fresh machine keeps no file.
        if backend is None and missing_database(settings) is None:
            backend = open_backend(settings)
        self._backend = backend
        self.request_gate = request_gate or OpenGate()
        #: max_concurrency in force where a job's items run: the settings here, unless the host
        #: knows better (a worker running in Hermes keeps the settings it started with).
        self.max_concurrency_for: Callable[[JobRecord], int] = lambda job: settings.max_concurrency

    @property
    def backend(self) -> Backend:
        """The backend, opened (and a missing SQLite file made) on first use: only a command that
        writes gets here without a database; reads check `_no_database` first."""
        if self._backend is None:
            self._backend = open_backend(self.settings)
        return self._backend

    @property
    def store(self) -> JobStore:
        return self.backend.store

    @functools.cached_property
    def liveness(self) -> Liveness:
        return Liveness(self.store, self.settings.home / "workers")

    def _no_database(self) -> bool:
        """True when there is no database to read (nothing is made); NoDatabase when the user
        named one that is not there: a typo in the setting, which an empty answer would hide."""
        if self._backend is not None or (path := missing_database(self.settings)) is None:
            return False
        if self.settings.backend:
            raise NoDatabase(
                f"There is no hermes-bulk database at {path}; check "
                f"{self.setting_name('backend')}, "
                f"or create a job there first: {hints.create(self.cmd)}"
            )
        return True

    # Creating ------------------------------------------------------------------------------
    def create(
        self,
        instruction: str,
        over: str,
        *,
        concurrency: int | None = None,
        retries: int | None = None,
        max_tokens: int | None = None,
        max_cost: int | None = None,
        rpm: int | None = None,
        tpm: int | None = None,
        model: str | None = None,
        client: str = "http",
        provider: str | None = None,
        schema: str | None = None,
        fresh: bool = False,
        on_progress: Callable[[int], None] | None = None,
        dry_run: bool = False,
        batch: bool = False,
        batch_deadline_s: float | None = None,
        bind_endpoint: bool = True,
        protocol: str | None = None,
        temperature: float | None = None,
        max_output_tokens: int | None = None,
        system: str | None = None,
        options: list[str] | None = None,
        batch_poll_s: float | None = None,
        template: str | None = None,
        fields: str | None = None,
    ) -> Created | Plan:
        """Discover the items and record them; makes no model calls. Bad input creates nothing. With
        dry_run, only discover them: the Plan (first request, count, estimate), nothing written.
        batch: the job runs through the provider's Batch API (runtime/batch_driver.py), with the
        rest left live after batch_deadline_s. bind_endpoint=False: any worker's endpoint serves the
        job (a `/bulk … --batch` job, made where no endpoint of its own is configured), one that
        speaks `protocol` (by default this process's endpoint's).
        temperature, max_output_tokens (else the setting), system and options (`-o KEY=VALUE`
        texts): what every request carries besides the item (jobs/model_options.py). template
        or fields (`a,b`): what of each CSV row or JSON record is sent (jobs/templates.py); an
        item without a named field is an InputError naming it and the fields it has. max_cost:
        --max-cost in nano-USD (the job needs a price)."""
        s = self.settings
        if not instruction.strip():
            raise InputError("The instruction is empty; say what to do with each item.")
        own = s.endpoint
        _check_batch_flags(batch, batch_deadline_s, batch_poll_s, client, own.protocol)
        request_options = model_options.request_options(temperature, options, client=client)
        if system is not None and not system.strip():
            raise UsageError("--system: the text is empty; write the system prompt in the file.")
        max_output_tokens = max_output_tokens or s.max_output_tokens
        concurrency = concurrency or min(s.default_concurrency, s.max_concurrency)
        if concurrency > s.max_concurrency:
            raise UsageError(
                f"--concurrency {concurrency} is more than max_concurrency ({s.max_concurrency}); "
                f"lower it, or raise {self.setting_name('max_concurrency')}."
            )
        endpoint = key_fp = None
        if client == "http":
            model = model or s.model
            if not model:
                raise ConfigError(
                    "No model configured: set HERMES_BULK_MODEL (and HERMES_BULK_PROVIDER, "
                    "HERMES_BULK_BASE_URL, HERMES_BULK_API_KEY or the OPENAI_* / ANTHROPIC_* "
                    "equivalents), or pass --model."
                )
            salt = self._fingerprint_salt(dry_run)
            provider = provider or provider_key(own.base_url, own.api_key, salt)
            if bind_endpoint:
                endpoint, key_fp = (
                    endpoints.endpoint_url(own.base_url),
                    endpoints.key_fingerprint(own, salt),
                )
        from ..sources import Source

        source = Source(over, max_item_bytes=s.max_item_bytes)
        template, field_names = templates.checked(template, fields, source.kind)
        job_price = prices.resolve(
            model, own.base_url if client == "http" else None, batch=batch, setting=s.price
        )
        spec = JobSpec(
            job_id=os.urandom(6).hex(),
            instruction=instruction,
            source=str(source.path),
            source_kind=source.kind,
            source_bom=source.kind == "csv" and _begins_with_bom(source.path),
            concurrency=concurrency,
            retries=s.max_retries if retries is None else retries,
            max_tokens=max_tokens,
            rpm=rpm or s.rpm,
            tpm=tpm or s.tpm,
            model=model,
            client=client,
            provider_key=provider or "",
            output_tokens_estimate=min(s.output_tokens_estimate, max_output_tokens),
            max_output_tokens=max_output_tokens,
            schema=schema,
            reuse=s.reuse and not fresh,
            mode="batch" if batch else "live",
            batch_deadline_s=batch_deadline_s,
            endpoint=endpoint,
            key_fingerprint=key_fp,
            protocol=(protocol if protocol and not bind_endpoint else own.protocol)
            if client == "http"
            else OPENAI,
            system=system,
            options=request_options,
            batch_poll_s=batch_poll_s,
            template=template,
            fields=field_names,
            price=job_price.price.as_dict() if job_price.price else None,
            list_price=job_price.list_price.as_dict() if job_price.list_price else None,
            price_unknown=job_price.unknown,
            max_cost=max_cost,
        )
        _check_priced(spec, max_cost)
        learned = self._learned_allowance(spec)
        if learned is not None:  # the allowance an earlier job of this request learned
            spec = replace(spec, output_tokens_estimate=learned[0])
        if dry_run:
            return self._plan(spec, over, source, learned_from=learned and learned[1])
        self.store.begin_job(spec)
        try:
            skipped = self._add_items(spec, source, on_progress)
            job = self.store.finish_job(spec.job_id)
            if job.total == 0:
                reasons = ", ".join(sorted({s.reason for s in skipped})) or "nothing found"
                raise InputError(
                    f"--over {over}: no items to process ({count(job.skipped, 'entry')} left "
                    f"out: {reasons})."
                )
        except BaseException:
            self.store.delete_job(spec.job_id)
            raise
        private_dir(self.job_dir(job.job_id))
        return Created(job=job, skipped=skipped)

    def _learned_allowance(self, spec: JobSpec) -> tuple[int, str] | None:
        """The output allowance (JobRecord.output_allowance) of the newest of the last
        LEARN_FROM_JOBS jobs that asked the same model the same way (client, model, instruction,
        --system, --schema, --template or --fields) and has learned one, capped by this job's
        output limit, with that job's id; None when none has, or there is no store yet (nothing
        is made to find out)."""
        if missing_database(self.settings) is not None:
            return None

        def shape(s: JobSpec) -> tuple:
            fields = tuple(s.fields) if s.fields else None
            return (s.client, s.model, s.instruction, s.system, s.schema, s.template, fields)

        wanted = shape(spec)
        for job in self.store.list_jobs(LEARN_FROM_JOBS):
            if shape(job.spec) != wanted:
                continue
            if job.answered >= LEARN_AFTER and job.tokens_out > 0:
                allowance = job.output_allowance
                if spec.max_output_tokens is not None:
                    allowance = min(allowance, spec.max_output_tokens)
                return allowance, job.job_id
        return None

    def _fingerprint_salt(self, dry_run: bool) -> str:
        """The store's salt of credential fingerprints (made now if it has none), or for a dry
        run, which writes nothing and opens no store that does not exist, the one there is:
        without one yet, no job of the store can match, and any salt will do."""
        if not dry_run:
            return self.store.fingerprint_salt()
        found = None if missing_database(self.settings) else self.store.fingerprint_salt(False)
        return found or fixed_salt_record()

    def _plan(self, spec: JobSpec, over: str, source: Source, *, learned_from: str | None) -> Plan:
        """What create would record and send first, read from the source, and what of it would be
        asked: items answered before (when the job reuses) and repeats of an item of the job are
        not, and are left out of the estimate. The store is only read, and not opened when there
        is none yet."""
        from ..sources import Skipped

        allowance = spec.output_tokens_estimate
        items = skipped = estimate = worst = 0
        request: dict[str, Any] | None = None
        first = None
        lookup = spec.reuse and missing_database(self.settings) is None
        asked: set[bytes] = set()  # keys of items that would be asked (16 bytes each)
        answered: set[bytes] = set()  # keys the answer index holds
        reused = repeats = 0
        batch: list[tuple[bytes, int, int]] = []  # (answer key, estimate, worst case)

        def classify() -> None:
            nonlocal reused, repeats, estimate, worst
            new = {raw for raw, *_ in batch if raw not in asked and raw not in answered}
            if lookup and new:
                found = self.store.answered(sorted(raw.hex() for raw in new))
                answered.update(bytes.fromhex(key) for key in found)
            for raw, item_estimate, item_worst in batch:
                if raw in answered:
                    reused += 1
                elif raw in asked:
                    repeats += 1
                else:
                    asked.add(raw)
                    estimate += item_estimate
                    worst += item_worst
            batch.clear()

        for entry in source.entries():
            if isinstance(entry, Skipped):
                skipped += 1
                continue
            text, digest = self._item_text(spec, entry)
            if request is None:
                first = entry.name
                request = _first_request(spec, entry.name, text, digest)
            items += 1
            item_worst = bounds.worst_case_tokens(spec, entry.name, text, digest)
            if spec.max_tokens is not None or spec.max_cost is not None:
                _check_fits_alone(spec, entry.name, item_worst)
            batch.append(
                (
                    bytes.fromhex(item_answer_key(spec, digest)),
                    prompt.estimate_tokens(text, spec.instruction, allowance, spec.system),
                    item_worst,
                )
            )
            if len(batch) >= PLAN_LOOKUP_ITEMS:
                classify()
        classify()
        if items == 0:
            raise InputError(
                f"--over {over}: no items to process ({count(skipped, 'entry')} left out)."
            )
        return Plan(
            items=items,
            skipped=skipped,
            estimated_tokens=estimate,
            worst_tokens=worst,
            worst_nusd=worst_case_nusd(spec, worst, items - reused - repeats),
            output_bound=spec.output_bound,
            output_allowance=allowance,
            max_tokens=spec.max_tokens,
            max_cost=spec.max_cost,
            first_item=first,
            request=request or {},
            reused=reused,
            repeats=repeats,
            allowance_from=learned_from,
            price=prices.price_of(spec.price),
            price_unknown=spec.price_unknown,
        )

    def _item_text(
        self, spec: JobSpec, entry: SourceItem, digest: str | None = None
    ) -> tuple[str, str]:
        """prompt.item_text for an item found at create, after checking that it has every field
        the job's --template or --fields names (InputError naming the item, its line and the
        fields it has) and that what they make of it is at most max_item_bytes (InputError
        naming the item and the limit; rendering stops at the limit)."""
        from ..sources import content_hash, line_at

        digest = digest or content_hash(entry.content)
        shape = templates.shape(spec.template, tuple(spec.fields) if spec.fields else None)
        flag = "--template" if spec.template is not None else "--fields"
        if shape is not None and (missing := shape.missing(entry.content)) != ():
            raise templates.missing_field_error(
                flag, entry.name, line_at(Path(spec.source), entry.offset), missing, entry.content
            )
        limit = self.settings.max_item_bytes
        try:
            return prompt.item_text(spec, entry.content, digest, limit)
        except templates.TooLarge:
            line = line_at(Path(spec.source), entry.offset)
            setting = self.setting_name("max_item_bytes")
            raise templates.too_large_error(flag, entry.name, line, limit, setting) from None

    def _add_items(self, spec: JobSpec, source: Source, on_progress) -> list[Skipped]:
        from ..sources import Skipped, content_hash

        batch: list[NewItem] = []
        batch_bytes = 0
        skipped: list[Skipped] = []
        index = 0
        for entry in source.entries():
            if isinstance(entry, Skipped):
                if len(skipped) < SKIPPED_SHOWN:
                    skipped.append(entry)
                self.store.add_events(
                    spec.job_id, [Event("skipped", f"{entry.name}: {entry.reason}")]
                )
                continue
            digest = content_hash(entry.content)
            text, sent_digest = self._item_text(spec, entry, digest)
            worst = bounds.worst_case_tokens(spec, entry.name, text, sent_digest)
            if spec.max_tokens is not None or spec.max_cost is not None:
                _check_fits_alone(spec, entry.name, worst)
            batch.append(
                NewItem(
                    index=index,
                    name=entry.name,
                    content=entry.content,
                    content_hash=digest,
                    origin=entry.origin,
                    offset=entry.offset,
                    stat_sig=entry.stat_sig,
                    estimated_tokens=prompt.estimate_tokens(
                        text, spec.instruction, spec.output_tokens_estimate, spec.system
                    ),
                    answer_key=item_answer_key(spec, sent_digest),
                    worst_tokens=worst,
                )
            )
            index += 1
            batch_bytes += len(entry.content)
            if len(batch) >= ADD_BATCH or batch_bytes >= ADD_BATCH_BYTES:
                self.store.add_items(spec.job_id, batch)
                batch, batch_bytes = [], 0
                if on_progress:
                    on_progress(index)
        if batch:
            self.store.add_items(spec.job_id, batch)
        if on_progress:
            on_progress(index)
        return skipped

    # Reading -------------------------------------------------------------------------------
    def resolve(self, job_ref: str | None) -> str:
        """A job id from an id or a unique prefix of one; the newest job when job_ref is None.

        Only None (no argument at all: `status`) means the newest job. An empty or blank id is a
        mistake (a variable that was not set), never a prefix of every id: `delete ""` must not
        delete whatever job happens to be newest.
        """
        if job_ref is not None and not job_ref.strip():
            raise UsageError(
                f"The job id is empty; give a job id or a unique prefix of one. "
                f"List jobs with: {self.cmd} list"
            )
        no_database = self._no_database()
        if job_ref is None or no_database:
            jobs = [] if no_database else self.store.list_jobs(1)
            if not jobs:
                raise JobNotFound(
                    f"There are no jobs yet. Create one with: {hints.create(self.cmd)}"
                )
            return jobs[0].job_id
        if self.store.get_job(job_ref):
            return job_ref
        matches = self.store.find_job_ids(job_ref)
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise JobNotFound(f"No job {job_ref!r}. List jobs with: {self.cmd} list")
        raise JobNotFound(
            f"{job_ref!r} matches several jobs ({', '.join(matches[:5])}); give more of the id."
        )

    def get(self, job_ref: str | None) -> JobRecord:
        job_id = self.resolve(job_ref)  # first: with no database it raises before one is opened
        job = self.store.get_job(job_id)
        if job is None:
            raise JobNotFound(f"No job {job_ref!r}.")
        return job

    def status(self, job_ref: str | None, *, events: int = 0) -> JobStatus:
        job = self.get(job_ref)
        return self._status(job, self.liveness.live_workers(), events)

    def _status(self, job: JobRecord, workers: list[WorkerInfo], events: int = 0) -> JobStatus:
        now, beat = self.store.now(), heartbeat_interval(self.settings.lease_seconds)
        answer = [w for w in workers if answering(w, now, heartbeat_s=beat)]
        capable = self.liveness.capable_workers(job, answer)
        live = len(capable)
        rate_limit = (
            self.backend.limits.pause_state(job.spec.provider_key)
            if job.spec.provider_key
            else None
        )
        shown = self.store.list_events(job.job_id, events) if events else []
        # Names are looked up for the events shown only (by index), never the whole job's items.
        names = self.store.item_names(
            job.job_id, [e.item_index for e in shown if e.item_index is not None]
        )
        state = derive_state(job, live)
        return JobStatus(
            job=job,
            state=state,
            rate_limit=rate_limit,
            live_workers=live,
            events=shown,
            event_names=names,
            interrupted=interruption(job) if state == "awaiting_recovery" else None,
            budget_held_until=self.request_gate.held_until(job) if job.state == RUNNING else None,
            max_concurrency=self.max_concurrency_for(job),
            live_threads=sum(w.threads for w in capable) if job.state == RUNNING else None,
            live_workers_total=len(answer),
            unserved=self.liveness.unserving_workers(job, answer),
            here=self._here(),
            max_concurrency_setting=self.settings.max_concurrency,
            batches=shown_batches(job, self.store.list_batches(job.job_id))
            if job.spec.mode == "batch"
            else [],
            poll_s=job.spec.batch_poll_s or self.settings.batch_poll_seconds
            if job.spec.mode == "batch"
            else None,
        )

    def _here(self) -> tuple[str, str] | None:
        """This process's endpoint, (public URL, protocol), when one is configured."""
        endpoint = self.settings.endpoint
        return (endpoints.endpoint_url(endpoint.base_url), endpoint.protocol)

    def item(self, job_ref: str | None, item_ref: str) -> ItemShown:
        """One item by its exact name or its number (1-based, the order of the export)."""
        job = self.get(job_ref)
        index = self.store.find_item(job.job_id, item_ref)
        if index is None and item_ref.strip().isdigit() and 1 <= int(item_ref) <= job.total:
            index = int(item_ref) - 1
        detail = self.store.get_item(job.job_id, index) if index is not None else None
        if detail is None:
            raise InputError(
                f"Job {job.job_id} has no item {item_ref!r}; give an item's name as the export "
                "shows "
                f"it (a relative path, row:N, record:N or line:N) or its number, 1 to {job.total}."
            )
        # A completed file item's content is not kept (store/protocol.py drops_content): nothing to
        # frame.
        messages = (
            []
            if detail.content is None
            else prompt.item_messages(
                job.spec, detail.item.name, detail.content, detail.content_hash
            )
        )
        return ItemShown(
            job=job,
            detail=detail,
            messages=messages,
            attempts=self.store.list_events(job.job_id, item=detail.item.index),
        )

    def failed_items(self, job_id: str, limit: int) -> list[ItemRecord]:
        """The first `limit` failed items in index order (the store reads no other item)."""
        return self.store.failed_items(job_id, limit)

    def list(self, limit: int = 20) -> list[JobStatus]:
        if self._no_database():
            return []
        workers = self.liveness.live_workers()
        return [self._status(job, workers) for job in self.store.list_jobs(limit)]

    def job_dir(self, job_id: str) -> Path:
        return self.settings.jobs_dir / job_id

    # Changing state ------------------------------------------------------------------------
    def run(
        self,
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
        job = self.get(job_ref)
        if job.finished:
            raise InvalidTransition(
                f"Job {job.job_id} has no pending items"
                + (
                    f"; {job.failed} failed: run {hints.process(job, 'retry', self.cmd)}"
                    if job.failed
                    else "."
                )
            )
        if sample is not None:
            self._check_sample(job)
        self._change(job, concurrency=concurrency, rpm=rpm, tpm=tpm)
        self.liveness.recover_dead()
        self.store.release_expired_leases()
        chosen = self._choose_sample(job, sample)
        updated = self.store.set_state(
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
        return self._start(updated or job)

    def _check_sample(self, job: JobRecord) -> None:
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
                f"({self.cmd} pause {job.job_id}), then run a sample."
            )

    def _choose_sample(self, job: JobRecord, sample: int | None) -> list[int]:
        """Record run --sample's items on the job (store.set_sample). Without --sample, a sample
        not yet done is kept: it survives every pause, resume and recovery until its items have
        settled (the store then clears it), so a run that continues it still stops after it."""
        if sample is None:
            return list(job.sample or ())
        chosen = self.store.sample_pending(job.job_id, sample)
        if not chosen:
            raise InvalidTransition(
                f"Job {job.job_id} has no pending item to sample"
                + (" (the rest wait on items running now)." if job.pending else ".")
            )
        self.store.set_sample(job.job_id, chosen)
        return chosen

    def _change(
        self, job: JobRecord, *, concurrency: int | None, rpm: int | None, tpm: int | None
    ) -> None:
        """Record --concurrency, --rpm, --tpm on the job (every worker on every machine applies
        them)."""
        if concurrency is not None and concurrency > self.settings.max_concurrency:
            raise UsageError(
                f"--concurrency {concurrency} is more than max_concurrency "
                f"({self.settings.max_concurrency}); lower it, or raise "
                f"{self.setting_name('max_concurrency')}."
            )
        changes = {
            k: v
            for k, v in (("concurrency", concurrency), ("rpm", rpm), ("tpm", tpm))
            if v is not None and v != getattr(job.spec, k)
        }
        if not changes:
            return
        self.store.update_job(job.job_id, **changes)
        self.store.add_events(
            job.job_id,
            [
                Event(
                    "changed",
                    ", ".join(
                        f"{k} {v} (was {getattr(job.spec, k) or 'unset'})"
                        for k, v in changes.items()
                    ),
                )
            ],
        )

    def _start(self, job: JobRecord) -> JobRecord:
        fresh = self.store.get_job(job.job_id) or job
        slots = min(fresh.spec.concurrency, self.settings.max_concurrency) - fresh.running
        if slots > 0 and fresh.pending > 0:
            self.backend.trigger(job.job_id, 0, min(slots, fresh.pending))
        return fresh

    def pause(self, job_ref: str | None) -> JobRecord:
        job = self.get(job_ref)
        if job.finished:  # nothing left to hold back: saying "paused" would be untrue
            raise InvalidTransition(
                f"Job {job.job_id} is already {state_label(derive_state(job, 0))}; nothing changed."
            )
        updated = self.store.set_state(
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
        self,
        job_ref: str | None,
        *,
        max_tokens: int | None = None,
        max_cost: int | None = None,
        concurrency: int | None = None,
        rpm: int | None = None,
        tpm: int | None = None,
    ) -> JobRecord:
        """max_cost: --max-cost in nano-USD."""
        job = self.get(job_ref)
        _check_priced(job.spec, max_cost)
        self._check_token_limit(job, max_tokens)
        self._check_cost_limit(job, max_cost)
        if job.state != PAUSED:
            raise InvalidTransition(
                f"Job {job.job_id} is not paused; to continue it, run: "
                f"{hints.process(job, 'run', self.cmd)}"
            )
        self._change(job, concurrency=concurrency, rpm=rpm, tpm=tpm)
        notes = [f"--max-tokens {max_tokens}"] if max_tokens is not None else []
        if max_cost is not None:
            notes.append(f"--max-cost {prices.format_usd(prices.usd(max_cost))}")
        updated = self.store.set_state(
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
                f"{hints.process(job, 'run', self.cmd)}"
            )
        return self._start(updated)

    def _next_reservation(self, job: JobRecord) -> tuple[int, int] | None:
        """What the paused job's next claim would reserve: (tokens, nano-USD at the price its
        claims pay), or None when nothing is pending. A read: a claim's own check covers what
        changes after it."""
        tokens = self.store.next_item_estimate(job.job_id) if job.state == PAUSED else None
        if tokens is None:
            return None
        return tokens, claim_cost(job.spec, tokens)

    def _check_token_limit(self, job: JobRecord, max_tokens: int | None) -> None:
        """resume: a new --max-tokens must be above what is used, and leave room for the next
        item beside what is charged (else the job would pause again at once); without one, a
        job paused at its limit needs one."""
        if max_tokens is not None and max_tokens < job.tokens_charged + job.tokens_reserved:
            raise InputError(
                f"--max-tokens {max_tokens} is below what the job has already used "
                f"({job.tokens_charged + job.tokens_reserved}); give a larger limit."
            )
        limit = job.spec.max_tokens if max_tokens is None else max_tokens
        nxt = self._next_reservation(job) if limit is not None else None
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
                f"with a larger one: {hints.process(job, 'resume', self.cmd, '--max-tokens N')}"
            )

    def _check_cost_limit(self, job: JobRecord, max_cost: int | None) -> None:
        """resume: _check_token_limit in money (--max-cost, nano-USD)."""
        usd = prices.format_usd
        spent = job.cost_nusd + job.cost_reserved
        if max_cost is not None and max_cost < spent:
            raise InputError(
                f"--max-cost {usd(prices.usd(max_cost))} is below what the job has already spent "
                f"({usd(prices.usd(spent))}); give a larger limit."
            )
        limit = job.spec.max_cost if max_cost is None else max_cost
        nxt = self._next_reservation(job) if limit is not None else None
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
                f"{hints.process(job, 'resume', self.cmd, '--max-cost USD')}"
            )

    def retry(self, job_ref: str | None) -> tuple[JobRecord, int]:
        """Failed items back to the queue; processing starts at once unless the job is paused."""
        job = self.get(job_ref)
        n = self.store.retry_failed(job.job_id)
        if n == 0:
            raise InvalidTransition(f"Job {job.job_id} has no failed items.")
        self.store.add_events(
            job.job_id, [Event("retry", f"{count(n, 'failed item')} returned to the queue")]
        )
        if job.state == PAUSED:
            return self.get(job.job_id), n
        updated = self.store.set_state(
            job.job_id, RUNNING, from_states=[NOT_STARTED, RUNNING, AWAITING_RECOVERY]
        )
        return self._start(updated or job), n

    def delete(self, job_ref: str, *, abandon_batches: bool = False) -> str:
        """Remove the job. A batch job's batches still open at the provider are cancelled there
        first (they are paid for); when that fails nothing is deleted, unless abandon_batches."""
        job = self.get(job_ref)
        if job.running and job.state == RUNNING and self.liveness.live_worker_ids():
            raise InvalidTransition(f"Job {job.job_id} has items in progress; pause it first.")
        if job.spec.mode == "batch" and not abandon_batches:
            if self.cancel_batches is not None:
                self.cancel_batches(self, job)
            elif any(b.open for b in self.store.list_batches(job.job_id)):
                raise InvalidTransition(
                    f"Job {job.job_id} was not deleted: its batches may still run at the provider, "
                    f"and {self.cmd} cannot cancel them here; delete it with hermes-bulk delete, "
                    "or cancel them at the provider and delete it with --abandon-batches."
                )
        self.store.delete_job(job.job_id)
        remove_tree(self.job_dir(job.job_id), self.settings.jobs_dir)
        return job.job_id

    # Results -------------------------------------------------------------------------------
    def export(
        self,
        job_ref: str | None,
        *,
        fmt: str = "md",
        output: str | None = None,
        with_input: bool = False,
        only: str | None = None,
        column: str | None = None,
    ) -> Path:
        """Write the export to output (a regular file, or a new name in an existing folder), by
        default in the job's folder under its variant's name (export.default_name); returns the
        path written."""
        from . import export as export_mod

        job = self.get(job_ref)
        if output is not None and not output.strip():
            raise UsageError("--output is empty; give a file name (or - for standard output).")
        if output:
            target = Path(output).expanduser()
            if is_open_sqlite_file(
                target
            ):  # replacing it would take the database from under every process
                raise InputError(
                    f"--output {output}: a hermes-bulk database in use; choose another --output."
                )
            # A file the user names keeps the mode it had; a new one, and all under the data
            # directory, is owner-only.
            inside = (
                Path(os.path.realpath(self.settings.home)) in Path(os.path.realpath(target)).parents
            )
            export_mod.export(
                self.store,
                job,
                fmt,
                target,
                private=inside,
                with_input=with_input,
                only=only,
                column=column,
            )
            return target
        target = self.job_dir(job.job_id) / export_mod.default_name(
            fmt, only=only, with_input=with_input
        )
        export_mod.export(
            self.store,
            job,
            fmt,
            target,
            make_folder=True,
            with_input=with_input,
            only=only,
            column=column,
        )
        return target

    def export_to_stream(
        self,
        job_ref: str | None,
        stream: TextIO,
        *,
        fmt: str = "md",
        with_input: bool = False,
        only: str | None = None,
        column: str | None = None,
    ) -> None:
        """The export written to stream (`--output -`)."""
        from . import export as export_mod

        export_mod.export_to_stream(
            self.store,
            self.get(job_ref),
            fmt,
            stream,
            with_input=with_input,
            only=only,
            column=column,
        )


def _check_batch_flags(
    batch: bool,
    deadline_s: float | None,
    poll_s: float | None,
    client: str,
    protocol: str,
) -> None:
    """The batch flags of create make sense together, or a UsageError says which does not."""
    if deadline_s is not None and not batch:
        raise UsageError("--batch-deadline is for batch jobs; add --batch.")
    if poll_s is not None and not batch:
        raise UsageError("--poll is for batch jobs; add --batch.")
    if batch and client != "http":
        raise UsageError(
            "A batch job needs an OpenAI-compatible endpoint with a Batch API (a hermes-bulk "
            "worker's)."
        )


def item_answer_key(spec: JobSpec, item_content_hash: str) -> str:
    """The answer key of an item of this job (prompt.answer_key): what reuse matches on, across
    jobs of one store (when spec.reuse) and among the job's own items (always)."""
    return prompt.answer_key(
        model=spec.model,
        client=spec.client,
        instruction=spec.instruction,
        schema=spec.schema,
        max_output_tokens=spec.max_output_tokens,
        sampling=spec.options,
        content_hash=item_content_hash,
        endpoint=endpoints.spec_identity(spec),
        system=spec.system,
    )


def missing_database(settings: Settings) -> Path | None:
    """The SQLite store file of settings' backend when it does not exist yet (else None)."""
    location = parse_backend_url(settings.backend_url)
    if not isinstance(location, SqliteUrl):
        return None
    return None if location.path.exists() else location.path


def state_label(state: str) -> str:
    return "waiting for a worker" if state == "waiting_for_worker" else state.replace("_", " ")
