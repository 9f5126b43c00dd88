"""The fleet backend: one Redis, shared by every worker on every machine.

    connection.py  the pinged pool for a RedisUrl (redis-py's Sentinel pool for redis+sentinel://),
                   and the one-line errors of a Redis gone away
    failover.py    which commands wait out a failover (READONLY, LOADING, no primary yet)
    durability.py  WAIT for replicas after the writes a user is told about
    keys.py        the key schema: every key name, and what each holds
    scripts.py     the Lua scripts (lua/<operation>.lua), registered once per client
    codec.py       records as they are stored in hashes, lists and script replies
    jobs.py        RedisJobStore (store/protocol.py JobStore), made of one room per concept, the
                   same rooms as the SQLite store's:
      creation.py   begin a job, add its items, finish it, delete it
      reads.py      jobs and items read back
      events.py     a job's history
      job_state.py  run, pause and resume moves, interruptions, settings, retries, the sample
      claims.py     an item to a worker under the job's limits, lease renewal
      settling.py   a claimed item completed, failed, released or taken back
      batches.py    provider batches
      workers.py    heartbeats and who holds what
    limits.py      RedisLimits (store/protocol.py SharedLimits)
    queue.py       Huey's RedisHuey queues, on the store's pool

Every state change of one job is one Lua script, so N workers on M machines see each operation
whole; store/protocol.py says, method by method, which operations take more than one step here
and what an interruption leaves. Scripts read the clock with Redis TIME, so machines with
skewed clocks agree on leases, pauses and pacing. Semantics mirror store/sqlite/.
"""
