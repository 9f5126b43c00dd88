"""What the workers of a fleet share, on any number of machines.

broker.py     a backend from one URL: the Huey queue, the job store and the shared limiter
tasks.py      the one Huey task (an item's trigger) and the consumers that run it
endpoints.py  which endpoint a job belongs to, and the queue its triggers travel on
liveness.py   worker identity and heartbeats: who is alive, whose items are orphaned
"""
