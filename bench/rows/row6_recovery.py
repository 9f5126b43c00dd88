"""Row 6: recovery. Every worker process is killed with -9 mid-job; then `hermes-bulk run JOB`
and workers are started again, and the store is watched: when does the job complete items
again, and when are the items the dead workers held back in play?

On the same host, a dead worker's lock file (under the data dir) is free, so `run` returns its
items at once. Another host cannot see that lock file: there, the dead workers' items wait for
their lease to expire (renewed every lease/3 while they lived). That case is run with the new
`run` and workers on another data dir (HERMES_BULK_HOME) and the same Redis, as a second
machine would.
"""

from __future__ import annotations

import signal
import time

from ..core import Context, Line, RowResult, at_most, fmt_s, table, write_jsonl
from ..procs import FakeProviderProc, HermesEnv, stop_process

ROW = 6
TITLE = "recovery after kill -9 of every worker"


def run(ctx: Context) -> RowResult:
    from hermes_bulk.fleet.broker import open_backend

    lease, latency, conc, n, procs = (3.0, 0.1, 4, 40, 2) if ctx.quick else (30.0, 0.5, 16, 2000, 2)
    src = write_jsonl(ctx.dir("src") / "items.jsonl", n)
    provider = FakeProviderProc(latency_s=latency)
    cases = [
        ("sqlite-same", "SQLite, same host", False, False),
        ("redis-same", "Redis, same host", True, False),
        ("redis-other", "Redis, another host (no lock files)", True, True),
    ]
    runs: dict[str, dict] = {}
    try:
        for key, _label, redis, other_host in cases:
            backend = ctx.redis_url() if redis else None
            settings = dict(max_concurrency=conc, lease_seconds=lease)
            first = HermesEnv(
                ctx.dir(f"{key}-a"), backend=backend, base_url=provider.base_url, **settings
            )
            again = (
                HermesEnv(
                    ctx.dir(f"{key}-b"), backend=backend, base_url=provider.base_url, **settings
                )
                if other_host
                else first
            )
            if not redis:
                again = first
            job = first.create(src, "--concurrency", str(conc))
            store = open_backend(first.settings()).store
            first.cli("run", job)
            workers = [
                first.spawn_worker(conc // procs, first.home / f"w{i}.log") for i in range(procs)
            ]
            _wait(
                lambda store=store, job=job: store.get_job(job).completed >= 3 * conc,
                60,
                "the job to get going",
            )
            for w in workers:
                w.send_signal(signal.SIGKILL)
            for w in workers:
                w.wait()
            killed_at = time.monotonic()
            before = store.get_job(job)
            dead = set(store.item_owners())
            held = before.running
            # A lease runs a lease from the item's claim or its last renewal (with each heartbeat),
            # so every lease the dead held has ended a lease after the later of those.
            beats = [w.heartbeat_at for w in store.live_workers() if w.worker_id in dead]
            leases_end = max(beats + [before.last_claim_at or 0.0]) + lease
            started, started_wall = time.monotonic(), time.time()
            again.cli("run", job)
            run_s = time.monotonic() - started
            workers = [
                again.spawn_worker(conc // procs, again.home / f"w{i}.log") for i in range(procs)
            ]
            t_claim = t_done = t_recovered = None
            try:
                deadline = started + 3 * lease + 60
                while None in (t_claim, t_done, t_recovered) and time.monotonic() < deadline:
                    now = time.monotonic() - started
                    if t_recovered is None and not dead & set(store.item_owners()):
                        t_recovered = now
                    current = store.get_job(job)
                    if t_claim is None and (current.last_claim_at or 0) > started_wall:
                        t_claim = (
                            current.last_claim_at - started_wall
                        )  # the store's clock: this host's
                    if t_done is None and current.completed > before.completed:
                        t_done = now
                    time.sleep(0.05)
            finally:
                for w in workers:
                    stop_process(w, signal.SIGINT)
            runs[key] = {
                "held": held,
                "completed_at_kill": before.completed,
                "run_cli_s": run_s,
                "claim_s": t_claim,
                "done_s": t_done,
                "recovered_s": t_recovered,
                "kill_to_run_s": started - killed_at,
                "leases_end_s": leases_end - started_wall,
            }
            ctx.log(
                f"  {key}: {held} items held by the dead, their leases end by "
                f"{_s(runs[key]['leases_end_s'])}; after "
                f"`run`: claimed {_s(t_claim)}, completed {_s(t_done)}, recovered {_s(t_recovered)}"
            )
    finally:
        provider.stop()

    result = RowResult(
        row=ROW,
        title=TITLE,
        compared_with=f"the lease length (HERMES_BULK_LEASE_SECONDS = {lease:g})",
        goal="the job continues within one lease of `run`",
        setup=(
            f"{n:,} items, provider latency {latency} s, --concurrency {conc}, {procs} "
            f"`hermes-bulk worker` processes x {conc // procs} threads, lease {lease:g} s. After "
            f"{3 * conc}+ items completed every worker got SIGKILL; at once `hermes-bulk run JOB` "
            f"(a child process; its start is time 0), then {procs} new workers. Continued = the "
            "job's first claim after `run` (an item is being processed again); the first "
            f"completion, {latency} s of provider latency later, is in the table below; recovered "
            "= no item is held by a dead worker any more."
        ),
        raw=runs,
    )
    for key, label, _r, _o in cases:
        o = runs[key]
        t = o["claim_s"]
        if t is None:
            result.lines.append(
                Line(label, "did not continue", f"lease {lease:g} s", None, "<= 1.00", False)
            )
            continue
        goal, met = at_most(t / lease, 1.0)
        result.lines.append(
            Line(label, f"continued after {fmt_s(t)}", f"lease {lease:g} s", t / lease, goal, met)
        )
    result.details.append(
        table(
            [
                "case",
                "items held by the dead",
                "their leases all end by",
                "`run` took",
                "first claim after",
                "first completion after",
                "dead workers' items back after",
            ],
            [
                [
                    label,
                    str(runs[k]["held"]),
                    _s(runs[k]["leases_end_s"]),
                    fmt_s(runs[k]["run_cli_s"]),
                    _s(runs[k]["claim_s"]),
                    _s(runs[k]["done_s"]),
                    _s(runs[k]["recovered_s"]),
                ]
                for k, label, _r, _o in cases
            ],
        )
    )
    result.details.append(
        'All times from the start of `run`. "Their leases all end by": a lease after the later '
        "of the job's last claim and the dead workers' last heartbeat (which renewed their "
        "leases). The dead held the last items claimed, so on another host, where only leases "
        "tell that a worker is dead, the job continues about then."
    )
    return result


def _s(value: float | None) -> str:
    return "-" if value is None else fmt_s(value)


def _wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)
