"""What the store holds and hands back: job and item states, and the records of jobs, items,
batches, claims, events and workers. The contract over them is store/protocol.py."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

# Persisted job run states. What `status` shows is derived from these and the item counts
# (see jobs.derive_state).
NOT_STARTED = "not_started"
RUNNING = "running"
PAUSED = "paused"
AWAITING_RECOVERY = "awaiting_recovery"
CREATING = "creating"  # items are still being added; invisible to list/status

# Item states.
PENDING = "pending"
CLAIMED = "running"
COMPLETED = "completed"
FAILED = "failed"
#: A duplicate of an earlier item of the same job: never claimed; it takes the answer (or the
#: failure) of that item when it lands. Counted as pending in the job's counters.
WAITING = "waiting"

#: Items in a provider batch are running items owned by "batch:<batch id>" (never a worker id;
#: liveness never takes them back as a dead worker's): complete_item, fail_item, record_attempt
#: and release_item take that owner as their worker_id, so a batch's results are written where a
#: live call's are (docs/decisions.md "Provider batches").
BATCH_OWNER_PREFIX = "batch:"
#: A batch's own states besides the provider's (validating, in_progress, finalizing, completed,
#: failed, expired, cancelling, cancelled): preparing (items taken, not yet at the provider) and
#: done (its lines ingested, the rest of its items back to pending).
BATCH_PREPARING = "preparing"
BATCH_DONE = "done"

# Why a job paused itself (pause_reason); a user's pause has reason "user".
PAUSE_USER = "user"
PAUSE_TOKEN_LIMIT = "token limit reached"
#: create/resume --max-cost: the next item would take the job's cost past it.
PAUSE_COST_LIMIT = "cost limit reached"
#: `run --sample N` answered its sample (JobRecord.sample) and paused the job for a look.
PAUSE_SAMPLE = "sample"


#: The event of a job that paused after its sample; _job.lua's end_sample fills {n} too.
SAMPLE_DONE = "the sample ({n} of the items) has settled; resume the job for the rest"


def sample_done(n: int) -> str:
    return SAMPLE_DONE.format(n=n)


def spread(count: int, n: int) -> list[int]:
    """n of the ranks 0..count-1 spread evenly, the first and the last included (all of them
    when n >= count): which pending items `run --sample n` takes."""
    if n >= count:
        return list(range(count))
    if n == 1:
        return [0]
    return [round(i * (count - 1) / (n - 1)) for i in range(n)]


# Why a running job's workers stopped (JobRecord.interrupted; docs/decisions.md "Rolling restarts").
#: A `hermes-bulk worker` stopped on a signal and returned what it held: the only kind a worker
#: started with --resume-interrupted continues by itself.
INTERRUPTED_WORKER_STOP = "worker_stop"
#: Found cut off with no record of a graceful worker stop since its last claim: a crash (kill -9,
#: OOM), a Hermes gateway that exited or crashed, an interrupted `run --wait`.
INTERRUPTED_ORPHANED = "orphaned"


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What `create` decides about a job; fixed for the job's life except where noted."""

    job_id: str
    instruction: str
    source: str  # absolute path given to --over
    source_kind: str  # directory | csv | json | jsonl | file
    concurrency: int  # changed by run/resume --concurrency (update_job)
    retries: int
    max_tokens: int | None = None  # changed by resume --max-tokens
    rpm: int | None = None  # changed by run/resume --rpm (update_job)
    tpm: int | None = None  # changed by run/resume --tpm (update_job)
    model: str | None = None
    client: str = "http"  # http (OpenAI-compatible endpoint) | hermes (ctx.llm)
    provider_key: str = ""  # groups workers that share a provider quota (a hash, never a key)
    output_tokens_estimate: int = 512
    max_output_tokens: int | None = None
    schema: str | None = None  # JSON schema text (structured output), or None
    reuse: bool = True  # answers of earlier jobs are reused (create --fresh: False)
    mode: str = (
        "live"  # live (one call per item) | batch (the provider's Batch API; create --batch)
    )
    batch_deadline_s: float | None = None  # batch: items still in a batch this long are run live
    #: http: the endpoint it was created for, its public URL (fleet/endpoints.py); None in a job
    #: made
    #: before endpoints were recorded (any HTTP worker serves it)
    endpoint: str | None = None
    key_fingerprint: str | None = (
        None  # http: endpoints.key_fingerprint of the key it was created with
    )
    #: http: the protocol it speaks to that endpoint (config/provider.py: openai | anthropic)
    protocol: str = "openai"
    #: create --batch --poll: how often its batches are polled (None: batch_poll_seconds)
    batch_poll_s: float | None = None
    #: create --system: text put ahead of the framing in the system message (jobs/prompt.py)
    system: str | None = None
    #: create --temperature and -o KEY=VALUE: fields added to every request body
    #: (jobs/model_options.py), JSON values; None when there are none
    options: dict[str, Any] | None = None
    #: create --template: how each CSV row or JSON record is sent (jobs/templates.py), as given
    template: str | None = None
    #: create --fields: the only fields of each row or record sent (a list once read back)
    fields: tuple[str, ...] | list[str] | None = None
    #: What the job pays per million tokens (jobs/prices.py Price.as_dict), found at create; a
    #: batch job's is the batch price, with the live list_price beside it; price_unknown says
    #: why there is none
    price: dict[str, Any] | None = None
    list_price: dict[str, Any] | None = None
    price_unknown: str | None = None
    #: create/resume --max-cost, in nano-USD (needs a price); changed by resume --max-cost
    max_cost: int | None = None
    #: a CSV source began with a UTF-8 byte-order mark (export --with-input follows it)
    source_bom: bool = False

    @property
    def output_bound(self) -> int:
        """The most output tokens an answer may bill: the max_tokens every request carries. A job
        made before every request carried one has only its estimate (not a bound)."""
        if self.max_output_tokens is not None:
            return self.max_output_tokens
        return self.output_tokens_estimate


@functools.lru_cache(maxsize=256)
def spec_from_json(text: str) -> JobSpec:
    """A stored spec, parsed once per distinct text (a claim reads it for every item; JobSpec is
    frozen, so one instance can be shared)."""
    return JobSpec(**json.loads(text))


#: Source kinds whose items' captured content is dropped once they complete: the
#: export gives a file's path, never its text, so nothing reads it again. A CSV row or a JSON
#: record is kept: `export --with-input` writes it back.
DROPS_CONTENT = frozenset({"directory", "file"})


def drops_content(spec: JobSpec) -> bool:
    return spec.source_kind in DROPS_CONTENT


@dataclass(frozen=True, slots=True)
class NewItem:
    """An item as `create` records it; content is stored once per distinct content_hash."""

    index: int  # 0-based position in the source
    name: str
    content: str
    content_hash: str
    origin: str
    offset: int
    stat_sig: str
    estimated_tokens: int  # expected (prompt.estimate_tokens): what estimates sum
    answer_key: str = ""  # reuse.answer_key: "" never matches anything
    #: what its claims reserve (bounds.worst_case_tokens); the estimate where none was given
    worst_tokens: int | None = None

    @property
    def claim_tokens(self) -> int:
        return self.estimated_tokens if self.worst_tokens is None else self.worst_tokens


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happened to a job; never holds provider text or credentials."""

    kind: str
    message: str
    item_index: int | None = None
    error_type: str | None = None
    http_status: int | None = None
    at: float = 0.0  # filled in by the store when 0


LEARN_AFTER = 3  #: completed items before the output allowance is learned from them


@dataclass(frozen=True, slots=True)
class JobRecord:
    spec: JobSpec
    created_at: float
    state: str
    pause_reason: str | None
    total: int
    pending: int
    running: int
    completed: int
    failed: int
    tokens_in: int  # reported by the provider, completed items (answers kept)
    tokens_out: int
    #: reported usage, or the reservation where none was reported; answers not kept included
    tokens_charged: int
    tokens_reserved: int  # worst cases held by running items (NewItem.claim_tokens)
    #: sum of the estimates of the items that will be asked: not those reused at create, nor
    #: the duplicates waiting on an earlier item of the job
    estimated_tokens: int
    skipped: int
    last_claim_at: float | None  # when an item was last claimed
    run_at: float | None  # when the job last moved to running
    #: Why its workers stopped (INTERRUPTED_*), recorded by mark_interrupted; cleared when it is
    #: run.
    interrupted: str | None = None
    interrupted_at: float | None = None  # when that was recorded (the backend's clock)
    reused: int = 0  # items completed at create with an earlier job's answer
    tokens_saved: int = 0  # the tokens those answers were recorded with (never charged here)
    tokens_cached: int = 0  # of tokens_in, those the provider served from its prompt cache
    tokens_written: int = 0  # of tokens_in, those the provider wrote to its prompt cache
    #: What the completed items cost, in nano-USD (Usage.cost_nusd summed); 0 without a price
    cost_nusd: int = 0
    list_nusd: int = 0  # the same at the live list price (a batch job's saving is the difference)
    saved_nusd: int = 0  # what the answers reused at create cost when they were asked
    #: `run --sample N`: the only items claims take until each has settled, when the job pauses
    #: itself (PAUSE_SAMPLE) and the sample is cleared; None otherwise
    sample: tuple[int, ...] | None = None
    #: nano-USD held by running items under --max-cost (reserved_cost of each claim)
    cost_reserved: int = 0
    #: the sum of what the items to ask reserve when claimed (their worst cases; NewItem
    #: claim_tokens), as estimated_tokens sums their expected tokens
    worst_tokens: int = 0
    #: Of tokens_charged and cost_nusd, what the provider billed for answers that were not kept
    #: (truncated, invalid, refused: JobStore.fail_item's and settle_failed_attempt's usage)
    tokens_unkept: int = 0
    cost_unkept: int = 0

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    @property
    def answered(self) -> int:
        """Completed items that were answered in this job (not reused from an earlier one at
        create).

        In-job duplicates are counted (no counter tells them apart), which lowers the learned
        allowance in a job of many repeats; docs/decisions.md says why that is accepted."""
        return self.completed - self.reused

    @property
    def output_allowance(self) -> int:
        """The output tokens an item is expected to answer with, for estimates and planning only
        (a claim reserves the worst case, JobSpec.output_bound): once LEARN_AFTER items are
        done, twice the mean output of the completed items (capped at max_output_tokens), else
        the configured expectation."""
        fixed = self.spec.output_tokens_estimate
        if self.answered < LEARN_AFTER or self.tokens_out <= 0:
            return fixed
        learned = -(-2 * self.tokens_out // self.answered)
        cap = self.spec.max_output_tokens
        return learned if cap is None else min(learned, cap)

    @property
    def projected_tokens(self) -> int:
        """The whole job's estimate: the sum of the item estimates until LEARN_AFTER items are done,
        then what is charged plus the items pending and running at the mean cost of a completed
        one."""
        if self.answered < LEARN_AFTER or self.tokens_out <= 0:
            return self.estimated_tokens
        per_item = -(-self.tokens_charged // self.answered)
        # the items running count at the mean too: what they reserve is their worst case
        return self.tokens_charged + (self.pending + self.running) * per_item

    @property
    def finished(self) -> bool:
        return self.total > 0 and self.completed + self.failed == self.total


NANO_PER_USD = 10**9  #: costs are kept in nano-USD: integers, so both backends sum exactly
#: The largest --max-cost, in USD: nano-USD sums stay exact in a Redis script (doubles, 2^53).
MAX_COST_USD = 1_000_000


def cost_rates(spec: JobSpec) -> tuple[float, float, float, float] | None:
    """USD per million tokens a claim reserves at under --max-cost: (input, output) of the live
    price (a live claim of a batch job pays the list price), then of the price a batch pays;
    None without a price. Input is reserved at the dearer of the input and the prompt-cache
    write price: an item may write all of its input to the cache."""
    if spec.price is None:
        return None
    live = spec.list_price or spec.price
    return _input_rate(live), live["output"], _input_rate(spec.price), spec.price["output"]


def _input_rate(price: dict[str, Any]) -> float:
    return max(price["input"], price.get("cache_write_input") or 0.0)


def reserved_cost(tokens: int, output_bound: int, rate_in: float, rate_out: float) -> int:
    """The nano-USD a claim reserves under --max-cost for an item that reserves `tokens` (its
    worst case): the output bound's share at the output rate, the rest at the input rate (USD
    per million tokens), rounded up.

    A copy is in store/redis/lua/_job.lua (reserved_cost); both do the same double operations
    in the same order, so SQLite and Redis agree to the nano-dollar (the stateful model holds
    them to it). Past 2**53 the figure is a double's, the same on both: far above any limit
    (MAX_COST_USD), where the sums compared with it are exact. SQLite's claims call this one as
    an SQL function."""
    out = min(output_bound, tokens)
    return math.ceil(((tokens - out) * rate_in + out * rate_out) * 1000)


def claim_cost(spec: JobSpec, tokens: int, *, batch: bool | None = None) -> int:
    """The nano-USD a claim reserving `tokens` (a worst case) holds under --max-cost, at the
    price its claims pay (a batch job's batches at the batch price; batch=False: a live claim);
    0 without a price."""
    rates = cost_rates(spec)
    if rates is None:
        return 0
    in_batch = spec.mode == "batch" if batch is None else batch
    rin, rout = rates[2:] if in_batch else rates[:2]
    return reserved_cost(tokens, spec.output_bound, rin, rout)


def worst_case_nusd(spec: JobSpec, tokens: int, items: int) -> int:
    """What `items` items whose worst cases sum to `tokens` may cost at most, each asked once:
    reserved_cost of the sum (it is linear: each item's output bound at the output rate, the
    rest at the input rate), at the price the job pays; 0 without a price."""
    rates = cost_rates(spec)
    if rates is None or items <= 0:
        return 0
    rin, rout = rates[2:] if spec.mode == "batch" else rates[:2]
    return reserved_cost(tokens, min(tokens, items * spec.output_bound), rin, rout)


def usd_text(nusd: int) -> str:
    """Nano-USD as an event says it: exactly, cents at least ($0.000159999, $1.50).
    _job.lua's usd_text is a copy."""
    whole, frac = divmod(nusd, NANO_PER_USD)
    return f"${whole}.{f'{frac:09d}'.rstrip('0').ljust(2, '0')}"


def cost_limit_reached(spent: int, need: int, index: int, limit: int) -> str:
    """The event of a job that --max-cost paused (nano-USD; index 0-based); _job.lua writes it
    the same way."""
    return (
        f"cost limit reached: {usd_text(spent)} spent + {usd_text(need)} for item {index + 1} "
        f"would exceed --max-cost {usd_text(limit)}"
    )


@dataclass(frozen=True, slots=True)
class Claim:
    """An item handed to one worker, with everything needed to process it."""

    job: JobRecord
    index: int
    name: str
    content: str
    content_hash: str
    origin: str
    offset: int
    stat_sig: str
    attempts: int  # failed attempts so far (transient errors)
    rate_limit_waits: int  # consecutive 429s so far
    #: The turn of its first request, when the store took it with the claim
    #: (JobStore.complete_and_claim's take_turn); None: ask SharedLimits.acquire.
    turn: Turn | None = None


#: Refusals that mean "not now": reservations in flight may settle for less (try again shortly).
IN_FLIGHT = frozenset({"tokens_in_flight", "cost_in_flight"})


@dataclass(frozen=True, slots=True)
class ClaimRefused:
    """Why no item was claimed: no_job, not_running, no_pending, at_capacity, token_limit or
    cost_limit (the job paused), tokens_in_flight or cost_in_flight (try again shortly:
    reservations in flight may settle; IN_FLIGHT), sample_done (run --sample settled; paused)."""

    reason: str


@dataclass(frozen=True, slots=True)
class ItemRecord:
    index: int
    name: str
    status: str
    result: str | None
    error_type: str | None
    http_status: int | None
    error_message: str | None
    tokens_in: int
    tokens_out: int
    attempts: int
    provider: str | None
    model: str | None
    content: str | None = None  # what the item was given (iter_items with_content only)
    reused_from: tuple[str, int] | None = None  # (job id, index) of the answer reused
    #: nano-USD the item was billed at its job's price: its kept answer and every billed attempt
    #: that was not kept (tokens_in and tokens_out count those attempts too)
    cost_nusd: int = 0


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """One provider batch of a job: which items it holds (those owned by `owner`) and where it
    is."""

    batch_id: (
        str  # ours; also the provider batch's metadata, which is how an unrecorded one is found
    )
    job_id: str
    status: str  # BATCH_PREPARING, a provider status, or BATCH_DONE
    items: int
    created_at: float
    provider_id: str | None = None  # recorded before its items count as submitted
    input_file: str | None = None
    output_file: str | None = None
    error_file: str | None = None
    completed: int = 0
    failed: int = 0
    submitted_at: float | None = None
    cancel_sent: bool = False
    run_rest_live: bool = False  # cancelled at --batch-deadline: its unfinished items run live
    lease_owner: str | None = None  # the worker submitting, polling or ingesting it now
    lease_until: float = 0.0
    #: The provider's status when the batch ended (completed, expired, cancelled, failed), kept
    #: when `status` becomes BATCH_DONE; None while open, for a batch closed before it reached the
    #: provider, and for one that ended before this field was recorded.
    final_status: str | None = None
    #: When a worker last asked the provider how it is doing (the backend's clock); None before.
    polled_at: float | None = None

    @property
    def owner(self) -> str:
        return BATCH_OWNER_PREFIX + self.batch_id

    @property
    def open(self) -> bool:
        return self.status != BATCH_DONE


#: The fields update_batch may change.
BATCH_FIELDS = (
    "status",
    "provider_id",
    "input_file",
    "output_file",
    "error_file",
    "completed",
    "failed",
    "submitted_at",
    "cancel_sent",
    "run_rest_live",
    "final_status",
    "polled_at",
)


class BatchItem(NamedTuple):
    """An item a batch holds, with what a request for it and a source-change check need."""

    index: int
    name: str
    content: str
    content_hash: str
    origin: str
    offset: int
    stat_sig: str


@dataclass(frozen=True, slots=True)
class ItemDetail:
    """One item as `show` presents it: its record, and the content sent for it."""

    item: ItemRecord
    content: str | None  # None: dropped once the item completed (drops_content)
    content_hash: str


# The most tokens one request may report. Redis scripts hold numbers as doubles and pass them
# on with 14 significant digits, so a larger count would fail on Redis where SQLite takes it;
# model clients treat a larger (or non-integer) report as no report (the estimate is charged).
MAX_USAGE_TOKENS = 10**9


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens a provider reported for one request, each 0..MAX_USAGE_TOKENS or None, and what
    the request cost at the job's price (jobs/prices.py priced), which the store adds up."""

    tokens_in: int | None = None
    tokens_out: int | None = None
    tokens_cached: int | None = None  # of tokens_in, read from the provider's prompt cache
    cost_nusd: int = 0  # nano-USD at the job's price; 0 when the job has none
    list_nusd: int = 0  # nano-USD at the live list price (a batch's is cost_nusd's double)
    #: of tokens_in, written to the provider's prompt cache (Anthropic bills them above input)
    tokens_written: int | None = None

    @property
    def reported(self) -> bool:
        return self.tokens_in is not None or self.tokens_out is not None


@dataclass(frozen=True, slots=True)
class ItemError:
    """What a job record keeps of a failure: type, HTTP status, our own message."""

    error_type: str
    message: str
    http_status: int | None = None


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    worker_id: str
    host: str
    pid: int
    started_at: float
    heartbeat_at: float
    threads: int
    #: What it serves, comma-separated (liveness.serves_tokens): kinds of job ("http", "hermes"),
    #: "job:<id>" when it serves that job alone (`run JOB --wait`); "" from a worker that
    #: predates this record: it serves "http" jobs.
    serves: str = ""
    holding: list[tuple[str, int]] = field(default_factory=list)  # (job_id, item index)


@dataclass(frozen=True, slots=True)
class PauseState:
    """The shared wait of one provider key: until when, and the current backoff step."""

    until: float
    backoff_step: int


class Turn(NamedTuple):
    """SharedLimits.acquire's answer: wait is 0.0 when a request was taken, else the seconds to
    wait before asking again; epoch is the key's count of adaptive decreases at the grant."""

    wait: float
    epoch: int
