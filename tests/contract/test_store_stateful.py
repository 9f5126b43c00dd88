"""The store protocol against a pure-Python model of it, by random sequences of operations.

The SQL (store/sqlite/) and the Lua (store/redis/lua/) are two copies of one state machine;
this test keeps them one. `Model` is written from store/protocol.py's docstrings, not from
either backend: Hypothesis drives a real backend and the model through the same random steps
(create, run, claim, complete, complete-and-claim, fail, attempts, a failed attempt settled,
release, lease expiry, pause,
resume, retry, token limits, duplicates that wait on the first item with their answer key; over
a JSONL source, whose contents are kept, or a folder, whose completed contents are dropped) and after every step compares counts, tokens, reservations, every item and who
owns what.

Lease expiry without waiting: a backend compares leases against its own clock (Redis TIME on
Redis), so a step "expires" an item by renewing its lease to end in the past
(renew_leases(..., lease_s=-60)), the state a lease is in once its time has passed. Claims take
an hour-long lease, so nothing else expires during an example.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from hermes_bulk import broker
from hermes_bulk.store.protocol import (
    BATCH_OWNER_PREFIX,
    CLAIMED,
    COMPLETED,
    FAILED,
    MAX_USAGE_TOKENS,
    NOT_STARTED,
    PAUSE_TOKEN_LIMIT,
    PAUSE_USER,
    PAUSED,
    PENDING,
    RUNNING,
    WAITING,
    BatchRecord,
    Claim,
    ClaimRefused,
    ItemError,
    JobSpec,
    NewItem,
    Usage,
)

WORKERS = ("w1", "w2", "w3")
MAX_ITEMS = 6
LEASE_S = 3600.0  # nothing expires by itself during an example
EXPIRED_S = -60.0  # a lease renewed to this has run out (see the module docstring)

# Which item states may follow which: claim, complete/fail/release/expiry, retry. Completed
# is final (DESIGN.md invariant 2).
ITEM_MOVES = {
    (PENDING, CLAIMED),
    (CLAIMED, COMPLETED), (CLAIMED, FAILED), (CLAIMED, PENDING),
    (FAILED, PENDING),
    # A duplicate takes its item's answer or failure, and waits on it again after retry.
    (WAITING, COMPLETED), (WAITING, FAILED), (FAILED, WAITING),
}

STATESTEP = settings(max_examples=200, stateful_step_count=25, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


# The reservation rule ----------------------------------------------------------------------
# The one place the model says what a claim does about --max-tokens (protocol.py,
# JobStore.claim_item): the next item waits while reservations in flight may still settle
# below the limit, and the job pauses only when what is charged plus the next item would not fit.
CLAIM, WAIT, PAUSE = "claim", "wait", "pause"
WAIT_REASON = "tokens_in_flight"


def token_rule(max_tokens: int | None, charged: int, reserved: int, estimate: int) -> str:
    """What a claim of an item with this estimate does: CLAIM it, WAIT (refuse, the job keeps
    running), or PAUSE the job with PAUSE_TOKEN_LIMIT (refuse)."""
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
    status: str = PENDING
    owner: str | None = None
    expired: bool = False
    reserved: int = 0
    attempts: int = 0
    waits: int = 0
    result: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    error: ItemError | None = None
    provider: str | None = None
    model: str | None = None
    dup_of: int | None = None  # the first item of the job with the same answer key


@dataclass
class Model:
    concurrency: int
    max_tokens: int | None
    items: list[ModelItem]
    state: str = NOT_STARTED
    pause_reason: str | None = None
    charged: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    frozen: dict[int, tuple] = field(default_factory=dict)  # completed items, as first seen
    preparing: tuple[str, str] | None = None  # (batch id, its lease holder): the batch being prepared
    batches: dict[str, int] = field(default_factory=dict)  # batch id -> items it was opened with

    def count(self, status: str) -> int:
        return sum(it.status == status for it in self.items)

    @property
    def reserved(self) -> int:
        return sum(it.reserved for it in self.items if it.status == CLAIMED)

    def owned(self, index: int, worker: str) -> ModelItem | None:
        """The item if worker holds it running (what every owner-only operation requires)."""
        if 0 <= index < len(self.items):
            it = self.items[index]
            if it.status == CLAIMED and it.owner == worker:
                return it
        return None

    def set_state(self, state: str, from_states: tuple[str, ...], pause_reason: str | None,
                  max_tokens: int | None) -> bool:
        if self.state not in from_states:
            return False
        self.state, self.pause_reason = state, pause_reason
        if max_tokens is not None:
            self.max_tokens = max_tokens
        return True

    def claim(self, hint: int, worker: str, max_running: int) -> tuple[str, int | None]:
        """(reason, None) when refused, else ("ok", index); the model moves as the store must."""
        if self.state != RUNNING:
            return "not_running", None
        if self.count(CLAIMED) >= min(self.concurrency, max_running):
            return "at_capacity", None
        pending = [i for i, it in enumerate(self.items) if it.status == PENDING]
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
        it.status, it.owner, it.expired, it.reserved = CLAIMED, worker, False, need
        return "ok", index

    def open_batch(self, batch_id: str, worker: str, max_items: int) -> tuple[str, str | None]:
        """protocol.open_batch: (reason, None) when refused, else ("ok", the batch id returned)."""
        if self.state != RUNNING:
            return "not_running", None
        if self.preparing is not None:
            if self.preparing[1] != worker:
                return "batch_preparing", None
            return "ok", self.preparing[0]  # its own lease: the same batch again
        pending = [it for it in self.items if it.status == PENDING][:max_items]
        if not pending:
            return "no_pending", None
        taken, reserved = [], self.reserved
        for it in pending:
            need = self.reservation(it.estimate)
            verdict = token_rule(self.max_tokens, self.charged, reserved, need)
            if verdict != CLAIM:
                if taken:
                    break
                if verdict == PAUSE:
                    self.state, self.pause_reason = PAUSED, PAUSE_TOKEN_LIMIT
                    return "token_limit", None
                return WAIT_REASON, None
            taken.append((it, need))
            reserved += need
        for it, need in taken:
            it.status, it.owner, it.expired, it.reserved = CLAIMED, BATCH_OWNER_PREFIX + batch_id, False, need
        self.preparing, self.batches[batch_id] = (batch_id, worker), len(taken)
        return "ok", batch_id

    def duplicates(self, index: int) -> list[ModelItem]:
        return [it for it in self.items if it.dup_of == index and it.status == WAITING]

    def reservation(self, estimate: int) -> int:
        """The learned output allowance: after 3 completed items that reported output, twice their
        mean output replaces the configured 512 in the estimate, reserving at least the smaller of
        the two."""
        completed = self.count(COMPLETED)
        if completed < 3 or self.tokens_out <= 0:
            return estimate
        learned = -(-2 * self.tokens_out // completed)
        return max(estimate + learned - 512, min(learned, estimate))

    def requeue(self, it: ModelItem) -> None:
        it.status, it.owner, it.expired, it.reserved = PENDING, None, False, 0

    def complete(self, it: ModelItem, result: str, usage: Usage, provider, model) -> None:
        self.charged += (usage.tokens_in or 0) + (usage.tokens_out or 0) if usage.reported else it.reserved
        self.tokens_in += usage.tokens_in or 0
        self.tokens_out += usage.tokens_out or 0
        it.status, it.owner, it.expired, it.reserved = COMPLETED, None, False, 0
        it.result, it.tokens_in, it.tokens_out = result, usage.tokens_in or 0, usage.tokens_out or 0
        it.provider, it.model, it.waits = provider or None, model or None, 0  # "" is none
        for d in self.duplicates(self.items.index(it)):  # the same answer, nothing charged
            d.status, d.result, d.tokens_in, d.tokens_out = COMPLETED, result, 0, 0
            d.provider, d.model = provider or None, model or None

    def owners(self) -> dict[str, int]:
        return dict(Counter(it.owner for it in self.items if it.status == CLAIMED))


# Strategies ----------------------------------------------------------------------------------

texts = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
tokens = st.one_of(st.none(), st.integers(0, 5000), st.just(MAX_USAGE_TOKENS))
errors = st.builds(ItemError, error_type=st.sampled_from(["PermanentError", "TransientError", "RateLimitError"]),
                   message=texts, http_status=st.one_of(st.none(), st.integers(400, 599)))
workers = st.sampled_from(WORKERS)
# --max-tokens, or None: drawn near sums of estimates (k items, plus a slack of -2..2), so the
# limit is often met exactly, where "would exceed" and "would reach" differ.
# Two in three jobs have no limit, so most examples get far enough to complete items.
limits = st.one_of(st.none(), st.none(), st.tuples(st.integers(1, MAX_ITEMS), st.integers(-2, 2)))
indexes = st.integers(-1, MAX_ITEMS)  # -1 and past the end: no such item
# An owner-only step names a running item and its owner (aim, 2 in 3; pick chooses which), or any
# worker and index: mostly not the owner, which must change nothing.
targets = st.tuples(st.sampled_from([True, True, False]), st.integers(0, MAX_ITEMS), workers, indexes)


def busy(machine) -> bool:
    """Owner-only steps run while some item runs (else nearly every one would be a no-op);
    one in three still names a stranger (see `targets`)."""
    return machine.m is not None and machine.m.count(CLAIMED) > 0


class StoreMachine(RuleBasedStateMachine):
    store = None  # set by the test (one backend per test function, a fresh job per example)
    _ids = itertools.count()

    def __init__(self) -> None:
        super().__init__()
        self.job_id = f"sm{next(self._ids):07d}"
        self.m: Model | None = None
        self.seen: dict[int, str] = {}  # item states at the last check
        self.bystander = f"{self.job_id}b"
        self.bystander_b3 = True  # b3 still holds its (expired) item

    # Creating --------------------------------------------------------------------------------
    @initialize(estimates=st.lists(st.integers(0, 60), min_size=2, max_size=MAX_ITEMS),
                concurrency=st.integers(1, 4),
                limit=limits,
                contents=st.lists(st.sampled_from(["a", "b", "", "é\x00z", "long " * 40]), min_size=MAX_ITEMS,
                                  max_size=MAX_ITEMS),
                running=st.integers(0, 4), kind=st.sampled_from(["jsonl", "directory"]))
    def create(self, estimates, concurrency, limit, contents, running, kind):
        max_tokens = None if limit is None else max(0, sum(estimates[:limit[0]]) + limit[1])
        spec = JobSpec(job_id=self.job_id, instruction="do it", source="/nowhere", source_kind=kind,
                       concurrency=concurrency, retries=2, max_tokens=max_tokens, provider_key="p:sm")
        self.store.begin_job(spec)
        assert self.store.get_job(self.job_id) is None, "a job being created is invisible"
        # Answer keys of this job alone (no earlier job answers them): equal contents are duplicates.
        items = [NewItem(index=i, name=f"line:{i + 1}", content=contents[i], content_hash=f"h:{contents[i]}",
                         origin="x.jsonl", offset=i, stat_sig="1:1", estimated_tokens=e,
                         answer_key=f"{self.job_id}:{contents[i]}")
                 for i, e in enumerate(estimates)]
        self.store.add_items(self.job_id, items)
        job = self.store.finish_job(self.job_id)
        assert (job.state, job.total, job.estimated_tokens) == (NOT_STARTED, len(items), sum(estimates))
        firsts: dict[str, int] = {}
        model_items = []
        for i, e in enumerate(estimates):
            first = firsts.setdefault(contents[i], i)
            model_items.append(ModelItem(e, contents[i], status=PENDING if first == i else WAITING,
                                         dup_of=None if first == i else first))
        self.m = Model(concurrency, max_tokens, model_items)
        self.seen = {i: it.status for i, it in enumerate(model_items)}
        if running:  # mostly: most of what is worth testing happens while the job runs
            self.move(RUNNING, (NOT_STARTED,), None, None)
        self._create_bystander()

    def _create_bystander(self) -> None:
        """A second running job whose items workers b1, b2 (live) and b3 (lease run out) hold:
        operations across jobs (expiry, a dead worker, owners) must count it apart and leave
        b1's and b2's items alone."""
        spec = JobSpec(job_id=self.bystander, instruction="other", source="/elsewhere", source_kind="jsonl",
                       concurrency=3, retries=2, provider_key="p:sm")
        self.store.begin_job(spec)
        self.store.add_items(self.bystander, [NewItem(i, f"line:{i + 1}", "x", "h:x", "y.jsonl", i, "1:1", 5)
                                              for i in range(3)])
        self.store.finish_job(self.bystander)
        self.store.set_state(self.bystander, RUNNING, from_states=[NOT_STARTED])
        for worker, lease in (("b1", LEASE_S), ("b2", LEASE_S), ("b3", EXPIRED_S)):
            assert isinstance(self.store.claim_item(self.bystander, 0, worker, lease_s=lease, max_running=9), Claim)

    def teardown(self) -> None:
        if self.m is not None:
            self.store.delete_job(self.job_id)
            self.store.delete_job(self.bystander)

    def _pick(self, aim: bool, pick: int, worker: str, index: int) -> tuple[str, int]:
        running = [(it.owner, i) for i, it in enumerate(self.m.items) if it.status == CLAIMED]
        return running[pick % len(running)] if aim and running else (worker, index)

    # Job state -------------------------------------------------------------------------------
    @precondition(lambda self: self.m is not None and self.m.state != RUNNING)
    @rule(limit=limits)
    def run_or_resume(self, limit):
        """Run, or resume (maybe with a new --max-tokens: around what is used, to meet the edge)."""
        max_tokens = None if limit is None else max(0, self.m.charged + self.m.reserved + limit[1] * 10)
        self.move(RUNNING, (NOT_STARTED, PAUSED), None, max_tokens)

    @rule(state=st.sampled_from([RUNNING, PAUSED]), froms=st.sets(st.sampled_from([NOT_STARTED, RUNNING, PAUSED])),
          pause_reason=st.sampled_from([None, PAUSE_USER, PAUSE_TOKEN_LIMIT]))
    def move_or_pause(self, state, froms, pause_reason):
        """A pause (or any move): set_state is a compare-and-set, from a state not listed
        nothing changes."""
        self.move(state, tuple(froms), pause_reason, None)

    def move(self, state, froms, pause_reason, max_tokens):
        job = self.store.set_state(self.job_id, state, from_states=froms, pause_reason=pause_reason,
                                   max_tokens=max_tokens)
        moved = self.m.set_state(state, froms, pause_reason, max_tokens)
        assert (job is not None) == moved
        if moved:
            assert (job.state, job.pause_reason, job.spec.max_tokens) == (state, pause_reason, self.m.max_tokens)
            assert state != RUNNING or job.run_at is not None

    # Items -----------------------------------------------------------------------------------
    @rule(worker=workers, hint=indexes, max_running=st.integers(1, 5))
    def claim(self, worker, hint, max_running):
        self._claim(worker, hint, max_running)

    @rule(worker=workers, hint=indexes)
    def claim_again(self, worker, hint):
        """Claims twice as often as other steps, so jobs get busy."""
        self._claim(worker, hint, 1000)

    def _claim(self, worker, hint, max_running):
        got = self.store.claim_item(self.job_id, hint, worker, lease_s=LEASE_S, max_running=max_running)
        self._check_claim(got, worker, hint, max_running)

    def _check_claim(self, got, worker, hint, max_running):
        before = self.seen.get(hint)
        reason, index = self.m.claim(hint, worker, max_running)
        if index is None:
            assert isinstance(got, ClaimRefused) and got.reason == reason, (got, reason)
            return
        assert isinstance(got, Claim), (got, reason)
        assert got.index == index and self.seen[index] == PENDING, "claims take only pending items"
        assert before != PENDING or got.index == hint, "the hint is taken when it is pending"
        it = self.m.items[index]
        assert (got.content, got.name, got.attempts, got.rate_limit_waits) == \
            (it.content, f"line:{index + 1}", it.attempts, it.waits)

    @precondition(busy)
    @rule(who=targets, result=texts, usage=st.builds(Usage, tokens, tokens),
          provider=st.one_of(st.none(), texts), model=st.one_of(st.none(), texts))
    def complete(self, who, result, usage, provider, model):
        worker, index = self._pick(*who)
        done = self.store.complete_item(self.job_id, index, worker, result, usage, provider=provider, model=model)
        it = self.m.owned(index, worker)
        assert done == (it is not None)
        if it:
            self.m.complete(it, result, usage, provider, model)

    @precondition(busy)
    @rule(who=targets, result=texts, usage=st.builds(Usage, tokens, tokens), hint=indexes,
          max_running=st.integers(1, 5))
    def complete_and_claim(self, who, result, usage, hint, max_running):
        """complete, then (only when it completed) claim for the same worker, in one step."""
        worker, index = self._pick(*who)
        done, got = self.store.complete_and_claim(self.job_id, index, worker, result, usage, index_hint=hint,
                                                  lease_s=LEASE_S, max_running=max_running)
        it = self.m.owned(index, worker)
        assert done == (it is not None)
        if it is None:
            assert got is None, "a refused completion claims nothing"
            return
        self.m.complete(it, result, usage, None, None)
        self._check_claim(got, worker, hint, max_running)

    @precondition(busy)
    @rule(who=targets, error=errors, transient=st.integers(0, 2))
    def fail(self, who, error, transient):
        """A permanent failure, or a transient one after its retries (attempts counted first)."""
        worker, index = self._pick(*who)
        for _ in range(transient):
            self._attempt(worker, index, error, rate_limited=False)
        done = self.store.fail_item(self.job_id, index, worker, error)
        it = self.m.owned(index, worker)
        assert done == (it is not None)
        if it:
            it.status, it.owner, it.expired, it.reserved, it.error = FAILED, None, False, 0, error
            for d in self.m.duplicates(index):
                d.status, d.error = FAILED, error

    @precondition(busy)
    @rule(who=targets, error=errors, rate_limited=st.booleans())
    def record_attempt(self, who, error, rate_limited):
        self._attempt(*self._pick(*who), error, rate_limited=rate_limited)

    def _attempt(self, worker, index, error, *, rate_limited):
        count = self.store.record_attempt(self.job_id, index, worker, error, rate_limited=rate_limited)
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
    @rule(who=targets, error=errors, retries=st.integers(0, 2))
    def settle_failed_attempt(self, who, error, retries):
        """record_attempt, then fail past retries or release within them, in one step."""
        worker, index = self._pick(*who)
        count = self.store.settle_failed_attempt(self.job_id, index, worker, error, retries=retries)
        it = self.m.owned(index, worker)
        if it is None:
            assert count == -1
            return
        it.attempts, it.waits = it.attempts + 1, 0
        assert count == it.attempts
        if it.attempts > retries:
            it.status, it.owner, it.expired, it.reserved, it.error = FAILED, None, False, 0, error
            for d in self.m.duplicates(index):
                d.status, d.error = FAILED, error
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
    @rule(who=targets, picks=st.lists(indexes, max_size=2), expire=st.booleans())
    def renew(self, who, picks, expire):
        """Renew the named items' leases; expire=True makes them end in the past (expiry)."""
        worker, index = self._pick(*who)
        picks = [index, *picks]
        n = self.store.renew_leases(worker, [(self.job_id, i) for i in picks],
                                    lease_s=EXPIRED_S if expire else LEASE_S)
        held = {i for i in picks if self.m.owned(i, worker)}
        assert n == sum(1 for i in picks if i in held), "only the worker's own running items are renewed"
        for i in held:
            self.m.items[i].expired = expire

    @rule()
    def release_expired(self):
        got = self.store.release_expired_leases()
        due = [it for it in self.m.items if it.status == CLAIMED and it.expired]
        for it in due:
            self.m.requeue(it)
        assert got.get(self.job_id, 0) == len(due)
        assert got.get(self.bystander, 0) == int(self.bystander_b3), "another job's expired item, counted apart"
        assert set(got) <= {self.job_id, self.bystander}
        self.bystander_b3 = False

    @rule(worker=workers)
    def worker_died(self, worker):
        got = self.store.release_worker_items(worker)
        held = [it for it in self.m.items if it.status == CLAIMED and it.owner == worker]
        for it in held:
            self.m.requeue(it)
        assert got.get(self.job_id, 0) == len(held) and self.bystander not in got

    @precondition(lambda self: self.m is not None and self.m.count(FAILED) > 0)
    @rule()
    def retry_failed(self):
        n = self.store.retry_failed(self.job_id)
        failed = [it for it in self.m.items if it.status == FAILED]
        for it in failed:
            it.status, it.attempts, it.waits, it.error = PENDING if it.dup_of is None else WAITING, 0, 0, None
        assert n == len(failed)

    # Provider batches: their items are running items owned by batch:<id>, so the owner-only
    # steps above (complete, fail, attempt, release, renew) reach them through _pick too.
    @rule(worker=workers, max_items=st.integers(1, MAX_ITEMS))
    def open_batch(self, worker, max_items):
        batch_id = f"b{next(self._ids)}"
        got = self.store.open_batch(self.job_id, worker, batch_id=batch_id, max_items=max_items, lease_s=LEASE_S,
                                    hold_s=LEASE_S)
        reason, opened = self.m.open_batch(batch_id, worker, max_items)
        if opened is None:
            assert isinstance(got, ClaimRefused) and got.reason == reason, (got, reason)
            return
        assert isinstance(got, BatchRecord) and got.batch_id == opened, (got, reason)
        assert got.items == self.m.batches[opened] and got.lease_owner == worker

    @precondition(lambda self: self.m is not None and self.m.preparing is not None)
    @rule(worker=workers)
    def submit_batch(self, worker):
        batch_id, holder = self.m.preparing
        got = self.store.update_batch(self.job_id, batch_id, worker, provider_id="p-" + batch_id,
                                      status="in_progress")
        assert (got is not None) == (worker == holder), "only the lease holder records the batch"
        if got is not None:
            self.m.preparing = None

    @precondition(lambda self: self.m is not None and self.m.batches)
    @rule(pick=st.integers(0, 20))
    def release_batch(self, pick):
        batch_id = sorted(self.m.batches)[pick % len(self.m.batches)]
        n = self.store.release_batch_items(self.job_id, batch_id)
        held = [it for it in self.m.items if it.status == CLAIMED and it.owner == BATCH_OWNER_PREFIX + batch_id]
        for it in held:
            self.m.requeue(it)
        assert n == len(held)

    # After every step ------------------------------------------------------------------------
    @invariant()
    def backend_and_model_agree(self):
        if self.m is None:
            return
        m, job = self.m, self.store.get_job(self.job_id)
        counts = (job.pending, job.running, job.completed, job.failed)
        # Waiting duplicates count as pending.
        assert counts == (m.count(PENDING) + m.count(WAITING), *(m.count(s) for s in (CLAIMED, COMPLETED, FAILED))), \
            (counts, m)
        assert job.total == sum(counts) == len(m.items)
        assert (job.state, job.pause_reason, job.spec.max_tokens) == (m.state, m.pause_reason, m.max_tokens)
        assert job.tokens_reserved == m.reserved, (job.tokens_reserved, m.reserved)
        assert job.running or job.tokens_reserved == 0, "reservations return to zero when nothing runs"
        assert (job.tokens_charged, job.tokens_in, job.tokens_out) == (m.charged, m.tokens_in, m.tokens_out)
        records = list(self.store.iter_items(self.job_id))
        assert [r.index for r in records] == list(range(len(m.items)))
        for r, it in zip(records, m.items, strict=True):
            self._check_item(r, it)
        # failed_items reads the failed ones alone (a partial index, the failed set): the same records
        assert self.store.failed_items(self.job_id, len(m.items) + 1) == [r for r in records if r.status == FAILED]
        others = {"b1": 1, "b2": 1, **({"b3": 1} if self.bystander_b3 else {})}
        assert self.store.item_owners() == {**m.owners(), **others}, "at most one owner per item, the right one"
        other = self.store.get_job(self.bystander)
        held = len(others)
        assert (other.pending, other.running, other.tokens_reserved) == (3 - held, held, 5 * held)

    def _check_item(self, r, it: ModelItem) -> None:
        assert (self.seen[r.index], r.status) in ITEM_MOVES or self.seen[r.index] == r.status, \
            f"item {r.index}: {self.seen[r.index]} -> {r.status} is not in the state table"
        self.seen[r.index] = r.status
        assert (r.status, r.attempts) == (it.status, it.attempts), (r, it)
        if it.status == COMPLETED:
            got = (r.result, r.tokens_in, r.tokens_out, r.provider, r.model)
            assert got == (it.result, it.tokens_in, it.tokens_out, it.provider, it.model), (r, it)
            assert self.m.frozen.setdefault(r.index, got) == got, "a completed item never changes"
        else:
            assert r.result is None
        if it.status == FAILED:
            e = it.error
            assert (r.error_type, r.http_status, r.error_message) == (e.error_type, e.http_status, e.message)
        elif it.status in (PENDING, WAITING):
            assert (r.error_type, r.http_status, r.error_message) == (None, None, None), r


@pytest.fixture(params=["sqlite", "redis"])
def stateful_store(request, tmp_path):
    url = f"sqlite:///{tmp_path / 'bulk.db'}" if request.param == "sqlite" else request.getfixturevalue("redis_url")
    backend = broker._build(url)
    yield backend.store
    backend.close()


def test_the_store_behaves_like_its_model(stateful_store):
    machine = type("Machine", (StoreMachine,), {"store": stateful_store})
    run_state_machine_as_test(machine, settings=STATESTEP)
