"""The Redis key schema: every key name, and what each key holds.

P is the URL's `prefix=` (default `hermes-bulk`); times are float ms since the epoch.

One job's keys share the hash tag {P:job:ID}, so each job's script touches one cluster slot:

    {P:job:ID}:meta      HASH  spec (JSON), state, pause_reason, max_tokens, concurrency,
                               output_tokens_estimate, max_output_tokens (claims read these, not
                               the spec), drop_content ("1": contents go at completion), the
                               counters of JobRecord, created_at_ms, last_claim_at_ms,
                               run_at_ms, run_epoch, max_index, added (items added: finish_job's
                               total), skipped_events, interrupted, interrupted_at_ms (why its
                               workers stopped), names and "n:<id>"/"n=<name>" (the provider and
                               model names states refer to by number)
    {P:job:ID}:<family>:<B> HASH  an item's records, in buckets: item i is field i of bucket
                               B = i // BUCKET_ITEMS (128) of each family below. A bucket
                               holds at most 128 fields of values under 64 bytes, so Redis
                               keeps it as a listpack (a few bytes a field, where a hash of a
                               field per item, a hashtable, costs 60-90); a longer value (a
                               long name, an error message) turns only its bucket into a
                               hashtable. The families (ITEM_FAMILIES):
        items:<B>    "<estimate>\t<content field>" (codec.content_field: a "b2:" hash as a NUL
                     byte and its 16 bytes), written once (scripts read both)
        names:<B>    the item's name, written once
        sources:<B>  JSON [origin, offset, stat_sig]: what processing needs; goes when the
                     item completes (never processed again), never written for one that
                     completed at create
        states:<B>   JSON of the item's changing fields under one- and two-letter names
                     (status, attempts, reservations, tokens, cost, error, provider, model,
                     reused from, waits on): their legend is item_state.py; counts of 0 left
                     out; absent means a fresh pending item
        results:<B>  the result text (compressed as contents are)
        keys:<B>     the item's answer key as its 16 bytes (codec.answer_field), for the
                     first item of each key (delete_job finds the job's answers by it)
    {P:job:ID}:contents  HASH  content field (as in items:<B>) -> text (store/compression.py: a
                               zstd frame, or the text itself): identical contents are stored
                               once per job; where drop_content, an item's content goes when
                               it completes
    {P:job:ID}:pending   ZSET  pending indexes scored by index: claiming the lowest is O(log n)
    {P:job:ID}:leases    ZSET  running indexes scored by lease expiry
    {P:job:ID}:owners    HASH  running index -> worker id (at most the job's concurrency)
    {P:job:ID}:failed    ZSET  failed indexes scored by index (retry_failed)
    {P:job:ID}:events    LIST  "<at_ms>\\t<JSON [kind, message, index, error_type,
                               http_status]>"; only the newest EVENTS_KEPT are kept
    {P:job:ID}:keys      HASH  "k:<answer key>" -> index of the job's first item with that key
                               (until it completes: only create reads it)
    {P:job:ID}:dups      ZSET  duplicates waiting on an earlier item: member the duplicate's
                               index, score the index of the item it waits on
    {P:job:ID}:batches   HASH  batch id -> JSON BatchRecord (provider batches; not one of the
                               twelve keys every job script takes: the batch scripts name it)
    {P:job:ID}:items, :states, :results  layout 1's per-item hashes (one for the whole job):
                               still among the twelve keys a job script takes, so that
                               migrate_layout.lua can read them and delete_job remove them;
                               nothing writes them

Across jobs:

    P:jobs:created           ZSET  job id scored by created_at_ms (list_jobs)
    P:jobs:ids               ZSET  job id, score 0 (find_job_ids: a lexicographic range)
    P:answers                HASH  answer key (its 16 bytes) -> "<job id>\\t<index>\\t<tokens>": the
                                   completed item that answered it (reuse; the job's keys
                                   buckets say which entries a deleted job takes with it)
    P:layout                 STRING LAYOUT ("2"): the layout of the per-item records; a store
                                   that opens a Redis without it moves every job of layout 1
                                   (one hash per family for a whole job, hashes in hex) first
                                   (layout.py)
    P:wait_mark              STRING a counter, bumped on a connection of a thread's own so that a
                                    WAIT there covers a write the thread made on a shared one
                                    (durability.py); written only where replicas are waited on
    P:fingerprint_salt       STRING the salt of credential fingerprints with scrypt's
                                   parameters (credentials.new_salt_record), set once
    P:jobs:batched           SET   job ids with an open provider batch (a superset)
    P:jobs:active            ZSET  job id scored by run epoch: every job that is running or may
                                   hold leases (a superset, pruned by release_expired_leases)
    {P:workers}              ZSET  worker id scored by expiry; PEXPIREs after its last entry
    {P:workers}:<worker id>  HASH  host, pid, started_at, heartbeat_at_ms, threads, serves;
                                   PEXPIRE ttl
    {P:limit:<provider key>} HASH  request_tat_ms, token_tat_ms, pause_until_ms, backoff_step,
                                   auto_interval_ms, auto_since_ms, window_start_ms, window_count,
                                   previous_count;
                                   expires LIMIT_IDLE_KEEP_MS after its pacing and wait are over
    huey.{redis,schedule,results,counters}.P.<queue>   Huey's own (RedisHuey, results off); one
                                   <queue> per kind of model client (broker.queue_name)

Every job script also gets P:answers as its last key (KEYS[13]): a completion records its
answer there in the same script, and a delete takes the job's answers out.

delete_job removes all twelve keys of a job, every bucket of its per-item records and its index
entries. Every key a script touches is passed in KEYS: the twelve, the answer index, and the six
keys of each bucket it reaches (all share the job's hash tag, so they are in its slot). A script
that chooses its items itself (the lowest pending, the expired leases) ends, before writing
anything, with "NEEDKEYS <bucket> ..." when it was not given their buckets, and is called again
with them (scripts.call_job_script). The cross-job indexes are
updated outside the job's scripts (so each script stays in one slot), in the same MULTI/EXEC
as the script for begin_job, delete_job and set_state (this backend is for one Redis, not a
Cluster: a MULTI spans slots), and in an order that keeps each index a superset of what it
must list: a job is indexed before its keys exist (and before it runs) and unindexed with
them; readers skip entries whose job is missing or still being created. The active-jobs
index is pruned by run epoch (prune_active.lua), so a job run again while it is being pruned
stays listed. Operations the SQLite store does in one statement across jobs
(release_expired_leases, release_worker_items, renew_leases, item_owners, live_workers'
holdings) run one atomic script per job on that index, pipelined; retry_failed is atomic per
RETRY_BATCH_ITEMS items. No credentials are ever written to Redis.
"""

from __future__ import annotations

from collections.abc import Iterable

#: Events kept per job (the newest); a million-item job cannot grow its history without bound.
EVENTS_KEPT = 10_000
#: Items per bucket of the per-item hashes: at most this many fields a hash, so Redis keeps
#: each bucket as a listpack (hash-max-listpack-entries is 512 by default, 128 is safe on any
#: server) as long as every value is at most hash-max-listpack-value (64 bytes by default).
BUCKET_ITEMS = 128
#: The per-item families, each a hash per bucket: "{P:job:ID}:<family>:<index // BUCKET_ITEMS>".
ITEM_FAMILIES = ("items", "names", "sources", "states", "results", "keys")
#: The layout of the per-item records this code reads and writes (store/redis/layout.py
#: moves a Redis of an older layout to it): the value of P:layout.
LAYOUT = "2"
#: A provider key's pacing and backoff state is kept this long after it was last needed.
LIMIT_IDLE_KEEP_MS = 86_400_000

JOB_KEY_SUFFIXES = (
    "meta",
    "items",
    "states",
    "contents",
    "results",
    "pending",
    "leases",
    "owners",
    "failed",
    "events",
    "keys",
    "dups",
)


class RedisKeys:
    """Every key name (the schema is in this module's docstring)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.jobs_created = f"{prefix}:jobs:created"
        self.jobs_ids = f"{prefix}:jobs:ids"
        self.jobs_active = f"{prefix}:jobs:active"
        self.workers = f"{{{prefix}:workers}}"
        self.answers = f"{prefix}:answers"
        self.jobs_batched = f"{prefix}:jobs:batched"
        self.layout = f"{prefix}:layout"
        self.fingerprint_salt = f"{prefix}:fingerprint_salt"
        self.wait_mark = f"{prefix}:wait_mark"

    def job(self, job_id: str, extra: Iterable[str] = (), buckets: Iterable[int] = ()) -> list[str]:
        """A job script's KEYS, in the order _job.lua names them: the job's twelve keys, the
        answer index, the script's own `extra` keys, then the six keys of each bucket."""
        keys = [*(self.job_key(job_id, suffix) for suffix in JOB_KEY_SUFFIXES), self.answers]
        keys += extra
        for bucket in buckets:
            keys += self.bucket_keys(job_id, bucket)
        return keys

    def bucket_keys(self, job_id: str, bucket: int) -> list[str]:
        """Bucket number `bucket`'s hash of each of ITEM_FAMILIES."""
        return [f"{{{self.prefix}:job:{job_id}}}:{family}:{bucket}" for family in ITEM_FAMILIES]

    def job_key(self, job_id: str, suffix: str) -> str:
        return f"{{{self.prefix}:job:{job_id}}}:{suffix}"

    def bucket(self, job_id: str, family: str, index: int) -> str:
        """The hash of ITEM_FAMILIES that holds item `index`'s record of `family`."""
        return f"{self.job_key(job_id, family)}:{index // BUCKET_ITEMS}"

    def worker(self, worker_id: str) -> str:
        return f"{self.workers}:{worker_id}"

    def limit(self, provider_key: str) -> str:
        return f"{{{self.prefix}:limit:{provider_key}}}"
