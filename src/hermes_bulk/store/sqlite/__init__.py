"""The embedded backend: one SQLite file in WAL mode.

    database.py  one open database per file per process, per-thread connections, migrations,
                 the write transaction (also the budget ledger's file)
    schema.py    the job store's tables, as named migrations
    jobs.py      SqliteJobStore (store/protocol.py JobStore)
    limits.py    SqliteLimits (store/protocol.py SharedLimits)
    queue.py     Huey's SqliteHuey queues, in a file beside the store's

Every state change is one `BEGIN IMMEDIATE` transaction through `SqliteDatabase.write()`, so
threads and processes on one machine see each operation whole.
"""
