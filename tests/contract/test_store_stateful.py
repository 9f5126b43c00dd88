"""The store protocol against a pure-Python model of it, by random sequences of operations.

The SQL (store/sqlite/) and the Lua (store/redis/lua/) are two copies of one state machine;
this test keeps them one. `Model` is written from store/protocol.py's docstrings, not from
either backend: Hypothesis drives a real backend and the model through the same random steps
and after every step compares counts, tokens, reservations, every item, and who owns which
item. The steps are every JobStore operation the product calls: create (a JSONL source, whose
contents are kept, or a folder, whose completed contents are dropped; duplicates that wait on
the first item with their answer key), run, pause, resume, update_job, mark_interrupted, claim,
complete, complete-and-claim, fail, attempts, a failed attempt settled, release, lease renewal,
lease expiry, a dead worker's items released, retry, token limits, provider batches (open, take
over, lease, submit, finish, release), worker heartbeats, a second job that reuses the first
one's answers, delete_job while the job runs, events, and the reads the product makes
(get_item, find_item, item_names, next_item_estimate, find_job_ids, list_jobs,
batch_job_ids). SharedLimits has its own model (test_limits_stateful.py).

Time is the test's: the backend runs on a Clock (clocked.py) that only the `advance` step
moves, so a lease, a batch lease or a heartbeat runs out exactly when the model says, on both
backends, and never by accident of a slow machine.

HERMES_BULK_STATEFUL_EXAMPLES sets the number of examples (default 100); raise it to search
longer before a release, e.g. HERMES_BULK_STATEFUL_EXAMPLES=2000. HERMES_BULK_STATEFUL_SHRINK=0
reports the first failing example unshrunk (a planted bug's verdict, fast).
"""

from __future__ import annotations

import itertools
import math
import os
from collections import Counter
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from hermes_bulk.store.protocol import (
    BATCH_DONE,
    BATCH_OWNER_PREFIX,
    BATCH_PREPARING,
    CLAIMED,
    COMPLETED,
    FAILED,
    INTERRUPTED_ORPHANED,
    INTERRUPTED_WORKER_STOP,
    MAX_USAGE_TOKENS,
    NOT_STARTED,
    PAUSE_COST_LIMIT,
    PAUSE_SAMPLE,
    PAUSE_TOKEN_LIMIT,
    PAUSE_USER,
    PAUSED,
    PENDING,
    RUNNING,
    WAITING,
    BatchRecord,
    Claim,
    ClaimRefused,
    Event,
    ItemError,
    JobSpec,
    NewItem,
    Usage,
    WorkerInfo,
)

from .clocked import clocked_backend

WORKERS = ("w1", "w2", "w3")
MAX_ITEMS = 6
FAR_S = 10.0**6  # a lease or ttl no example reaches (advances add up to well under this)
# Leases and ttls a step takes, and how far the clock moves: the steps meet the ends exactly
# (30 s after a 30 s lease is still held; 30.001 s is past it).
LEASES = st.sampled_from([-60.0, 5.0, 30.0, FAR_S])
ADVANCES = st.sampled_from([0.001, 1.0, 5.0, 29.999, 30.0, 30.001, 60.0, 125.0])
TTLS = st.sampled_from([30.0, 90.0, FAR_S])

# Which item states may follow which: claim, complete/fail/release/expiry, retry. Completed
# is final (DESIGN.md invariant 2).
ITEM_MOVES = {
    (PENDING, CLAIMED),
    (CLAIMED, COMPLETED),
    (CLAIMED, FAILED),
    (CLAIMED, PENDING),
    (FAILED, PENDING),
    # A duplicate takes its item's answer or failure, and waits on it again after retry.
    (WAITING, COMPLETED),
    (WAITING, FAILED),
    (FAILED, WAITING),
}

EXAMPLES = int(os.environ.get("HERMES_BULK_STATEFUL_EXAMPLES", "100"))
# HERMES_BULK_STATEFUL_SHRINK=0: report the first failing example as found, unshrunk (a planted
# bug's yes or no in seconds, where shrinking a long example takes minutes).
PHASES = (
    tuple(Phase)
    if os.environ.get("HERMES_BULK_STATEFUL_SHRINK", "1") != "0"
    else (Phase.explicit, Phase.reuse, Phase.generate)
)
STATESTEP = settings(
    max_examples=EXAMPLES,
    phases=PHASES,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


# The reservation rule ----------------------------------------------------------------------
# The one place the model says what a claim does about --max-tokens (protocol.py,
# JobStore.claim_item): the next item waits while reservations in flight may still settle
# below the limit, and the job pauses only when what is charged plus the next item would not fit.
CLAIM, WAIT, PAUSE = "claim", "wait", "pause"
WAIT_REASON = "tokens_in_flight"


def token_rule(max_tokens: int | None, charged: int, reserved: int, estimate: int) -> str:
    """What a claim of an item with this estimate does: CLAIM it, WAIT (refuse, the job keeps
    running), or PAUSE the job with PAUSE_TOKEN_LIMIT (refuse). --max-cost is the same rule in
    nano-USD (spent, reserved, the item's cost), taken after this one says CLAIM."""
    if max_tokens is None or charged + reserved + estimate <= max_tokens:
        return CLAIM
    if charged + estimate <= max_tokens:
        return WAIT
    return PAUSE


# The model -----------------------------------------------------------------------------------


@dataclass
class ModelItem:
    estimate: int
    content: str
    key: str  # the answer key
    status: str = PENDING
    owner: str | None = None
    until: int = 0  # lease end (ms) while running
    reserved: int = 0
    reserved_cost: int = 0  # nano-USD held under --max-cost while it runs
    attempts: int = 0
    waits: int = 0
    result: str | None = None
    tokens_in: int = 0  # what it was billed: its kept answer and its answers not kept
    tokens_out: int = 0
    cost: int = 0  # nano-USD, the same
    error: ItemError | None = None
    provider: str | None = None
    model: str | None = None
    dup_of: int | None = None  # the first item of the job with the same answer key


@dataclass
class ModelBatch:
    items: int
    owner: str | None  # the lease holder
    until: int  # lease end (ms)
    status: str = BATCH_PREPARING


@dataclass
class ModelWorker:
    host: str
    pid: int
    started_at: float
    beat: int  # ms of the last heartbeat
    until: int  # ms: live while the clock is at or before it
    threads: int
    serves: str


@dataclass
class Model:
    concurrency: int
    max_tokens: int | None
    items: list[ModelItem]
    output_estimate: int
    output_cap: int | None
    state: str = NOT_STARTED
    pause_reason: str | None = None
    deleted: bool = False
    charged: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    tokens_cached: int = 0
    tokens_written: int = 0
    cost: int = 0  # nano-USD, as Usage.cost_nusd adds them up
    list_cost: int = 0
    tokens_unkept: int = 0  # of charged and cost, the answers billed and not kept
    cost_unkept: int = 0
    rpm: int | None = None
    tpm: int | None = None
    run_at: int | None = None
    last_claim_at: int | None = None
    interrupted: tuple[str, int] | None = None  # (reason, ms)
    sample: tuple[int, ...] | None = None  # run --sample: the only items claims take
    max_cost: int | None = None  # nano-USD
    #: USD per million tokens a claim reserves at: live input, output, a batch's input, output
    rates: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    frozen: dict[int, tuple] = field(default_factory=dict)  # completed items, as first seen
    batches: dict[str, ModelBatch] = field(default_factory=dict)
    workers: dict[str, ModelWorker] = field(default_factory=dict)
    answers: dict[str, tuple[int, int, int]] = field(
        default_factory=dict
    )  # answer key -> (index, charged, cost)

    def count(self, status: str) -> int:
        return sum(it.status == status for it in self.items)

    @property
    def reserved(self) -> int:
        return sum(it.reserved for it in self.items if it.status == CLAIMED)

    @property
    def cost_reserved(self) -> int:
        return sum(it.reserved_cost for it in self.items if it.status == CLAIMED)

    def money(self, need: int, *, batch: bool) -> int:
        """What an item reserving `need` tokens reserves in nano-USD under --max-cost
        (records.reserved_cost, written out again): the output bound's share at the output
        rate, the rest at the input rate, rounded up; nothing without a limit."""
        if self.max_cost is None:
            return 0
        rate_in, rate_out = self.rates[2:] if batch else self.rates[:2]
        out = min(self.output_bound(), need)
        return math.ceil(((need - out) * rate_in + out * rate_out) * 1000)

    @property
    def preparing(self) -> str | None:
        """The batch being prepared (at most one)."""
        return next((b for b, rec in self.batches.items() if rec.status == BATCH_PREPARING), None)

    def owned(self, index: int, worker: str) -> ModelItem | None:
        """The item if worker holds it running (what every owner-only operation requires)."""
        if not self.deleted and 0 <= index < len(self.items):
            it = self.items[index]
            if it.status == CLAIMED and it.owner == worker:
                return it
        return None

    def set_state(
        self,
        state: str,
        from_states: tuple[str, ...],
        pause_reason: str | None,
        max_tokens: int | None,
        now: int,
        max_cost: int | None = None,
    ) -> bool:
        if self.deleted or self.state not in from_states:
            return False
        self.state, self.pause_reason = state, pause_reason
        if max_tokens is not None:
            self.max_tokens = max_tokens
        if max_cost is not None:
            self.max_cost = max_cost
        if state == RUNNING:  # someone ran it: when, and no longer interrupted
            self.run_at, self.interrupted = now, None
        return True

    def claim(
        self, hint: int, worker: str, max_running: int, lease_s: float, now: int
    ) -> tuple[str, int | None]:
        """(reason, None) when refused, else ("ok", index); the model moves as the store must."""
        if self.deleted:
            return "no_job", None
        if self.state != RUNNING:
            return "not_running", None
        if self.count(CLAIMED) >= min(self.concurrency, max_running):
            return "at_capacity", None
        pending = [i for i, it in enumerate(self.items) if it.status == PENDING]
        if self.sample is not None:  # the lowest pending index of the sample, whatever the hint
            pending = [i for i in self.sample if self.items[i].status == PENDING]
            if not pending and not any(self.items[i].status == CLAIMED for i in self.sample):
                self.state, self.pause_reason, self.sample = PAUSED, PAUSE_SAMPLE, None
                return "sample_done", None
            hint = pending[0] if pending else hint
        if not pending:
            return "no_pending", None
        index = hint if hint in pending else pending[0]
        it = self.items[index]
        need = self.reservation(it.estimate)
        verdict = token_rule(self.max_tokens, self.charged, self.reserved, need)
        if verdict == PAUSE:
            self.state, self.pause_reason = PAUSED, PAUSE_TOKEN_LIMIT
            return "token_limit", None
        if verdict == WAIT:
            return WAIT_REASON, None
        money = self.money(need, batch=False)
        verdict = token_rule(self.max_cost, self.cost, self.cost_reserved, money)
        if verdict == PAUSE:
            self.state, self.pause_reason = PAUSED, PAUSE_COST_LIMIT
            return "cost_limit", None
        if verdict == WAIT:
            return "cost_in_flight", None
        self.hold(it, worker, need, now + round(lease_s * 1000), money)
        self.last_claim_at = now
        return "ok", index

    @staticmethod
    def hold(it: ModelItem, owner: str, need: int, until: int, money: int) -> None:
        it.status, it.owner, it.until, it.reserved = CLAIMED, owner, until, need
        it.reserved_cost = money

    def open_batch(
        self,
        batch_id: str,
        worker: str,
        max_items: int,
        lease_s: float,
        hold_s: float,
        take_from: str | None,
        now: int,
    ) -> tuple[str, str | None]:
        """protocol.open_batch: (reason, None) when refused, else ("ok", the batch id returned)."""
        if self.deleted:
            return "no_job", None
        if self.state != RUNNING:
            return "not_running", None
        preparing = self.preparing
        if preparing is not None:
            b = self.batches[preparing]
            if b.owner not in (None, worker, take_from) and b.until >= now:
                return "batch_preparing", None
            b.owner, b.until = worker, now + round(lease_s * 1000)  # taken over, or its own again
            return "ok", preparing
        pending = [it for it in self.items if it.status == PENDING][:max_items]
        if not pending:
            return "no_pending", None
        taken, reserved, reserved_cost = [], self.reserved, self.cost_reserved
        for it in pending:
            need = self.reservation(it.estimate)
            money = self.money(need, batch=True)
            verdicts = (
                (token_rule(self.max_tokens, self.charged, reserved, need), PAUSE_TOKEN_LIMIT),
                (token_rule(self.max_cost, self.cost, reserved_cost, money), PAUSE_COST_LIMIT),
            )
            verdict, why = next(((v, w) for v, w in verdicts if v != CLAIM), (CLAIM, None))
            if verdict != CLAIM:
                if taken:
                    break
                cost = why == PAUSE_COST_LIMIT
                if verdict == PAUSE:
                    self.state, self.pause_reason = PAUSED, why
                    return ("cost_limit" if cost else "token_limit"), None
                return ("cost_in_flight" if cost else WAIT_REASON), None
            taken.append((it, need, money))
            reserved += need
            reserved_cost += money
        for it, need, money in taken:
            self.hold(it, BATCH_OWNER_PREFIX + batch_id, need, now + round(hold_s * 1000), money)
        self.batches[batch_id] = ModelBatch(len(taken), worker, now + round(lease_s * 1000))
        self.last_claim_at = now
        return "ok", batch_id

    def lease_batch(
        self, batch_id: str, worker: str, lease_s: float, take_from: str | None, now: int
    ) -> bool:
        b = self.batches.get(batch_id)
        if self.deleted or b is None or b.status == BATCH_DONE:
            return False
        if b.owner not in (None, worker, take_from) and b.until >= now:
            return False
        b.owner, b.until = worker, now + round(lease_s * 1000)
        return True

    def duplicates(self, index: int) -> list[ModelItem]:
        return [it for it in self.items if it.dup_of == index and it.status == WAITING]

    def output_bound(self) -> int:
        """What splits a reservation's cost (JobSpec.output_bound): max_tokens, else the
        estimate."""
        return self.output_estimate if self.output_cap is None else self.output_cap

    def reservation(self, estimate: int) -> int:
        """An item reserves its stored worst case, whatever the job has learned (the rule:
        store/sqlite/reservations.py, claim_item.lua)."""
        return estimate

    def requeue(self, it: ModelItem) -> None:
        it.status, it.owner, it.until, it.reserved = PENDING, None, 0, 0

    def complete(self, it: ModelItem, result: str, usage: Usage, provider, model) -> None:
        charged = (
            (usage.tokens_in or 0) + (usage.tokens_out or 0) if usage.reported else it.reserved
        )
        # no bill said: charged what its claim held, in money too
        cost = usage.cost_nusd if usage.reported else max(usage.cost_nusd, it.reserved_cost)
        self.charged += charged
        self.tokens_in += usage.tokens_in or 0
        self.tokens_out += usage.tokens_out or 0
        self.tokens_cached += usage.tokens_cached or 0
        self.tokens_written += usage.tokens_written or 0
        self.cost += cost
        self.list_cost += usage.list_nusd
        it.status, it.owner, it.until, it.reserved = COMPLETED, None, 0, 0
        it.result, it.cost = result, it.cost + cost
        it.tokens_in += usage.tokens_in or 0
        it.tokens_out += usage.tokens_out or 0
        it.provider, it.model, it.waits = provider or None, model or None, 0  # "" is none
        index = self.items.index(it)
        self.answers[it.key] = (index, charged, cost)  # later jobs reuse this answer
        for d in self.duplicates(index):  # the same answer, nothing charged
            d.status, d.result, d.tokens_in, d.tokens_out = COMPLETED, result, 0, 0
            d.provider, d.model = provider or None, model or None

    def charge_unkept(self, it: ModelItem, usage: Usage | None) -> None:
        """An answer the provider billed and that is not kept (fail_item's, settle's usage)."""
        if usage is None or not usage.reported:
            return
        tokens = (usage.tokens_in or 0) + (usage.tokens_out or 0)
        self.charged, self.tokens_unkept = self.charged + tokens, self.tokens_unkept + tokens
        self.cost, self.cost_unkept = (
            self.cost + usage.cost_nusd,
            self.cost_unkept + usage.cost_nusd,
        )
        self.list_cost += usage.list_nusd
        it.tokens_in += usage.tokens_in or 0
        it.tokens_out += usage.tokens_out or 0
        it.cost += usage.cost_nusd

    def fail(self, it: ModelItem, error: ItemError) -> None:
        it.status, it.owner, it.until, it.reserved, it.error = FAILED, None, 0, 0, error
        for d in self.duplicates(self.items.index(it)):
            d.status, d.error = FAILED, error

    def owners(self) -> dict[str, int]:
        if self.deleted:
            return {}
        return dict(Counter(it.owner for it in self.items if it.status == CLAIMED))

    def live(self, now: int) -> dict[str, ModelWorker]:
        return {w: info for w, info in self.workers.items() if info.until >= now}


# Strategies ----------------------------------------------------------------------------------

texts = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
tokens = st.one_of(st.none(), st.integers(0, 60), st.integers(0, 5000), st.just(MAX_USAGE_TOKENS))
small_tokens = st.one_of(st.none(), st.integers(0, 60))
#: nano-USD: nothing, a cent's fraction, and a request of a million tokens at $75 per million
costs = st.one_of(st.just(0), st.integers(1, 10**6), st.just(75 * 10**9))


def usages(counts):
    """A Usage as a provider reports it (cached input among the input) and as a job prices it."""
    cache = st.one_of(st.none(), st.integers(0, 60))
    return st.builds(Usage, counts, counts, cache, costs, costs, cache)


#: What a failed attempt was billed: nothing, or a usage as a provider reports it
unkept = st.one_of(st.none(), st.builds(Usage, tokens, tokens, st.none(), costs, costs))

errors = st.builds(
    ItemError,
    error_type=st.sampled_from(["PermanentError", "TransientError", "RateLimitError"]),
    message=texts,
    http_status=st.one_of(st.none(), st.integers(400, 599)),
)
workers = st.sampled_from(WORKERS)
# Estimates over the whole range a source can give: small, around the allowance, up to and past
# MAX_USAGE_TOKENS (an item may be estimated above what one report may count).
estimates = st.one_of(
    st.integers(0, 60),
    st.integers(0, 5000),
    st.sampled_from([MAX_USAGE_TOKENS - 1, MAX_USAGE_TOKENS, MAX_USAGE_TOKENS + 1]),
    st.integers(0, 3 * MAX_USAGE_TOKENS),
)
# --max-tokens, or None: drawn near sums of estimates (k items, plus a slack of -2..2), so the
# limit is often met exactly, where "would exceed" and "would reach" differ.
# Two in three jobs have no limit, so most examples get far enough to complete items.
limits = st.one_of(st.none(), st.none(), st.tuples(st.integers(1, MAX_ITEMS), st.integers(-2, 2)))
indexes = st.integers(-1, MAX_ITEMS)  # -1 and past the end: no such item
# A job's price (USD per million tokens: live input, output, then a batch's), or none; figures
# whose products are not whole in a double among them.
job_prices = st.sampled_from(
    [
        None,
        (0.15, 0.6, 0.15, 0.6),
        (1.0, 4.0, 0.5, 2.0),
        (0.1, 0.2, 0.05, 0.1),
        (1e-5, 9999.999, 1e-5, 9999.999),
    ]
)
# An owner-only step names a running item and its owner (aim, 2 in 3; pick chooses which), or any
# worker and index: mostly not the owner, which must change nothing.
targets = st.tuples(
    st.sampled_from([True, True, False]), st.integers(0, MAX_ITEMS), workers, indexes
)
batch_owners = st.one_of(workers, st.sampled_from(["b1", "nobody"]))
# Whose lease a takeover names: none, the batch's holder (mostly), or anyone.
take_froms = st.sampled_from([None, "holder", "holder", "w1", "nobody"])


def busy(machine) -> bool:
    """Owner-only steps run while some item runs (else nearly every one would be a no-op);
    one in three still names a stranger (see `targets`)."""
    return machine.m is not None and machine.m.count(CLAIMED) > 0


def has_job(machine) -> bool:
    return machine.m is not None


class StoreMachine(RuleBasedStateMachine):
    backend = None  # set by the test (one backend per test function, a fresh job per example)
    _ids = itertools.count()

    def __init__(self) -> None:
        super().__init__()
        self.store, self.clock = self.backend.store, self.backend.clock
        self.job_id = f"sm{next(self._ids):07d}"
        self.m: Model | None = None
        self.seen: dict[int, str] = {}  # item states at the last check
        self.bystander = f"{self.job_id}b"
        self.bystander_b3 = True  # b3 still holds its (expired) item
        self.followup: str | None = None  # the job that reused answers (reuse_answers)

    def w(self, name: str) -> str:
        """A worker's id in this example: workers outlive jobs in the store, so each example
        names its own."""
        return f"{self.job_id}{name}"

    # Creating --------------------------------------------------------------------------------
    @initialize(
        estimates=st.lists(estimates, min_size=2, max_size=MAX_ITEMS),
        concurrency=st.integers(1, 4),
        limit=limits,
        contents=st.lists(
            st.sampled_from(["a", "b", "", "é\x00z", "long " * 40]),
            min_size=MAX_ITEMS,
            max_size=MAX_ITEMS,
        ),
        running=st.integers(0, 4),
        kind=st.sampled_from(["jsonl", "directory"]),
        output=st.sampled_from([(512, None), (512, 40), (0, None), (100, 10**9)]),
        ttls=st.lists(TTLS, min_size=len(WORKERS), max_size=len(WORKERS)),
        rates=job_prices,
        cost_limit=limits,
    )
    def create(
        self,
        estimates,
        concurrency,
        limit,
        contents,
        running,
        kind,
        output,
        ttls,
        rates,
        cost_limit,
    ):
        max_tokens = None if limit is None else max(0, sum(estimates[: limit[0]]) + limit[1])
        price = list_price = None
        if rates is not None:
            price = {"input": rates[2], "output": rates[3], "cached_input": 0.0, "source": "t"}
            if rates[:2] != rates[2:]:
                list_price = {**price, "input": rates[0], "output": rates[1]}
        # --max-cost near what the first k items reserve (a nano-dollar or two either side)
        max_cost = None
        if rates is not None and cost_limit is not None:
            probe = Model(1, None, [], output[0], output[1], max_cost=0, rates=rates)
            k, slack = cost_limit
            max_cost = max(0, sum(probe.money(e, batch=False) for e in estimates[:k]) + slack)
        spec = JobSpec(
            job_id=self.job_id,
            instruction="do it",
            source="/nowhere",
            source_kind=kind,
            concurrency=concurrency,
            retries=2,
            max_tokens=max_tokens,
            provider_key="p:sm",
            output_tokens_estimate=output[0],
            max_output_tokens=output[1],
            price=price,
            list_price=list_price,
            max_cost=max_cost,
        )
        self.store.begin_job(spec)
        assert self.store.get_job(self.job_id) is None, "a job being created is invisible"
        # Answer keys of this example alone (no earlier job answers them): equal contents are
        # duplicates; the follow-up job (reuse_answers) asks for the same keys.
        items = [
            NewItem(
                index=i,
                name=f"line:{i + 1}",
                content=contents[i],
                content_hash=f"h:{contents[i]}",
                origin="x.jsonl",
                offset=i,
                stat_sig="1:1",
                estimated_tokens=e,
                answer_key=self.answer_key(contents[i]),
            )
            for i, e in enumerate(estimates)
        ]
        self.store.add_items(self.job_id, items)
        job = self.store.finish_job(self.job_id)
        asked = {c: e for c, e in reversed(list(zip(contents, estimates, strict=False)))}
        assert (job.state, job.total, job.estimated_tokens, job.worst_tokens) == (
            NOT_STARTED,
            len(items),
            sum(asked.values()),  # a duplicate is not asked: no estimate
            sum(asked.values()),  # its claims reserve its estimate (no worst_tokens apart)
        ), "the estimate of the first item of each content"
        firsts: dict[str, int] = {}
        model_items = []
        for i, e in enumerate(estimates):
            first = firsts.setdefault(contents[i], i)
            model_items.append(
                ModelItem(
                    e,
                    contents[i],
                    self.answer_key(contents[i]),
                    status=PENDING if first == i else WAITING,
                    dup_of=None if first == i else first,
                )
            )
        self.m = Model(
            concurrency,
            max_tokens,
            model_items,
            output[0],
            output[1],
            max_cost=max_cost,
            rates=rates or (0.0, 0.0, 0.0, 0.0),
        )
        self.seen = {i: it.status for i, it in enumerate(model_items)}
        if running:  # mostly: most of what is worth testing happens while the job runs
            self.move(RUNNING, (NOT_STARTED,), None, None)
        self._create_bystander()
        for n, name in enumerate(
            WORKERS
        ):  # live from the start, so their items are compared one by one
            self._beat(name, ttls[n], threads=n + 1, serves="http", host="h", pid=n)

    def answer_key(self, content: str) -> str:
        return f"{self.job_id}:{content}"

    def _create_bystander(self) -> None:
        """A second running job whose items workers b1, b2 (live) and b3 (lease run out) hold:
        operations across jobs (expiry, a dead worker, owners) must count it apart and leave
        b1's and b2's items alone."""
        spec = JobSpec(
            job_id=self.bystander,
            instruction="other",
            source="/elsewhere",
            source_kind="jsonl",
            concurrency=3,
            retries=2,
            provider_key="p:sm",
        )
        self.store.begin_job(spec)
        self.store.add_items(
            self.bystander,
            [NewItem(i, f"line:{i + 1}", "x", "h:x", "y.jsonl", i, "1:1", 5) for i in range(3)],
        )
        self.store.finish_job(self.bystander)
        self.store.set_state(self.bystander, RUNNING, from_states=[NOT_STARTED])
        for worker, lease in (("b1", FAR_S), ("b2", FAR_S), ("b3", -60.0)):
            assert isinstance(
                self.store.claim_item(self.bystander, 0, worker, lease_s=lease, max_running=9),
                Claim,
            )

    def teardown(self) -> None:
        if self.m is not None:
            for job_id in (self.job_id, self.bystander, self.followup):
                if job_id:
                    self.store.delete_job(job_id)
            for name in WORKERS:
                self.store.remove_worker(self.w(name))

    def _pick(self, aim: bool, pick: int, worker: str, index: int) -> tuple[str, int]:
        """(owner id, index): a running item and its owner, or a worker of this example and any
        index."""
        running = [(it.owner, i) for i, it in enumerate(self.m.items) if it.status == CLAIMED]
        return running[pick % len(running)] if aim and running else (self.w(worker), index)

    # Time ------------------------------------------------------------------------------------
    @precondition(has_job)
    @rule(
        seconds=ADVANCES, past=st.sampled_from([0, 1]), pick=st.integers(0, 20), edge=st.booleans()
    )
    def advance(self, seconds, past, pick, edge):
        """Time passes: leases, batch leases and heartbeats run out by the clock alone. Half the
        time it goes to an edge (advance_to_an_end), where a swarm of disabled rules would
        otherwise seldom take it."""
        if edge:
            self.advance_to_an_end(past, pick, ("lease", "batch", "ttl")[pick % 3])
        else:
            self.clock.advance(seconds)

    @precondition(has_job)
    @rule(
        past=st.sampled_from([0, 1]),
        pick=st.integers(0, 20),
        which=st.sampled_from(["lease", "batch", "ttl"]),
    )
    def advance_to_an_end(self, past, pick, which):
        """Time passes to exactly the end of an item's lease, a batch's lease or a heartbeat's
        ttl (past=0: still held, still live), or one millisecond past it: where >= and >
        differ. Then the reaper passes (a step of its own too), so each such edge is looked at
        where it is."""
        m, now = self.m, self.clock.ms
        ends = {
            "lease": {it.until for it in m.items if it.status == CLAIMED},
            "ttl": {w.until for w in m.workers.values()},
            "batch": {b.until for b in m.batches.values() if b.owner is not None},
        }[which]
        ends = sorted(e + past for e in ends if now < e + past < now + 10**7)
        if ends:
            self.clock.set_ms(ends[pick % len(ends)])
            # the reaper's pass right then (the check after it reads live workers)
            self.release_expired()

    # Job state -------------------------------------------------------------------------------
    @precondition(lambda self: self.m is not None and self.m.state != RUNNING)
    @rule(limit=limits, cost_limit=limits)
    def run_or_resume(self, limit, cost_limit):
        """Run, or resume (maybe with a new --max-tokens or --max-cost: around what is used, to
        meet the edge; --max-cost only where the job has a price)."""
        m = self.m
        max_tokens = None if limit is None else max(0, m.charged + m.reserved + limit[1] * 10)
        max_cost = None
        if cost_limit is not None and m.rates != (0.0, 0.0, 0.0, 0.0):
            max_cost = max(0, m.cost + m.cost_reserved + cost_limit[1] * 50_000)
        self.move(RUNNING, (NOT_STARTED, PAUSED), None, max_tokens, max_cost)

    @precondition(has_job)
    @rule(
        state=st.sampled_from([RUNNING, PAUSED]),
        froms=st.sets(st.sampled_from([NOT_STARTED, RUNNING, PAUSED])),
        pause_reason=st.sampled_from([None, PAUSE_USER, PAUSE_TOKEN_LIMIT, PAUSE_COST_LIMIT]),
    )
    def move_or_pause(self, state, froms, pause_reason):
        """A pause (or any move): set_state is a compare-and-set, from a state not listed
        nothing changes."""
        self.move(state, tuple(froms), pause_reason, None)

    def move(self, state, froms, pause_reason, max_tokens, max_cost=None):
        job = self.store.set_state(
            self.job_id,
            state,
            from_states=froms,
            pause_reason=pause_reason,
            max_tokens=max_tokens,
            max_cost=max_cost,
        )
        moved = self.m.set_state(state, froms, pause_reason, max_tokens, self.clock.ms, max_cost)
        assert (job is not None) == moved
        if moved:
            assert (job.state, job.pause_reason, job.spec.max_tokens, job.spec.max_cost) == (
                state,
                pause_reason,
                self.m.max_tokens,
                self.m.max_cost,
            )
            assert state != RUNNING or job.run_at is not None

    @precondition(has_job)
    @rule(picks=st.one_of(st.none(), st.sets(st.integers(0, MAX_ITEMS - 1), max_size=4)))
    def set_sample(self, picks):
        """run --sample: claims take only these items (any state; none: cleared), and the claim
        that finds none pending nor running pauses the job."""
        chosen = sorted(i for i in picks or () if i < len(self.m.items)) or None
        assert self.store.set_sample(self.job_id, chosen) is not self.m.deleted
        if not self.m.deleted:
            self.m.sample = None if chosen is None else tuple(chosen)

    @precondition(has_job)
    @rule(reason=st.sampled_from([INTERRUPTED_WORKER_STOP, INTERRUPTED_ORPHANED, None]))
    def mark_interrupted(self, reason):
        """Why a running job's workers stopped, or cleared; nothing unless it is running."""
        done = self.store.mark_interrupted(self.job_id, reason)
        ok = not self.m.deleted and self.m.state == RUNNING
        assert done == ok
        if ok:
            self.m.interrupted = None if reason is None else (reason, self.clock.ms)

    @precondition(has_job)
    @rule(
        concurrency=st.one_of(st.none(), st.integers(1, 4)),
        rpm=st.one_of(st.none(), st.integers(1, 600)),
        tpm=st.one_of(st.none(), st.integers(1, 10**6)),
    )
    def update_job(self, concurrency, rpm, tpm):
        """run/resume --concurrency/--rpm/--tpm: the next claim reads the new concurrency."""
        job = self.store.update_job(self.job_id, concurrency=concurrency, rpm=rpm, tpm=tpm)
        assert (job is None) == self.m.deleted
        if job is not None:
            m = self.m
            m.concurrency = m.concurrency if concurrency is None else concurrency
            m.rpm, m.tpm = (m.rpm if rpm is None else rpm), (m.tpm if tpm is None else tpm)
            assert (job.spec.concurrency, job.spec.rpm, job.spec.tpm) == (
                m.concurrency,
                m.rpm,
                m.tpm,
            )

    @precondition(lambda self: self.m is not None and not self.m.deleted)
    @rule(now=st.integers(0, 3))
    def delete_job(self, now):
        """delete_job while the job runs (one draw in four; one in two once it has batches):
        everything of it goes, its answers are no longer reused, and every later operation on
        it is refused or finds nothing."""
        if now > (1 if self.m.batches else 0):
            return
        answered = sorted(self.m.answers)
        assert self.store.delete_job(self.job_id)
        self.m.deleted = True
        self.m.answers.clear()
        assert (
            self.store.get_job(self.job_id) is None
            and list(self.store.iter_items(self.job_id)) == []
        )
        assert self.store.list_batches(self.job_id) == []
        assert not self.store.delete_job(self.job_id), "a job is deleted once"
        if answered:  # a job asking what it answered gets nothing from it now
            probe = f"{self.job_id}p"
            self.store.begin_job(
                JobSpec(
                    job_id=probe,
                    instruction="do it",
                    source="/nowhere",
                    source_kind="jsonl",
                    concurrency=1,
                    retries=2,
                    provider_key="p:sm",
                )
            )
            self.store.add_items(
                probe,
                [
                    NewItem(i, f"line:{i + 1}", "q", "h:q", "p.jsonl", i, "1:1", 1, answer_key=key)
                    for i, key in enumerate(answered)
                ],
            )
            job = self.store.finish_job(probe)
            self.store.delete_job(probe)
            assert (job.reused, job.completed) == (0, 0), "a deleted job's answers are not reused"

    # Items -----------------------------------------------------------------------------------
    @precondition(has_job)
    @rule(worker=workers, hint=indexes, max_running=st.integers(1, 5), lease=LEASES)
    def claim(self, worker, hint, max_running, lease):
        self._claim(worker, hint, max_running, lease)

    @precondition(has_job)
    @rule(worker=workers, hint=indexes, lease=LEASES)
    def claim_again(self, worker, hint, lease):
        """Claims twice as often as other steps, so jobs get busy."""
        self._claim(worker, hint, 1000, lease)

    def _claim(self, worker, hint, max_running, lease):
        got = self.store.claim_item(
            self.job_id, hint, self.w(worker), lease_s=lease, max_running=max_running
        )
        self._check_claim(got, self.w(worker), hint, max_running, lease)

    def _check_claim(self, got, worker, hint, max_running, lease):
        before = self.seen.get(hint)
        reason, index = self.m.claim(hint, worker, max_running, lease, self.clock.ms)
        if index is None:
            assert isinstance(got, ClaimRefused) and got.reason == reason, (got, reason)
            return
        assert isinstance(got, Claim), (got, reason)
        assert got.index == index and self.seen[index] == PENDING, "claims take only pending items"
        assert before != PENDING or got.index == hint or self.m.sample is not None, (
            "the hint is taken when it is pending (and no sample is set)"
        )
        it = self.m.items[index]
        assert (got.content, got.name, got.attempts, got.rate_limit_waits) == (
            it.content,
            f"line:{index + 1}",
            it.attempts,
            it.waits,
        )

    @precondition(has_job)
    @rule(
        worker=workers,
        usages=st.lists(usages(small_tokens), min_size=1, max_size=3),
    )
    def work(self, worker, usages):
        """A worker's steady state, a few items in a row: claim, complete with what the provider
        reported. Small outputs, so a job soon learns an allowance below the configured one,
        and its reservations take both sides of the reservation rule."""
        wid = self.w(worker)
        for usage in usages:
            got = self.store.claim_item(self.job_id, -1, wid, lease_s=30.0, max_running=1000)
            self._check_claim(got, wid, -1, 1000, 30.0)
            if not isinstance(got, Claim):
                return
            self.seen[got.index] = CLAIMED  # pending -> running -> completed, in one step
            assert self.store.complete_item(self.job_id, got.index, wid, "r", usage)
            self.m.complete(self.m.items[got.index], "r", usage, None, None)

    @precondition(busy)
    @rule(
        who=targets,
        result=texts,
        usage=usages(tokens),
        provider=st.one_of(st.none(), texts),
        model=st.one_of(st.none(), texts),
    )
    def complete(self, who, result, usage, provider, model):
        worker, index = self._pick(*who)
        done = self.store.complete_item(
            self.job_id, index, worker, result, usage, provider=provider, model=model
        )
        it = self.m.owned(index, worker)
        assert done == (it is not None)
        if it:
            self.m.complete(it, result, usage, provider, model)

    @precondition(busy)
    @rule(
        who=targets,
        result=texts,
        usage=usages(tokens),
        hint=indexes,
        max_running=st.integers(1, 5),
        lease=LEASES,
    )
    def complete_and_claim(self, who, result, usage, hint, max_running, lease):
        """complete, then (only when it completed) claim for the same worker, in one step."""
        worker, index = self._pick(*who)
        done, got = self.store.complete_and_claim(
            self.job_id,
            index,
            worker,
            result,
            usage,
            index_hint=hint,
            lease_s=lease,
            max_running=max_running,
        )
        it = self.m.owned(index, worker)
        assert done == (it is not None)
        if it is None:
            assert got is None, "a refused completion claims nothing"
            return
        self.m.complete(it, result, usage, None, None)
        self._check_claim(got, worker, hint, max_running, lease)

    @precondition(busy)
    @rule(who=targets, error=errors, transient=st.integers(0, 2), usage=unkept)
    def fail(self, who, error, transient, usage):
        """A permanent failure, or a transient one after its retries (attempts counted first);
        usage: what the provider billed for the answer that failed."""
        worker, index = self._pick(*who)
        for _ in range(transient):
            self._attempt(worker, index, error, rate_limited=False)
        done = self.store.fail_item(self.job_id, index, worker, error, usage=usage)
        it = self.m.owned(index, worker)
        assert done == (it is not None)
        if it:
            self.m.fail(it, error)
            self.m.charge_unkept(it, usage)

    @precondition(busy)
    @rule(who=targets, error=errors, rate_limited=st.booleans())
    def record_attempt(self, who, error, rate_limited):
        self._attempt(*self._pick(*who), error, rate_limited=rate_limited)

    def _attempt(self, worker, index, error, *, rate_limited):
        count = self.store.record_attempt(
            self.job_id, index, worker, error, rate_limited=rate_limited
        )
        it = self.m.owned(index, worker)
        if it is None:
            assert count == -1
            return
        if rate_limited:
            it.waits += 1
            assert count == it.waits
        else:
            it.attempts, it.waits = it.attempts + 1, 0
            assert count == it.attempts

    @precondition(busy)
    @rule(who=targets, error=errors, retries=st.integers(0, 2), usage=unkept)
    def settle_failed_attempt(self, who, error, retries, usage):
        """record_attempt (and charge what the provider billed), then fail past retries or
        release within them, in one step."""
        worker, index = self._pick(*who)
        count = self.store.settle_failed_attempt(
            self.job_id, index, worker, error, retries=retries, usage=usage
        )
        it = self.m.owned(index, worker)
        if it is None:
            assert count == -1
            return
        self.m.charge_unkept(it, usage)
        it.attempts, it.waits = it.attempts + 1, 0
        assert count == it.attempts
        if it.attempts > retries:
            self.m.fail(it, error)
        else:
            self.m.requeue(it)

    @precondition(busy)
    @rule(who=targets)
    def release(self, who):
        worker, index = self._pick(*who)
        done = self.store.release_item(self.job_id, index, worker)
        it = self.m.owned(index, worker)
        assert done == (it is not None)
        if it:
            self.m.requeue(it)

    # Leases ----------------------------------------------------------------------------------
    @precondition(busy)
    @rule(who=targets, picks=st.lists(indexes, max_size=2), lease=LEASES)
    def renew(self, who, picks, lease):
        """Renew the named items' leases to now + lease (an expired one too: not yet released)."""
        worker, index = self._pick(*who)
        picks = [index, *picks]
        n = self.store.renew_leases(worker, [(self.job_id, i) for i in picks], lease_s=lease)
        held = {i for i in picks if self.m.owned(i, worker)}
        assert n == sum(1 for i in picks if i in held), (
            "only the worker's own running items are renewed"
        )
        for i in held:
            self.m.items[i].until = self.clock.ms + round(lease * 1000)

    @precondition(has_job)
    @rule()
    def release_expired(self):
        got = self.store.release_expired_leases()
        due = (
            []
            if self.m.deleted
            else [it for it in self.m.items if it.status == CLAIMED and it.until < self.clock.ms]
        )
        for it in due:
            self.m.requeue(it)
        assert got.get(self.job_id, 0) == len(due), (got, due)
        assert got.get(self.bystander, 0) == int(self.bystander_b3), (
            "another job's expired item, counted apart"
        )
        assert set(got) <= {self.job_id, self.bystander}
        self.bystander_b3 = False

    @precondition(has_job)
    @rule(worker=workers)
    def worker_died(self, worker):
        got = self.store.release_worker_items(self.w(worker))
        held = [it for it in self.m.items if it.status == CLAIMED and it.owner == self.w(worker)]
        if self.m.deleted:
            held = []
        for it in held:
            self.m.requeue(it)
        assert got.get(self.job_id, 0) == len(held) and self.bystander not in got

    @precondition(lambda self: self.m is not None and self.m.count(FAILED) > 0)
    @rule()
    def retry_failed(self):
        n = self.store.retry_failed(self.job_id)
        failed = [] if self.m.deleted else [it for it in self.m.items if it.status == FAILED]
        for it in failed:
            it.status, it.attempts, it.waits, it.error = (
                PENDING if it.dup_of is None else WAITING,
                0,
                0,
                None,
            )
        assert n == len(failed)

    # Workers ---------------------------------------------------------------------------------
    @precondition(has_job)
    @rule(
        worker=workers,
        ttl=TTLS,
        threads=st.integers(1, 8),
        serves=st.sampled_from(["http", "hermes,http", ""]),
        host=st.sampled_from(["h", "other"]),
        pid=st.integers(0, 3),
    )
    def heartbeat(self, worker, ttl, threads, serves, host, pid):
        """A beat: live for ttl from now; the first beat of a worker fixes its host, pid and
        start."""
        self._beat(worker, ttl, threads=threads, serves=serves, host=host, pid=pid)

    def _beat(self, worker, ttl, *, threads, serves, host, pid):
        started = 1000.0 + WORKERS.index(worker) if worker in WORKERS else 999.0
        wid = self.w(worker)
        self.store.heartbeat_worker(
            WorkerInfo(wid, host, pid, started, 0.0, threads, serves), ttl_s=ttl
        )
        now = self.clock.ms
        known = self.m.workers.get(wid)
        first = (host, pid, started) if known is None else (known.host, known.pid, known.started_at)
        self.m.workers[wid] = ModelWorker(
            *first, beat=now, until=now + round(ttl * 1000), threads=threads, serves=serves
        )

    @precondition(has_job)
    @rule(worker=workers)
    def remove_worker(self, worker):
        """A clean shutdown: the worker is forgotten (its items stay until released or expired)."""
        self.store.remove_worker(self.w(worker))
        self.m.workers.pop(self.w(worker), None)

    # Provider batches: their items are running items owned by batch:<id>, so the owner-only
    # steps above (complete, fail, attempt, release, renew) reach them through _pick too.
    @precondition(has_job)
    @rule(
        worker=workers,
        max_items=st.integers(1, MAX_ITEMS),
        lease=LEASES,
        hold=st.sampled_from([30.0, FAR_S]),
        take_from=take_froms,
    )
    def open_batch(self, worker, max_items, lease, hold, take_from):
        batch_id = f"b{next(self._ids)}"
        preparing = self.m.preparing
        take = self._taken_from(take_from, None if preparing is None else self.m.batches[preparing])
        got = self.store.open_batch(
            self.job_id,
            self.w(worker),
            batch_id=batch_id,
            max_items=max_items,
            lease_s=lease,
            hold_s=hold,
            take_from=take,
        )
        reason, opened = self.m.open_batch(
            batch_id, self.w(worker), max_items, lease, hold, take, self.clock.ms
        )
        if opened is None:
            assert isinstance(got, ClaimRefused) and got.reason == reason, (got, reason)
            return
        assert isinstance(got, BatchRecord) and got.batch_id == opened, (got, reason)
        b = self.m.batches[opened]
        assert (got.items, got.lease_owner, round(got.lease_until * 1000)) == (
            b.items,
            b.owner,
            b.until,
        )

    def _taken_from(self, take_from: str | None, batch: ModelBatch | None) -> str | None:
        if take_from == "holder":
            return None if batch is None else batch.owner
        return self.w(take_from) if take_from in WORKERS else take_from

    def _batch_pick(self, pick: int) -> str | None:
        return sorted(self.m.batches)[pick % len(self.m.batches)] if self.m.batches else None

    @precondition(lambda self: self.m is not None and self.m.batches)
    @rule(pick=st.integers(0, 20), worker=batch_owners, lease=LEASES, take_from=take_froms)
    def lease_batch(self, pick, worker, lease, take_from):
        """Submit/poll/ingest take the batch's lease: free, expired, one's own, or taken from a dead
        worker."""
        batch_id = self._batch_pick(pick)
        wid = self.w(worker) if worker in WORKERS else worker
        take = self._taken_from(take_from, self.m.batches[batch_id])
        got = self.store.lease_batch(self.job_id, batch_id, wid, lease_s=lease, take_from=take)
        ok = self.m.lease_batch(batch_id, wid, lease, take, self.clock.ms)
        assert (got is not None) == ok, (got, self.m.batches[batch_id], self.clock.ms)
        if ok:
            b = self.m.batches[batch_id]
            assert (got.lease_owner, round(got.lease_until * 1000)) == (b.owner, b.until)

    @precondition(lambda self: self.m is not None and self.m.batches)
    @rule(
        pick=st.integers(0, 20),
        worker=batch_owners,
        status=st.sampled_from(["in_progress", BATCH_DONE]),
    )
    def update_batch(self, pick, worker, status):
        """Only the lease holder records the provider's batch; done ends the lease."""
        batch_id = self._batch_pick(pick)
        wid = self.w(worker) if worker in WORKERS else worker
        got = self.store.update_batch(
            self.job_id, batch_id, wid, provider_id="p-" + batch_id, status=status
        )
        b = self.m.batches[batch_id]
        ok = not self.m.deleted and b.owner == wid
        assert (got is not None) == ok, (got, b)
        if ok:
            b.status = status
            if status == BATCH_DONE:
                b.owner, b.until = None, 0
            assert (got.status, got.lease_owner) == (b.status, b.owner)

    @precondition(lambda self: self.m is not None and self.m.batches)
    @rule(pick=st.integers(0, 20))
    def release_batch(self, pick):
        batch_id = self._batch_pick(pick)
        n = self.store.release_batch_items(self.job_id, batch_id)
        held = (
            []
            if self.m.deleted
            else [
                it
                for it in self.m.items
                if it.status == CLAIMED and it.owner == BATCH_OWNER_PREFIX + batch_id
            ]
        )
        for it in held:
            self.m.requeue(it)
        assert n == len(held)

    # Events and reads ------------------------------------------------------------------------
    @precondition(has_job)
    @rule(
        events=st.lists(
            st.builds(
                Event,
                kind=st.sampled_from(["note", "skipped", "item_failed"]),
                message=texts,
                item_index=st.one_of(st.none(), st.integers(0, MAX_ITEMS - 1)),
                error_type=st.one_of(st.none(), st.just("TransientError")),
                http_status=st.one_of(st.none(), st.integers(400, 599)),
                at=st.sampled_from([0.0, 1000.5]),
            ),
            min_size=1,
            max_size=3,
        )
    )
    def add_events(self, events):
        """Events are appended in order, as given, at the backend's now when their time is 0; the
        job's newest events and each item's end with them."""
        self.store.add_events(self.job_id, events)
        if self.m.deleted:
            return
        now = self.clock()
        want = [replace(e, at=e.at or now) for e in events]
        assert self.store.list_events(self.job_id, limit=len(want)) == want
        for index in {e.item_index for e in events if e.item_index is not None}:
            mine = [e for e in want if e.item_index == index]
            assert self.store.list_events(self.job_id, limit=len(mine), item=index) == mine

    @precondition(has_job)
    @rule(pick=st.integers(0, MAX_ITEMS))
    def read_one_item(self, pick):
        """get_item, find_item, item_names and next_item_estimate agree with the model."""
        m = self.m
        index = pick % len(m.items)
        got = self.store.get_item(self.job_id, index)
        if m.deleted:
            assert got is None and self.store.find_item(self.job_id, f"line:{index + 1}") is None
            assert self.store.next_item_estimate(self.job_id) is None
            return
        it = m.items[index]
        record = next(r for r in self.store.iter_items(self.job_id) if r.index == index)
        assert got.item == record and got.content_hash == f"h:{it.content}"
        if it.status != COMPLETED:
            assert got.content == it.content, "an item not completed keeps its content"
        assert self.store.find_item(self.job_id, f"line:{index + 1}") == index
        assert self.store.find_item(self.job_id, "line:0") is None
        assert self.store.item_names(self.job_id, [index, len(m.items)]) == {
            index: f"line:{index + 1}"
        }
        assert self.store.get_item(self.job_id, len(m.items)) is None
        pending = [it.estimate for it in m.items if it.status == PENDING]
        assert self.store.next_item_estimate(self.job_id) == (pending[0] if pending else None)

    # Reuse -----------------------------------------------------------------------------------
    @precondition(lambda self: self.m is not None and self.followup is None)
    @rule(
        contents=st.lists(
            st.sampled_from(["a", "b", "", "é\x00z", "long " * 40, "new"]), min_size=1, max_size=4
        ),
        reuse=st.sampled_from([True, True, False]),
        kind=st.sampled_from(["jsonl", "directory"]),
    )
    def reuse_answers(self, contents, reuse, kind):
        """A later job asks the same questions: an answer the first job completed (and still
        has: not deleted) is reused at create, completed with that answer and nothing charged;
        with reuse off (--fresh), nothing is."""
        self.followup = f"{self.job_id}f"
        spec = JobSpec(
            job_id=self.followup,
            instruction="do it",
            source="/nowhere",
            source_kind=kind,
            concurrency=1,
            retries=2,
            provider_key="p:sm",
            reuse=reuse,
        )
        self.store.begin_job(spec)
        self.store.add_items(
            self.followup,
            [
                NewItem(
                    i,
                    f"line:{i + 1}",
                    c,
                    f"h:{c}",
                    "z.jsonl",
                    i,
                    "1:1",
                    7,
                    answer_key=self.answer_key(c),
                )
                for i, c in enumerate(contents)
            ],
        )
        job = self.store.finish_job(self.followup)
        records = list(self.store.iter_items(self.followup, with_content=True))
        firsts: dict[str, int] = {}
        want = []
        for i, c in enumerate(contents):
            found = self.m.answers.get(self.answer_key(c)) if reuse else None
            if found is not None:
                index, charged, cost = found
                want.append(
                    (
                        COMPLETED,
                        self.m.items[index].result,
                        (self.job_id, index),
                        (charged, cost),
                        None if kind == "directory" else c,
                    )
                )
                continue
            first = firsts.setdefault(c, i)
            want.append((PENDING if first == i else WAITING, None, None, (0, 0), c))
        got = [(r.status, r.result, r.reused_from, r.content) for r in records]
        assert got == [(s, res, frm, content) for s, res, frm, _, content in want], (got, want)
        reused = [w for w in want if w[0] == COMPLETED]
        assert (
            job.total,
            job.completed,
            job.pending,
            job.reused,
            job.tokens_saved,
            job.saved_nusd,
            job.tokens_charged,
            job.cost_nusd,
            job.estimated_tokens,
        ) == (
            len(contents),
            len(reused),
            len(contents) - len(reused),
            len(reused),
            sum(w[3][0] for w in reused),
            sum(w[3][1] for w in reused),
            0,
            0,
            7 * sum(w[0] == PENDING for w in want),  # reused items and duplicates ask nothing
        )

    # After every step ------------------------------------------------------------------------
    @invariant()
    def backend_and_model_agree(self):
        if self.m is None:
            return
        m, now = self.m, self.clock.ms
        self._check_workers()
        if m.deleted:
            assert self.store.get_job(self.job_id) is None
            assert (
                list(self.store.iter_items(self.job_id)) == []
                and self.store.list_batches(self.job_id) == []
            )
            assert (
                self.job_id not in self.store.active_job_ids()
                and self.job_id not in self.store.batch_job_ids()
            )
            assert set(self.store.find_job_ids(self.job_id)) == {
                self.bystander,
                *([self.followup] if self.followup else []),
            }
            self._check_bystander()
            return
        job = self.store.get_job(self.job_id)
        counts = (job.pending, job.running, job.completed, job.failed)
        # Waiting duplicates count as pending.
        assert counts == (
            m.count(PENDING) + m.count(WAITING),
            *(m.count(s) for s in (CLAIMED, COMPLETED, FAILED)),
        ), (counts, m)
        assert job.total == sum(counts) == len(m.items)
        assert (job.state, job.pause_reason, job.spec.max_tokens) == (
            m.state,
            m.pause_reason,
            m.max_tokens,
        )
        assert (job.spec.concurrency, job.spec.rpm, job.spec.tpm) == (m.concurrency, m.rpm, m.tpm)
        assert (job.interrupted, ms(job.interrupted_at)) == (m.interrupted or (None, None))
        assert job.sample == m.sample
        assert (ms(job.run_at), ms(job.last_claim_at)) == (m.run_at, m.last_claim_at)
        assert job.tokens_reserved == m.reserved, (job.tokens_reserved, m.reserved)
        assert (job.cost_reserved, job.spec.max_cost) == (m.cost_reserved, m.max_cost)
        assert job.running or job.tokens_reserved == job.cost_reserved == 0, (
            "reservations return to zero when nothing runs"
        )
        assert (job.tokens_charged, job.tokens_in, job.tokens_out) == (
            m.charged,
            m.tokens_in,
            m.tokens_out,
        )
        assert (job.tokens_cached, job.tokens_written, job.cost_nusd, job.list_nusd) == (
            m.tokens_cached,
            m.tokens_written,
            m.cost,
            m.list_cost,
        )
        assert (job.tokens_unkept, job.cost_unkept) == (m.tokens_unkept, m.cost_unkept)
        if m.state == RUNNING:
            assert self.job_id in self.store.active_job_ids()
        if any(b.status != BATCH_DONE for b in m.batches.values()):
            assert self.job_id in self.store.batch_job_ids(), "a job with an open batch is listed"
        jobs = {self.job_id, self.bystander, *([self.followup] if self.followup else [])}
        assert set(self.store.find_job_ids(self.job_id)) == jobs
        assert {j.job_id for j in self.store.list_jobs(limit=50)} >= jobs
        records = list(self.store.iter_items(self.job_id))
        assert [r.index for r in records] == list(range(len(m.items)))
        for r, it in zip(records, m.items, strict=True):
            self._check_item(r, it)
        # failed_items reads the failed ones alone (a partial index, the failed set): the same
        # records
        assert self.store.failed_items(self.job_id, len(m.items) + 1) == [
            r for r in records if r.status == FAILED
        ]
        # Batches: each one's state and lease, and the items it holds, one by one.
        batches = {b.batch_id: b for b in self.store.list_batches(self.job_id)}
        assert set(batches) == set(m.batches)
        for batch_id, b in m.batches.items():
            got = batches[batch_id]
            assert (got.status, got.items, got.lease_owner) == (b.status, b.items, b.owner), (
                got,
                b,
            )
            assert b.owner is None or round(got.lease_until * 1000) == b.until
            held = [
                i
                for i, it in enumerate(m.items)
                if it.status == CLAIMED and it.owner == BATCH_OWNER_PREFIX + batch_id
            ]
            assert [x.index for x in self.store.iter_batch_items(self.job_id, batch_id)] == held
        self._check_bystander()
        assert now == self.clock.ms

    def _check_bystander(self) -> None:
        others = {"b1": 1, "b2": 1, **({"b3": 1} if self.bystander_b3 else {})}
        assert self.store.item_owners() == {**self.m.owners(), **others}, (
            "at most one owner per item, the right one"
        )
        other = self.store.get_job(self.bystander)
        held = len(others)
        assert (other.pending, other.running, other.tokens_reserved) == (3 - held, held, 5 * held)

    def _check_workers(self) -> None:
        """live_workers: the live ones by the clock (a beat within its ttl), each with the very
        items it holds, job by job and index by index (per item, not a count)."""
        now = self.clock.ms
        mine = {
            w.worker_id: w for w in self.store.live_workers() if w.worker_id.startswith(self.job_id)
        }
        live = self.m.live(now)
        assert set(mine) == set(live), (sorted(mine), sorted(live), now)
        for wid, info in live.items():
            got = mine[wid]
            held = (
                []
                if self.m.deleted
                else [
                    (self.job_id, i)
                    for i, it in enumerate(self.m.items)
                    if it.status == CLAIMED and it.owner == wid
                ]
            )
            assert (
                got.host,
                got.pid,
                got.started_at,
                ms(got.heartbeat_at),
                got.threads,
                got.serves,
            ) == (info.host, info.pid, info.started_at, info.beat, info.threads, info.serves), (
                got,
                info,
            )
            assert got.holding == held, (wid, got.holding, held)
        bare = {
            w.worker_id: w.holding
            for w in self.store.live_workers(holding=False)
            if w.worker_id.startswith(self.job_id)
        }
        assert bare == {wid: [] for wid in live}, "holding=False: the registry alone"

    def _check_item(self, r, it: ModelItem) -> None:
        assert (self.seen[r.index], r.status) in ITEM_MOVES or self.seen[r.index] == r.status, (
            f"item {r.index}: {self.seen[r.index]} -> {r.status} is not in the state table"
        )
        self.seen[r.index] = r.status
        assert (r.status, r.attempts) == (it.status, it.attempts), (r, it)
        assert (r.tokens_in, r.tokens_out, r.cost_nusd) == (it.tokens_in, it.tokens_out, it.cost)
        if it.status == COMPLETED:
            got = (r.result, r.tokens_in, r.tokens_out, r.provider, r.model)
            assert got == (it.result, it.tokens_in, it.tokens_out, it.provider, it.model), (r, it)
            assert self.m.frozen.setdefault(r.index, got) == got, "a completed item never changes"
        else:
            assert r.result is None
        if it.status == FAILED:
            e = it.error
            assert (r.error_type, r.http_status, r.error_message) == (
                e.error_type,
                e.http_status,
                e.message,
            )
        elif it.status in (PENDING, WAITING):
            assert (r.error_type, r.http_status, r.error_message) == (None, None, None), r


def ms(seconds: float | None) -> int | None:
    """A time the store gave, in the clock's whole milliseconds."""
    return None if seconds is None else round(seconds * 1000)


@pytest.fixture(params=["sqlite", "redis"])
def clocked(request, tmp_path):
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    backend = clocked_backend(request.param, tmp_path, url)
    yield backend
    backend.close()


def test_the_store_behaves_like_its_model(clocked):
    machine = type("Machine", (StoreMachine,), {"backend": clocked})
    run_state_machine_as_test(machine, settings=STATESTEP)
