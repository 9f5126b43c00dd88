"""The embedded backend: one SQLite file in WAL mode.

    database.py  one open database per file per process, per-thread connections, migrations,
                 the write transaction (also the budget ledger's file)
    schema.py    the job store's tables, as named migrations
    jobs.py      SqliteJobStore (store/protocol.py JobStore), made of one room per concept,
                 the same rooms as the Redis store's:
      creation.py   begin a job, add its items, finish it, delete it
      reads.py      jobs and items read back
      events.py     a job's history
      job_state.py  run, pause and resume moves, interruptions, settings, retries, the sample
      claims.py     an item to a worker under the job's limits, lease renewal
      settling.py   a claimed item completed, failed, released or taken back
      batches.py    provider batches
      workers.py    heartbeats and who holds what
    rows.py      the job and item columns, and the records made of them
    reservations.py  what a claim reserves under --max-tokens and --max-cost, in SQL
    limits.py    SqliteLimits (store/protocol.py SharedLimits)
    queue.py     Huey's SqliteHuey queues, in a file beside the store's

Every state change is one `BEGIN IMMEDIATE` transaction through `SqliteDatabase.write()`, so
threads and processes on one machine see each operation whole.
"""
