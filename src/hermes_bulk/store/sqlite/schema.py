"""The job store's schema (bulk.db): migrations applied in order and recorded by name (the way
simonw/llm does it)."""

from __future__ import annotations

MIGRATIONS: list[tuple[str, str]] = []
migration = MIGRATIONS.append

migration(
    (
        "m001_initial",
        """
CREATE TABLE jobs (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    pause_reason TEXT,
    max_tokens INTEGER,
    total INTEGER NOT NULL DEFAULT 0,
    pending INTEGER NOT NULL DEFAULT 0,
    running INTEGER NOT NULL DEFAULT 0,
    completed INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    tokens_in INTEGER NOT NULL DEFAULT 0,
    tokens_out INTEGER NOT NULL DEFAULT 0,
    tokens_charged INTEGER NOT NULL DEFAULT 0,
    tokens_reserved INTEGER NOT NULL DEFAULT 0,
    estimated_tokens INTEGER NOT NULL DEFAULT 0,
    skipped INTEGER NOT NULL DEFAULT 0,
    last_claim_at REAL,
    run_at REAL
);
CREATE INDEX jobs_by_created ON jobs (created_at);
CREATE TABLE items (
    job_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    name TEXT NOT NULL,
    content_hash TEXT NOT NULL,
    origin TEXT NOT NULL,
    byte_offset INTEGER NOT NULL,
    stat_sig TEXT NOT NULL,
    estimate INTEGER NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending',
    attempts INTEGER NOT NULL DEFAULT 0,
    rate_limit_waits INTEGER NOT NULL DEFAULT 0,
    owner TEXT,
    lease_until REAL,
    reserved INTEGER NOT NULL DEFAULT 0,
    tokens_in INTEGER NOT NULL DEFAULT 0,
    tokens_out INTEGER NOT NULL DEFAULT 0,
    error_type TEXT,
    http_status INTEGER,
    error_message TEXT,
    provider TEXT,
    model TEXT,
    PRIMARY KEY (job_id, idx)
);
CREATE INDEX items_pending ON items (job_id, idx) WHERE status = 'pending';
CREATE INDEX items_leased ON items (lease_until) WHERE status = 'running';
CREATE INDEX items_owned ON items (owner) WHERE status = 'running';
CREATE TABLE contents (
    job_id TEXT NOT NULL,
    hash TEXT NOT NULL,
    text TEXT NOT NULL,
    PRIMARY KEY (job_id, hash)
);
CREATE TABLE results (
    job_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    text TEXT NOT NULL,
    PRIMARY KEY (job_id, idx)
);
CREATE TABLE events (
    id INTEGER PRIMARY KEY,
    job_id TEXT NOT NULL,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    item_idx INTEGER,
    message TEXT NOT NULL,
    error_type TEXT,
    http_status INTEGER
);
CREATE INDEX events_by_job ON events (job_id, id);
CREATE TABLE workers (
    id TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    started_at REAL NOT NULL,
    heartbeat_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    threads INTEGER NOT NULL
);
CREATE TABLE limits (
    key TEXT PRIMARY KEY,
    request_tat REAL NOT NULL DEFAULT 0,
    token_tat REAL NOT NULL DEFAULT 0,
    pause_until REAL NOT NULL DEFAULT 0,
    backoff_step INTEGER NOT NULL DEFAULT 0,
    auto_interval REAL NOT NULL DEFAULT 0,
    window_start REAL NOT NULL DEFAULT 0,
    window_count INTEGER NOT NULL DEFAULT 0,
    previous_count INTEGER NOT NULL DEFAULT 0
);
""",
    )
)

# Adaptive pacing that relaxes with time (auto_since) and slows down once per generation of
# requests (decreases). A database at m001 may have limits with or without auto_since, so the
# table is rebuilt rather than altered: its state is short-lived (waits, pacing, a two-second
# rate window).
migration(
    (
        "m002_limits_decrease_epochs",
        """
DROP TABLE limits;
CREATE TABLE limits (
    key TEXT PRIMARY KEY,
    request_tat REAL NOT NULL DEFAULT 0,
    token_tat REAL NOT NULL DEFAULT 0,
    pause_until REAL NOT NULL DEFAULT 0,
    backoff_step INTEGER NOT NULL DEFAULT 0,
    auto_interval REAL NOT NULL DEFAULT 0,
    auto_since REAL NOT NULL DEFAULT 0,
    window_start REAL NOT NULL DEFAULT 0,
    window_count INTEGER NOT NULL DEFAULT 0,
    previous_count INTEGER NOT NULL DEFAULT 0,
    decreases INTEGER NOT NULL DEFAULT 0
);
""",
    )
)

# Why a running job's workers stopped (JobRecord.interrupted): a graceful worker stop, or found
# orphaned; only the first is continued by a worker started with --resume-interrupted.
migration(
    (
        "m003_jobs_interrupted",
        """
ALTER TABLE jobs ADD COLUMN interrupted TEXT;
ALTER TABLE jobs ADD COLUMN interrupted_at REAL;
""",
    )
)

# Reuse: each item's answer key; a duplicate waits on the first item of its job with
# that key (dup_of); an item completed from an earlier job's answer says which (reused_job,
# reused_idx) and how many tokens that answer cost (tokens_saved). item_keys holds the first
# item of each key of a job (in-job duplicates find it); answers is the store's answer index:
# key -> the completed item that answered it (deleted with its job).
migration(
    (
        "m004_reuse",
        """
ALTER TABLE items ADD COLUMN answer_key TEXT NOT NULL DEFAULT '';
ALTER TABLE items ADD COLUMN dup_of INTEGER;
ALTER TABLE items ADD COLUMN reused_job TEXT;
ALTER TABLE items ADD COLUMN reused_idx INTEGER;
ALTER TABLE items ADD COLUMN tokens_saved INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN reused INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN tokens_saved INTEGER NOT NULL DEFAULT 0;
CREATE INDEX items_waiting ON items (job_id, dup_of) WHERE status = 'waiting';
CREATE TABLE item_keys (
    job_id TEXT NOT NULL,
    key TEXT NOT NULL,
    idx INTEGER NOT NULL,
    PRIMARY KEY (job_id, key)
) WITHOUT ROWID;
CREATE TABLE answers (
    key TEXT PRIMARY KEY,
    job_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    tokens INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX answers_by_job ON answers (job_id);
""",
    )
)

# Provider batches: one row per batch of a job; its items are the running items owned
# by "batch:<id>" (protocol.BATCH_OWNER_PREFIX). lease_owner/lease_until: the worker submitting,
# polling or ingesting it now.
migration(
    (
        "m005_batches",
        """
CREATE TABLE batches (
    id TEXT PRIMARY KEY,
    job_id TEXT NOT NULL,
    status TEXT NOT NULL,
    items INTEGER NOT NULL,
    created_at REAL NOT NULL,
    provider_id TEXT,
    input_file TEXT,
    output_file TEXT,
    error_file TEXT,
    completed INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    submitted_at REAL,
    cancel_sent INTEGER NOT NULL DEFAULT 0,
    run_rest_live INTEGER NOT NULL DEFAULT 0,
    lease_owner TEXT,
    lease_until REAL NOT NULL DEFAULT 0
);
CREATE INDEX batches_by_job ON batches (job_id, created_at);
CREATE INDEX batches_open ON batches (job_id) WHERE status != 'done';
""",
    )
)

# A job over files drops an item's captured content once the item completes (its hash
# stays on the item: change checks, reuse); older jobs keep theirs (0). Contents and results are
# stored compressed from now on (store/compression.py), which needs no migration: a value
# written before reads back as it is.
migration(
    (
        "m006_content_codec",
        """
ALTER TABLE jobs ADD COLUMN drop_content INTEGER NOT NULL DEFAULT 0;
""",
    )
)

# The dashboard and `status --failed` list a job's first failed items: without an
# index that is a scan of every item of the job.
migration(
    (
        "m007_dashboard",
        """
CREATE INDEX items_failed ON items (job_id, idx) WHERE status = 'failed';
""",
    )
)

# A batch's own status becomes "done" once it is ingested; the provider's status at its
# end (completed, expired, cancelled, failed) is kept beside it for `status`. Batches that ended
# before this have none (NULL), and show "done" as they did.
migration(
    (
        "m008_batch_final_status",
        """
ALTER TABLE batches ADD COLUMN final_status TEXT;
""",
    )
)

migration(
    (
        "m009_worker_serves",
        """
ALTER TABLE workers ADD COLUMN serves TEXT NOT NULL DEFAULT '';
""",
    )
)

# When a batch was last polled, for `status` (batches polled before this have none).
migration(
    (
        "m010_batch_polled_at",
        """
ALTER TABLE batches ADD COLUMN polled_at REAL;
""",
    )
)

# Money and prompt caching: what each completed item cost at its job's price, and the same at the
# live list price (nano-USD, jobs/prices.py), its cached input tokens; the job's sums; what an
# answer cost (the answer index), so a job that reuses it knows what it saved (saved_cost).
migration(
    (
        "m011_costs",
        """
ALTER TABLE items ADD COLUMN tokens_cached INTEGER NOT NULL DEFAULT 0;
ALTER TABLE items ADD COLUMN cost INTEGER NOT NULL DEFAULT 0;
ALTER TABLE items ADD COLUMN saved_cost INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN tokens_cached INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN cost INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN list_cost INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN saved_cost INTEGER NOT NULL DEFAULT 0;
ALTER TABLE answers ADD COLUMN cost INTEGER NOT NULL DEFAULT 0;
""",
    )
)

# run --sample N: the indexes claims are limited to until each has settled (a JSON array).
migration(
    (
        "m012_sample",
        """
ALTER TABLE jobs ADD COLUMN sample TEXT;
""",
    )
)

# --max-cost: the job's limit in nano-USD (changed by resume, as max_tokens), what its running
# items hold against it, and each running item's share (records.reserved_cost).
migration(
    (
        "m013_max_cost",
        """
ALTER TABLE jobs ADD COLUMN max_cost INTEGER;
ALTER TABLE jobs ADD COLUMN cost_reserved INTEGER NOT NULL DEFAULT 0;
ALTER TABLE items ADD COLUMN reserved_cost INTEGER NOT NULL DEFAULT 0;
""",
    )
)

# Prompt-cache writes: the input tokens each completed item wrote to the provider's cache
# (Anthropic bills them at 1.25x input), and the job's sum.
migration(
    (
        "m014_cache_writes",
        """
ALTER TABLE items ADD COLUMN tokens_written INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN tokens_written INTEGER NOT NULL DEFAULT 0;
""",
    )
)

# What the provider billed for answers that were not kept (truncated, invalid, refused): part of
# tokens_charged and cost, shown apart. An item's tokens_in, tokens_out and cost count its billed
# attempts as well as its kept answer from now on; earlier items hold their kept answer's.
migration(
    (
        "m015_unkept_answers",
        """
ALTER TABLE jobs ADD COLUMN tokens_unkept INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN cost_unkept INTEGER NOT NULL DEFAULT 0;
""",
    )
)

# Worst-case claims: an item's `estimate` is what its claim reserves (its worst case), its
# `expected` what estimates sum; the job keeps the sum of each (estimated_tokens, worst_tokens).
migration(
    (
        "m016_worst_cases",
        """
ALTER TABLE items ADD COLUMN expected INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN worst_tokens INTEGER NOT NULL DEFAULT 0;
""",
    )
)

# Values set once per store: the salt of credential fingerprints (credentials.py), written by
# the first `create` or worker that needs it.
migration(
    (
        "m017_store_meta",
        """
CREATE TABLE store_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
""",
    )
)
