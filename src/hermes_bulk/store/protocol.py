"""What a backend does: the job store and the shared limiter, and which steps each takes.

This module is the only place that says what a backend must do; `store/sqlite/` and
`store/redis/` implement it, and `tests/contract/` holds both to it. Each method's
docstring is its contract, and says what is one step and what is several:

- "One step on both backends": one `BEGIN IMMEDIATE` transaction on SQLite, one Lua script or
  one MULTI/EXEC on Redis. Other workers see it whole or not at all, and a process that dies
  in it leaves nothing (SQLite rolls the transaction back; Redis runs a script whole and drops
  a MULTI whose EXEC never arrived).
- Otherwise the steps are named, with what a process that dies between them leaves and what
  repairs it. Every such state is one the invariants allow (DESIGN.md: counts add up, no
  item lost, no job out of reach), and the repair is the next call or the reaper's next pass;
  tests/contract/test_store_atomicity.py interrupts each operation there.

Reading one value is atomic; methods that read several (noted) are not snapshots. N workers
on M machines behave like one. Times are seconds since the epoch, read from the backend's own
clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

# The records the contract speaks of are their own module (store/records.py).
from .records import (  # noqa: F401  (named here too: callers import the contract and its records from one place)
    AWAITING_RECOVERY,
    BATCH_DONE,
    BATCH_FIELDS,
    BATCH_OWNER_PREFIX,
    BATCH_PREPARING,
    CLAIMED,
    COMPLETED,
    CREATING,
    DROPS_CONTENT,
    FAILED,
    IN_FLIGHT,
    INTERRUPTED_ORPHANED,
    INTERRUPTED_WORKER_STOP,
    LEARN_AFTER,
    MAX_COST_USD,
    MAX_USAGE_TOKENS,
    NOT_STARTED,
    PAUSE_COST_LIMIT,
    PAUSE_SAMPLE,
    PAUSE_TOKEN_LIMIT,
    PAUSE_USER,
    PAUSED,
    PENDING,
    RUNNING,
    SAMPLE_DONE,
    WAITING,
    BatchItem,
    BatchRecord,
    Claim,
    ClaimRefused,
    Event,
    ItemDetail,
    ItemError,
    ItemRecord,
    JobRecord,
    JobSpec,
    NewItem,
    PauseState,
    Turn,
    Usage,
    WorkerInfo,
    claim_cost,
    cost_limit_reached,
    cost_rates,
    drops_content,
    reserved_cost,
    sample_done,
    spec_from_json,
    spread,
    usd_text,
    worst_case_nusd,
)


class JobStore(Protocol):
    """Jobs, items, events and workers. The source of truth; the queue only carries triggers."""

    # Creating ------------------------------------------------------------------------------
    def begin_job(self, spec: JobSpec) -> None:
        """Record a job in state `creating` (invisible to list_jobs and recent lookups).

        One step on both backends (on Redis, the index entries and the job's keys are one
        MULTI/EXEC). Creating a job is several calls: begin_job, add_items, finish_job. A
        process that dies before finish_job leaves the job `creating`: invisible to every
        reader and never run, its items stored until delete_job(job_id) removes them (the
        creating process deletes it on any error it survives; nothing sweeps after a kill).
        """

    def add_items(self, job_id: str, items: Iterable[NewItem]) -> None:
        """Append items (contents deduplicated by hash within the job) to a `creating` job.

        Reuse (reuse.py): an item whose answer_key is in the store's answer index, when the job's
        spec.reuse is set, is added completed with that answer (reused_from, tokens_saved; nothing
        charged). Otherwise an item whose answer_key an earlier item of this job has is added
        WAITING on that item (complete_item and fail_item settle it). Items with answer_key ""
        are plain pending items. A reused item's content is not stored where the job's source
        kind is in DROPS_CONTENT (as complete_item drops it): every other item stores its own,
        so a pending or waiting item with the same content still has it.

        SQLite: one step per call. Redis: one script per ADD_BATCH_ITEMS items (or 8 MiB of
        contents); a process that dies between two leaves the first batches added, and the job
        `creating` (see begin_job).
        """

    def finish_job(self, job_id: str) -> JobRecord:
        """Move a `creating` job to `not_started` with its totals; it now shows in list_jobs.

        One step on both backends (then a read of the job)."""

    def delete_job(self, job_id: str) -> bool:
        """Remove a job and everything it owns (items, contents, events, its entries in the
        answer index: its answers are no longer reused). False if unknown.

        One step on both backends (on Redis, the job's keys and its index entries are one
        MULTI/EXEC, so no index entry outlives its job and no job outlives its entries)."""

    # Reading -------------------------------------------------------------------------------
    def get_job(self, job_id: str) -> JobRecord | None:
        """The job, or None if unknown or still being created."""

    def find_job_ids(self, prefix: str) -> list[str]:
        """Ids of finished-creating jobs that start with prefix (at most a few)."""

    def list_jobs(self, limit: int = 20) -> list[JobRecord]:
        """The most recently created jobs, newest first."""

    def active_job_ids(self) -> list[str]:
        """Jobs in state running: what a worker's maintenance loop looks after."""

    def answered(self, keys: list[str]) -> set[str]:
        """The answer keys among `keys` that the answer index holds: an item with one would be
        completed with that answer at create (when its job reuses). Reads only (create
        --dry-run)."""

    def iter_items(
        self, job_id: str, batch: int = 1000, *, with_content: bool = False
    ) -> Iterator[ItemRecord]:
        """Every item in index order, with results; streams in batches (memory stays flat).
        with_content: each record also holds the content the item was given (export
        --with-input)."""

    def list_events(self, job_id: str, limit: int = 100, *, item: int | None = None) -> list[Event]:
        """The newest events of a job, oldest first; with `item`, of that item (by index) only
        (on Redis, among the job's kept events)."""

    def get_item(self, job_id: str, index: int) -> ItemDetail | None:
        """One item by index, with its result and content; None if the job or index is unknown."""

    def find_item(self, job_id: str, name: str) -> int | None:
        """The index of the item named exactly name (the lowest, if several), or None. Reads the
        job's items one by one where the backend has no index on names (memory stays flat)."""

    def failed_items(self, job_id: str, limit: int) -> list[ItemRecord]:
        """The first `limit` failed items in index order, with their errors; reads only failed
        items (SQLite: a partial index on them; Redis: the job's failed set), never the job's
        others, so a million-item job with a few failures answers at once."""

    def item_names(self, job_id: str, indexes: Iterable[int]) -> dict[int, str]:
        """The names of these items (unknown indexes are left out): one read for a page of
        events."""

    # Job state -----------------------------------------------------------------------------
    def set_state(
        self,
        job_id: str,
        state: str,
        *,
        from_states: Iterable[str],
        pause_reason: str | None = None,
        max_tokens: int | None = None,
        max_cost: int | None = None,
        event: Event | None = None,
    ) -> JobRecord | None:
        """Move the job to `state` if it is in one of from_states (and set max_tokens, and
        max_cost in nano-USD, where given).

        Moving to RUNNING records run_at = now and clears `interrupted` (someone ran it).
        Returns the updated job, or None when the job was not in from_states (nothing changed).

        The move is one step on both backends. On Redis a move to RUNNING takes a second
        round trip: the move lists the job in the active-jobs index (in its MULTI/EXEC, at
        score 0 if it was not listed), then the job's new run epoch is written as its score.
        A process that dies between them leaves the job running and listed at its old score,
        where reaper passes keep it (a running job is never pruned). Only a prune the reaper
        decided while the job was idle, arriving in that moment, can drop it; then workers no
        longer look after the job, and running it again (`run` accepts a running job) lists
        it at its new epoch.
        """

    def mark_interrupted(
        self, job_id: str, reason: str | None, *, event: Event | None = None
    ) -> bool:
        """Record why a running job's workers stopped (an INTERRUPTED_* reason, at now), or clear
        it (None), and add the event if given. False (nothing changed) unless the job is running.

        One step on both backends."""

    def update_job(
        self,
        job_id: str,
        *,
        concurrency: int | None = None,
        rpm: int | None = None,
        tpm: int | None = None,
    ) -> JobRecord | None:
        """Set the job's concurrency, rpm and tpm where given (None leaves a field as it is).

        One step on both backends (SQLite: one transaction; Redis: one script). Every claim
        after it reads the new values, on every machine. Returns the updated job, or None when
        there is no such job (nothing changed).
        """

    def retry_failed(self, job_id: str) -> int:
        """Return every failed item to pending, clearing errors and attempt counts; the count.

        A failed duplicate goes back to WAITING on its item (which is asked again, once).

        SQLite: one step. Redis: one script per RETRY_BATCH_ITEMS failed items, so one call
        never holds Redis for a million items. A process that dies between two leaves some
        items pending and the rest failed, each batch whole (the counts add up); calling
        retry_failed again moves the rest.
        """

    # Items: the atomic life of one item ---------------------------------------------------
    def claim_item(
        self, job_id: str, index_hint: int, worker_id: str, *, lease_s: float, max_running: int
    ) -> Claim | ClaimRefused:
        """Atomically give one pending item of a running job to worker_id until now + lease_s.

        Prefers item index_hint when it is pending, else the lowest pending index. Refuses, with
        the first reason that applies, when the job is not running (not_running), when
        min(the job's concurrency, max_running) items are already running (at_capacity;
        max_running is the worker's max_concurrency setting, so lowering that setting also
        applies to existing jobs), or when no item is pending (no_pending).
        The item's worst case (its stored estimate: NewItem.claim_tokens) is reserved for as
        long as it runs. When the job has max_tokens and charged + reserved + that would exceed
        it, nothing is claimed: if
        charged + estimate alone fits, the refusal is tokens_in_flight (the job stays running;
        the caller tries again once reservations settle, for what the items really used);
        otherwise the job is paused with reason PAUSE_TOKEN_LIMIT and the refusal is
        token_limit. So charged + reserved never exceeds max_tokens through a claim.
        --max-cost (JobSpec.max_cost, nano-USD) is the same rule in money, checked after the
        tokens: the claim reserves records.claim_cost of the item's reservation at the live
        price (records.cost_rates), held while it runs and returned as the token reservation
        is; the item's reported cost (Usage.cost_nusd) is what is spent. It waits
        (cost_in_flight) while cost + cost_reserved + that would exceed the limit and cost +
        that alone would not; otherwise it pauses the job (PAUSE_COST_LIMIT, cost_limit). A
        token pause comes first. Without a limit nothing is reserved in money.

        One step on both backends (SQLite reads the item's content after the transaction:
        contents never change, and a job deleted in between answers no_job).
        """

    def sample_pending(self, job_id: str, n: int) -> list[int]:
        """n of the job's pending items (not the duplicates waiting on one), spread over them in
        index order by records.spread: the first, the last and evenly between. A read."""

    def set_sample(self, job_id: str, indexes: list[int] | None) -> bool:
        """`run --sample N`: from now on claims take only these items, lowest index first, and
        once none is pending or running the claim that finds so pauses the job (PAUSE_SAMPLE,
        event sample_done) and clears the sample (ClaimRefused "sample_done"); None clears it.
        False when there is no such job. One step on both backends."""

    def next_item_estimate(self, job_id: str) -> int | None:
        """The estimate of the lowest-index pending item (what a trigger without a hint claims
        next), or None when no item is pending. A read: resume uses it to refuse a limit the
        next item would not fit under. Two reads on Redis: a claim in between may make it
        stale, which the claim's own check covers."""

    def renew_leases(
        self, worker_id: str, items: Iterable[tuple[str, int]], *, lease_s: float
    ) -> int:
        """Extend to now + lease_s the leases of these (job id, index) items that worker_id holds.

        Only items the worker is still working on are named, so an item it owns but lost track
        of (a claim whose reply never arrived, a completion the backend did not take) expires
        and returns to the queue instead of staying owned for as long as the worker lives.
        Returns how many leases were extended.

        SQLite: one step. Redis: one script per job, all in one pipeline; a process that dies
        while sending it leaves some leases not extended, which expire and return their items
        to the queue (at-least-once: what a dead worker's leases do anyway).
        """

    def complete_item(
        self,
        job_id: str,
        index: int,
        worker_id: str,
        result: str,
        usage: Usage,
        *,
        provider: str | None = None,
        model: str | None = None,
    ) -> bool:
        """Save the result and mark the item completed, releasing its reservation.

        Only the current owner of a running item may complete it; a completed item is never
        completed again and its result never overwritten (returns False, changes nothing).
        Reported usage is charged; without it the estimate is charged. The item's tokens and
        cost are added to what its earlier attempts were billed. An empty provider or
        model is recorded as None. In the same step: the item's WAITING duplicates complete with
        the same result (nothing charged), and its answer key points the answer index at it.
        One step on both backends.

        A completed item's captured content is dropped in the same step when the job's source
        kind is in DROPS_CONTENT and no other item of the job still needs it (its answer key
        is set: items with the same content are its duplicates, completed with it, or were
        reused at create and never stored it: add_items); its content_hash stays. Failed items
        keep theirs (retry).
        """

    def complete_and_claim(
        self,
        job_id: str,
        index: int,
        worker_id: str,
        result: str,
        usage: Usage,
        *,
        provider: str | None = None,
        model: str | None = None,
        index_hint: int,
        lease_s: float,
        max_running: int,
        take_turn: str | None = None,
    ) -> tuple[bool, Claim | ClaimRefused | None]:
        """complete_item, then, when it completed, claim_item of the same job for the same worker
        (index_hint, lease_s, max_running as there), in one step: a worker thread's steady state
        is one write per item. Returns (completed, claim): (False, None) when the completion
        was refused (nothing changed, nothing claimed), else (True, the Claim or ClaimRefused
        that claim_item would have returned right after the completion).

        One step on both backends (one transaction; one script), with what each of the two
        guarantees, and the claim's content read after it as claim_item reads it.

        take_turn: a provider key whose requests are unpaced (no rpm, no tpm): a backend where
        SharedLimits.acquire is a round trip of its own (Redis) takes the claimed item's turn in
        the same step, as acquire(key, rpm=None, tpm=None, tokens=0) would right after it, and
        returns it as Claim.turn. SQLite leaves Claim.turn None: its unpaced acquire is a read
        of the same file, no round trip to save.
        """

    def fail_item(
        self,
        job_id: str,
        index: int,
        worker_id: str,
        error: ItemError,
        *,
        usage: Usage | None = None,
    ) -> bool:
        """Mark the owner's running item failed with the error, and record an item_failed event.

        Its WAITING duplicates fail with the same error in the same step. usage: what the
        provider billed for the answer that failed: charged as an answer not kept, in the same
        step (settle_failed_attempt says how).

        One step on both backends."""

    def release_item(self, job_id: str, index: int, worker_id: str) -> bool:
        """Return the owner's running item to pending (nothing charged), e.g. on shutdown.

        One step on both backends."""

    def record_attempt(
        self, job_id: str, index: int, worker_id: str, error: ItemError, *, rate_limited: bool
    ) -> int:
        """Count a failed attempt of the owner's item and record it as an event.

        rate_limited: counts a consecutive 429 (does not use up retries); otherwise a transient
        failure. Returns the new count of that kind, or -1 if worker_id does not own the item.
        One step on both backends.
        """

    def settle_failed_attempt(
        self,
        job_id: str,
        index: int,
        worker_id: str,
        error: ItemError,
        *,
        retries: int,
        usage: Usage | None = None,
    ) -> int:
        """A transient failure of the owner's item, settled: record_attempt (not rate limited),
        then, when the new count is over retries, fail_item with the error, else release_item
        (back to pending). Returns the new count, or -1 if worker_id does not own the item
        (nothing changed). usage: what the provider billed for the attempt (an answer not
        kept), charged as fail_item charges it, whichever way the item settles.

        Charging an answer not kept: the job's tokens_charged and tokens_unkept grow by its
        tokens in and out, its cost_nusd and cost_unkept by usage.cost_nusd, its list_nusd by
        usage.list_nusd; the item's tokens_in, tokens_out and cost_nusd grow by the same (an
        item's figures are what it was billed across its attempts; complete_item adds its kept
        answer's). The job's tokens_in and tokens_out stay the kept answers' (the learned
        allowance reads them). A usage that reports nothing is not charged.

        One step on both backends (one transaction; one script): a process that dies in it
        leaves the attempt counted and the item settled, or neither, so an attempt is never
        counted twice for one failure (a provider batch's line ingested again after a kill).
        """

    def release_expired_leases(self) -> dict[str, int]:
        """Return every running item whose lease has expired to pending; counts by job id.

        SQLite: one step. Redis: one script per job of the active-jobs index, all in one
        pipeline, then a second pipeline that prunes idle jobs from the index. A process that
        dies while sending the first leaves some jobs released, each whole (the counts add up),
        and the rest for the next pass; one that dies before the prune leaves index entries of
        idle jobs, which the next pass prunes (an entry too many costs a script call, never an
        item).
        """

    def release_worker_items(self, worker_id: str) -> dict[str, int]:
        """Return every item worker_id holds to pending (the worker is known dead); counts by job.

        SQLite: one step. Redis: one script per job, in one pipeline; a process that dies
        while sending it leaves some jobs released, each whole, and the rest to the next call
        (every worker's maintenance makes it) or to their leases' expiry.
        """

    def item_owners(self) -> dict[str, int]:
        """Every worker id that holds running items, with how many it holds (on Redis, read
        job by job: not a snapshot)."""

    def add_events(self, job_id: str, events: Iterable[Event]) -> None:
        """Append events to a job's history. One step on both backends."""

    # Provider batches (docs/decisions.md "Provider batches") ---------------------------------
    def open_batch(
        self,
        job_id: str,
        worker_id: str,
        *,
        batch_id: str,
        max_items: int,
        lease_s: float,
        hold_s: float,
        take_from: str | None = None,
    ) -> BatchRecord | ClaimRefused:
        """Start a batch of a running job, or take over the one being prepared, leased to worker_id.

        A job has at most one batch in state preparing. When it has one whose lease is held by
        another worker and not expired, the refusal is batch_preparing, unless that worker is
        take_from (one the caller found dead: fleet/liveness.py), whose lease is taken at once. When
        its lease has expired or is take_from's (its worker died between taking the items and
        recording the provider's batch), it is leased to worker_id and returned as it is: the caller
        looks for it at the provider by its metadata before submitting anything. Otherwise up to
        max_items pending items, lowest index first, become running items owned by
        "batch:<batch_id>" until now + hold_s, each with its reservation (JobRecord.reservation), as
        claim_item's; the new batch (status preparing, lease until now + lease_s) is returned.
        --max-tokens and --max-cost: items are taken while each limit fits them (their cost at
        the batch price); when not even the first fits, the refusal and the pause are
        claim_item's (tokens_in_flight or cost_in_flight, or token_limit or cost_limit and the
        job paused). Refusals otherwise: no_job, not_running, no_pending.
        Concurrency does not apply (a batch is not calls at once). One step on both backends."""

    def lease_batch(
        self,
        job_id: str,
        batch_id: str,
        worker_id: str,
        *,
        lease_s: float,
        take_from: str | None = None,
    ) -> BatchRecord | None:
        """Lease an open batch to worker_id until now + lease_s if its lease is free, expired,
        already worker_id's (a renewal) or held by take_from (a worker the caller found dead:
        its lease is taken without waiting for it to expire); None otherwise (another worker has
        it, or it is done or unknown). Submitting, polling and ingesting a batch are each done
        under it. One step: the holder is compared and replaced together, so a lease renewed or
        taken by anyone else in between is left alone."""

    def update_batch(
        self, job_id: str, batch_id: str, worker_id: str, **changes
    ) -> BatchRecord | None:
        """Set fields of BATCH_FIELDS on a batch whose lease worker_id holds; None (nothing
        changed) when it does not. Status BATCH_DONE also ends the lease. One step."""

    def list_batches(self, job_id: str) -> list[BatchRecord]:
        """Every batch of the job, oldest first (a read)."""

    def batch_job_ids(self) -> list[str]:
        """Jobs that have an open batch (any run state: a paused job's batches are cancelled and
        ingested). On Redis a superset, pruned when a job's last batch is done."""

    def iter_batch_items(self, job_id: str, batch_id: str, page: int = 500) -> Iterator[BatchItem]:
        """The items the batch holds, in index order, with their contents; streams by page."""

    def release_batch_items(self, job_id: str, batch_id: str) -> int:
        """Return every item the batch still holds to pending (nothing charged); the count.
        One step on both backends."""

    # Workers -------------------------------------------------------------------------------
    def heartbeat_worker(self, info: WorkerInfo, *, ttl_s: float) -> None:
        """Register or refresh a live worker; it counts as live for ttl_s from now. One step on
        both backends."""

    def remove_worker(self, worker_id: str) -> None:
        """Forget a worker (clean shutdown). One step on both backends."""

    def live_workers(self, *, holding: bool = True) -> list[WorkerInfo]:
        """Workers whose last heartbeat is within their ttl, with the items they hold (several
        reads: not a snapshot). holding=False: without the items (`holding` left empty), one
        read of the registry: what liveness asks every maintenance pass, while batches may
        hold a whole job's items."""

    def now(self) -> float:
        """The backend's clock (leases are compared against it)."""

    def fingerprint_salt(self, create: bool = True) -> str | None:
        """The store's salt of credential fingerprints with its scrypt parameters
        (credentials.new_salt_record): made by the first caller (None instead when not
        `create`), the same for every process after. One step on both backends."""

    def close(self) -> None:
        """Release connections."""


class SharedLimits(Protocol):
    """Per provider key: the shared 429 wait and request/token pacing (store/limits_math.py)."""

    def acquire(self, key: str, *, rpm: int | None, tpm: int | None, tokens: int) -> Turn:
        """Take one request (and `tokens` tokens) if the key is not paused and pacing allows.

        Pacing spaces requests at the slower of rpm and the adaptive rate learned from 429s.
        Returns Turn(wait=0.0, epoch) when taken, else the seconds to wait before asking again
        (nothing taken). Pass the epoch to pause() if this request is answered 429.

        Redis: one step (one script per call). SQLite with rpm or tpm, or while the key waits
        or is adaptively paced: one step. SQLite unpaced (no rpm, no tpm, no wait, no adaptive
        pacing): a read of the key's shared state, without the write lock, decides; the grant
        only has to be counted in the key's one-second window (what the rate halved at a 429
        is measured from), and each process adds its grants to that shared count at most every
        COUNT_EVERY_S (0.1 s), in one transaction, and before any pause() it makes. What is
        shared is the wait, the pacing and the count; what is per process is the count not yet
        added. A process that dies loses only that: at most 0.1 s of its own grants missing
        from the window, so a 429 within the next second or two measures a slightly lower
        rate. A pause() by another process is seen by the next read; a grant read just before
        it goes through, as one taken just before it would. Redis does not batch: every
        acquire is one round trip whether it writes or not, so batching would save nothing
        there.
        """

    def pause(
        self, key: str, *, seconds: float | None, base_s: float, cap_s: float, epoch: int
    ) -> float:
        """A 429: start or extend (never shorten) the shared wait of key; returns its end time.

        A provider's Retry-After is passed as seconds. A 429 to a request granted at the key's
        current epoch (after its last decrease: the first 429 of its generation) halves the
        key's request rate (adaptive pacing), which then doubles back every few seconds after
        the wait, and grows the backoff step. With seconds=None the wait is then
        base_s * 2**step (capped at cap_s, before the step grows). A 429 to a request sent
        before the last decrease slows nothing and grows nothing: without seconds it waits
        base_s * 2**(step-1), the wait its generation already chose (base_s at step 0).
        epoch=-1, which no grant carries, is such a request: with seconds, the wait alone (a
        provider's headers said nothing is left: pacing.ProviderGate.hold). One step on both
        backends.
        """

    def clear_backoff(self, key: str) -> None:
        """A request succeeded: the next wait without Retry-After starts from base_s again.

        One step on both backends (skipped when this process's last acquire saw no backoff
        step and it has seen no 429 since; a 429 elsewhere is cleared by a later success)."""

    def pause_state(self, key: str) -> PauseState | None:
        """The current wait of key, or None when it is not waiting."""
