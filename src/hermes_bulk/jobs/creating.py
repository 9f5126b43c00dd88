"""Creating a job, and planning one (`create --dry-run`): the items found in the source, what
each would send and reserve at most, what it is estimated to use and cost, and which items earlier
answers already cover. Makes no model calls; bad input creates nothing."""

from __future__ import annotations

import codecs
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.provider import OPENAI
from ..credentials import fixed_salt_record
from ..errors import ConfigError, HermesBulkError, InputError, UsageError
from ..files import private_dir
from ..fleet import endpoints
from ..fleet.broker import missing_database
from ..providers.pacing import provider_key
from ..store.protocol import (
    LEARN_AFTER,
    Event,
    JobRecord,
    JobSpec,
    NewItem,
    claim_cost,
    usd_text,
    worst_case_nusd,
)
from ..words import count
from . import bounds, prices, prompt, templates

if TYPE_CHECKING:
    from ..sources import Skipped, Source, SourceItem
    from .request import JobRequest
    from .service import Jobs

# sources is imported where used: `list` and `status` start without it (docs/benchmarks.md, row 7).

#: Items per transaction while creating, and the content bytes one may hold: memory stays flat,
#: and commits stay few (a bigger batch rewrites fewer index pages per item: docs/benchmarks.md).
ADD_BATCH = 20_000
ADD_BATCH_BYTES = 16 * 1024 * 1024
#: Items a dry run classifies per look-up in the answer index.
PLAN_LOOKUP_ITEMS = 1000
#: How many of the newest jobs create looks through for an output allowance learned before.
LEARN_FROM_JOBS = 100
#: Skipped entries a Created lists (job.skipped has the count).
SKIPPED_SHOWN = 20


def _begins_with_bom(path: Path) -> bool:
    """Whether a file begins with a UTF-8 byte-order mark (opened as every source is: a FIFO in
    its place does not hang; what cannot be read has none, and the read of items says why)."""
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


def check_priced(spec: JobSpec, max_cost: int | None) -> None:
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


def create(
    jobs: Jobs,
    request: JobRequest,
    *,
    on_progress: Callable[[int], None] | None = None,
    dry_run: bool = False,
) -> Created | Plan:
    """Discover the items and record them (Jobs.create). With dry_run, only discover them: the
    Plan, nothing written."""
    spec, source = _spec(jobs, request, dry_run)
    check_priced(spec, request.max_cost)
    learned = _learned_allowance(jobs, spec)
    if learned is not None:  # the allowance an earlier job of this request learned
        spec = replace(spec, output_tokens_estimate=learned[0])
    if dry_run:
        return _plan(jobs, spec, request.over, source, learned_from=learned and learned[1])
    jobs.store.begin_job(spec)
    try:
        skipped = _add_items(jobs, spec, source, on_progress)
        job = jobs.store.finish_job(spec.job_id)
        if job.total == 0:
            reasons = ", ".join(sorted({s.reason for s in skipped})) or "nothing found"
            raise InputError(
                f"--over {request.over}: no items to process ({count(job.skipped, 'entry')} "
                f"left out: {reasons})."
            )
    except BaseException:
        jobs.store.delete_job(spec.job_id)
        raise
    private_dir(jobs.job_dir(job.job_id))
    return Created(job=job, skipped=skipped)


def _spec(jobs: Jobs, request: JobRequest, dry_run: bool) -> tuple[JobSpec, Source]:
    """The job the request makes under this process's settings, and its source: what the request
    left unset takes the setting, and what the settings or the source refuse is refused here
    (the request checked itself)."""
    from ..sources import Source

    s, own = jobs.settings, jobs.settings.endpoint
    http = request.client == "http"
    max_output_tokens = request.max_output_tokens or s.max_output_tokens
    concurrency = request.concurrency or min(s.default_concurrency, s.max_concurrency)
    if concurrency > s.max_concurrency:
        raise UsageError(
            f"--concurrency {concurrency} is more than max_concurrency ({s.max_concurrency}); "
            f"lower it, or raise {jobs.setting_name('max_concurrency')}."
        )
    model, provider, endpoint, key_fp = _who_answers(jobs, request, dry_run)
    source = Source(request.over, max_item_bytes=s.max_item_bytes)
    template, field_names = templates.checked(request.template, request.fields, source.kind)
    job_price = prices.resolve(
        model, own.base_url if http else None, batch=request.batch, setting=s.price
    )
    spec = JobSpec(
        job_id=os.urandom(6).hex(),
        instruction=request.instruction,
        source=str(source.path),
        source_kind=source.kind,
        source_bom=source.kind == "csv" and _begins_with_bom(source.path),
        concurrency=concurrency,
        retries=s.max_retries if request.retries is None else request.retries,
        max_tokens=request.max_tokens,
        rpm=request.rpm or s.rpm,
        tpm=request.tpm or s.tpm,
        model=model,
        client=request.client,
        provider_key=provider or "",
        output_tokens_estimate=min(s.output_tokens_estimate, max_output_tokens),
        max_output_tokens=max_output_tokens,
        schema=request.json_schema,
        reuse=s.reuse and not request.fresh,
        mode="batch" if request.batch else "live",
        batch_deadline_s=request.batch_deadline_s,
        endpoint=endpoint,
        key_fingerprint=key_fp,
        protocol=_protocol(request, own.protocol),
        system=request.system,
        options=request.request_options(),
        batch_poll_s=request.batch_poll_s,
        template=template,
        fields=field_names,
        price=job_price.price.as_dict() if job_price.price else None,
        list_price=job_price.list_price.as_dict() if job_price.list_price else None,
        price_unknown=job_price.unknown,
        max_cost=request.max_cost,
    )
    return spec, source


def _who_answers(
    jobs: Jobs, request: JobRequest, dry_run: bool
) -> tuple[str | None, str | None, str | None, str | None]:
    """The job's model, provider key, endpoint and key fingerprint. An endpoint's job takes the
    configured model unless it names one, and is bound to this process's endpoint and key unless
    bind_endpoint is False; Hermes' own client names its model and provider itself."""
    if request.client != "http":
        return request.model, request.provider, None, None
    s, own = jobs.settings, jobs.settings.endpoint
    model = request.model or s.model
    if not model:
        raise ConfigError(
            "No model configured: set HERMES_BULK_MODEL (and HERMES_BULK_PROVIDER, "
            "HERMES_BULK_BASE_URL, HERMES_BULK_API_KEY or the OPENAI_* / ANTHROPIC_* "
            "equivalents), or pass --model."
        )
    salt = _fingerprint_salt(jobs, dry_run)
    provider = request.provider or provider_key(own.base_url, own.api_key, salt)
    if not request.bind_endpoint:
        return model, provider, None, None
    return (
        model,
        provider,
        endpoints.endpoint_url(own.base_url),
        endpoints.key_fingerprint(own, salt),
    )


def _protocol(request: JobRequest, own: str) -> str:
    """The API the job's requests speak: this process's endpoint's, or for a job no endpoint is
    bound to, the one it names; Hermes' own client is asked in OpenAI's shape."""
    if request.client != "http":
        return OPENAI
    return request.protocol if request.protocol and not request.bind_endpoint else own


def _learned_allowance(jobs: Jobs, spec: JobSpec) -> tuple[int, str] | None:
    """The output allowance (JobRecord.output_allowance) of the newest of the last
    LEARN_FROM_JOBS jobs that asked the same model the same way (client, model, instruction,
    --system, --schema, --template or --fields) and has learned one, capped by this job's
    output limit, with that job's id; None when none has, or there is no store yet (nothing
    is made to find out)."""
    if missing_database(jobs.settings) is not None:
        return None

    def shape(s: JobSpec) -> tuple:
        fields = tuple(s.fields) if s.fields else None
        return (s.client, s.model, s.instruction, s.system, s.schema, s.template, fields)

    wanted = shape(spec)
    for job in jobs.store.list_jobs(LEARN_FROM_JOBS):
        if shape(job.spec) != wanted:
            continue
        if job.answered >= LEARN_AFTER and job.tokens_out > 0:
            allowance = job.output_allowance
            if spec.max_output_tokens is not None:
                allowance = min(allowance, spec.max_output_tokens)
            return allowance, job.job_id
    return None


def _fingerprint_salt(jobs: Jobs, dry_run: bool) -> str:
    """The store's salt of credential fingerprints (made now if it has none), or for a dry
    run, which writes nothing and opens no store that does not exist, the one there is:
    without one yet, no job of the store can match, and any salt will do."""
    if not dry_run:
        return jobs.store.fingerprint_salt()
    found = None if missing_database(jobs.settings) else jobs.store.fingerprint_salt(False)
    return found or fixed_salt_record()


def _plan(
    jobs: Jobs, spec: JobSpec, over: str, source: Source, *, learned_from: str | None
) -> Plan:
    """What create would record and send first, read from the source, and what of it would be
    asked: items answered before (when the job reuses) and repeats of an item of the job are
    not, and are left out of the estimate. The store is only read, and not opened when there
    is none yet."""
    from ..sources import Skipped

    allowance = spec.output_tokens_estimate
    items = skipped = 0
    request: dict[str, Any] | None = None
    first = None
    tally = _Tally(
        jobs.store.answered if spec.reuse and not missing_database(jobs.settings) else None
    )
    for entry in source.entries():
        if isinstance(entry, Skipped):
            skipped += 1
            continue
        text, digest = _item_text(jobs, spec, entry)
        if request is None:
            first = entry.name
            request = _first_request(spec, entry.name, text, digest)
        items += 1
        item_worst = bounds.worst_case_tokens(spec, entry.name, text, digest)
        if spec.max_tokens is not None or spec.max_cost is not None:
            _check_fits_alone(spec, entry.name, item_worst)
        tally.add(
            bytes.fromhex(item_answer_key(spec, digest)),
            prompt.estimate_tokens(text, spec.instruction, allowance, spec.system),
            item_worst,
        )
    tally.classify()
    if items == 0:
        raise InputError(
            f"--over {over}: no items to process ({count(skipped, 'entry')} left out)."
        )
    return Plan(
        items=items,
        skipped=skipped,
        estimated_tokens=tally.estimate,
        worst_tokens=tally.worst,
        worst_nusd=worst_case_nusd(spec, tally.worst, items - tally.reused - tally.repeats),
        output_bound=spec.output_bound,
        output_allowance=allowance,
        max_tokens=spec.max_tokens,
        max_cost=spec.max_cost,
        first_item=first,
        request=request or {},
        reused=tally.reused,
        repeats=tally.repeats,
        allowance_from=learned_from,
        price=prices.price_of(spec.price),
        price_unknown=spec.price_unknown,
    )


@dataclass
class _Tally:
    """A dry run's count of what would be asked, classified PLAN_LOOKUP_ITEMS items per look-up
    in the answer index: an item the index answers is reused (when the job reuses: lookup is the
    store's `answered`), one asking what an earlier item of the job asks is a repeat, and the rest
    are asked, their estimates and worst cases summed."""

    lookup: Callable[[list[str]], set[str]] | None
    reused: int = 0
    repeats: int = 0
    estimate: int = 0
    worst: int = 0
    asked: set[bytes] = field(default_factory=set)  # keys of items asked (16 bytes each)
    answered: set[bytes] = field(default_factory=set)  # keys the answer index holds
    pending: list[tuple[bytes, int, int]] = field(default_factory=list)  # key, estimate, worst

    def add(self, key: bytes, estimate: int, worst: int) -> None:
        self.pending.append((key, estimate, worst))
        if len(self.pending) >= PLAN_LOOKUP_ITEMS:
            self.classify()

    def classify(self) -> None:
        new = {
            raw for raw, *_ in self.pending if raw not in self.asked and raw not in self.answered
        }
        if self.lookup is not None and new:
            found = self.lookup(sorted(raw.hex() for raw in new))
            self.answered.update(bytes.fromhex(key) for key in found)
        for raw, estimate, worst in self.pending:
            if raw in self.answered:
                self.reused += 1
            elif raw in self.asked:
                self.repeats += 1
            else:
                self.asked.add(raw)
                self.estimate += estimate
                self.worst += worst
        self.pending.clear()


def _item_text(
    jobs: Jobs, spec: JobSpec, entry: SourceItem, digest: str | None = None
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
    limit = jobs.settings.max_item_bytes
    try:
        return prompt.item_text(spec, entry.content, digest, limit)
    except templates.TooLarge:
        line = line_at(Path(spec.source), entry.offset)
        setting = jobs.setting_name("max_item_bytes")
        raise templates.too_large_error(flag, entry.name, line, limit, setting) from None


def _add_items(jobs: Jobs, spec: JobSpec, source: Source, on_progress) -> list[Skipped]:
    from ..sources import Skipped, content_hash

    batch: list[NewItem] = []
    batch_bytes = 0
    skipped: list[Skipped] = []
    index = 0
    for entry in source.entries():
        if isinstance(entry, Skipped):
            if len(skipped) < SKIPPED_SHOWN:
                skipped.append(entry)
            jobs.store.add_events(spec.job_id, [Event("skipped", f"{entry.name}: {entry.reason}")])
            continue
        digest = content_hash(entry.content)
        text, sent_digest = _item_text(jobs, spec, entry, digest)
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
            jobs.store.add_items(spec.job_id, batch)
            batch, batch_bytes = [], 0
            if on_progress:
                on_progress(index)
    if batch:
        jobs.store.add_items(spec.job_id, batch)
    if on_progress:
        on_progress(index)
    return skipped
