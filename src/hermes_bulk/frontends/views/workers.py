"""Who is live and what each worker serves: the `workers` table, and the words that say which
worker a job needs and the command that starts one."""

from __future__ import annotations

import shlex

from ...fleet.liveness import (
    NO_BATCHES,
    ONLY_OTHER_JOB,
    OTHER_CREDENTIALS,
    OTHER_ENDPOINT,
    OTHER_KIND,
    answering,
    offer,
)
from ...jobs import hints
from ...jobs.service import JobStatus
from ...store.protocol import JobSpec, WorkerInfo
from ...words import count
from ..terminal import Column, Table
from .times import age


def worker_wanted(st: JobStatus, cmd: str) -> str:
    """For a job of `hermes-bulk create` that no live worker serves: who is live and what they
    serve instead, and the command that starts a worker for the job's endpoint ("1 worker is
    live but serves http://…/v1; start one for this job's endpoint: HERMES_BULK_BASE_URL=…
    hermes-bulk worker"). What `status` says, and what any reply that says no worker picks a
    job up should say (`/bulk run`, `/bulk status`)."""
    j = st.job
    where = "for this job's endpoint" if j.spec.endpoint else "with"
    here = "process it here" if cmd == hints.CLI else "in a shell"
    line = (
        f"{workers_live(st)}; start one {where}: {worker_command(st, cmd)}, "
        f"or {here}: {worker_command(st, cmd, f'run {j.job_id} --wait')}"
    )
    if j.spec.endpoint and "***" in j.spec.endpoint:
        line += " (with the URL's key where *** stands)"
    return line


def workers_live(st: JobStatus) -> str:
    """How many workers are live and, when none serves the job, what they serve instead: "No
    worker is live", "1 worker is live but serves http://…/v1", "3 workers are live but none
    serves this job: 2 serve http://…/v1, 1 serves job 3f2a… alone (run --wait)"."""
    total = st.live_workers_total
    if not total:
        return "No worker is live"
    if st.live_workers:
        return f"{count(total, 'worker')} {'is' if total == 1 else 'are'} live"
    groups: dict[tuple, int] = {}
    for u in st.unserved:
        key = (u.reason, u.offer.endpoint, u.offer.protocol, u.offer.only_job)
        groups[key] = groups.get(key, 0) + 1
    shown = [_unserved_words(n, key, st.job.spec) for key, n in groups.items()]
    live = f"{count(total, 'worker')} {'is' if total == 1 else 'are'} live but"
    if len(shown) == 1 and total == sum(groups.values()):
        return f"{live} {shown[0].split(' ', 1)[1]}"  # "1 worker is live but serves …"
    return f"{live} none serves this job: {', '.join(shown)}"


def _unserved_words(n: int, key: tuple, spec: JobSpec) -> str:
    """ "2 serve http://…/v1": n workers that do not serve the job, and what they do instead."""
    reason, endpoint, protocol, only_job = key
    s = "s" if n == 1 else ""
    if reason == ONLY_OTHER_JOB:
        what = f"serve{s} job {only_job} alone (run --wait)"
    elif reason == OTHER_KIND:
        what = (
            f"serve{s} only jobs created in Hermes"
            if spec.client == "http"
            else f"serve{s} only jobs created by hermes-bulk create"
        )
    elif reason == OTHER_ENDPOINT:
        what = f"serve{s} {endpoint}" + (f" ({protocol})" if protocol != spec.protocol else "")
    elif reason == OTHER_CREDENTIALS:
        what = f"serve{s} this endpoint with another API key"
    elif reason == NO_BATCHES:
        what = "cannot run provider batches"
    else:  # UNSAID_ENDPOINT
        what = f"serve{s} another endpoint (an older hermes-bulk, which does not say which)"
    return f"{n:,} {what}"


def _env_for(st: JobStatus, cmd: str) -> list[str]:
    """The settings a shell needs beside its own for a worker of the job's endpoint: its
    protocol and URL where they differ from this shell's (`here`); both where there is no shell
    (a reply in Hermes). The key is never shown: the user sets the one the job was made with."""
    spec = st.job.spec
    if not spec.endpoint or spec.client != "http":
        return []
    url, protocol = st.here if st.here and cmd == hints.CLI else (None, None)
    env = []
    if spec.protocol != protocol:
        env.append(f"HERMES_BULK_PROVIDER={spec.protocol}")
    if spec.endpoint != url:
        env.append(f"HERMES_BULK_BASE_URL={shlex.quote(spec.endpoint)}")
    return env


def worker_command(st: JobStatus, cmd: str, args: str = "worker") -> str:
    """`hermes-bulk ARGS` as a shell configured as this one would run it for the job's endpoint
    (`HERMES_BULK_BASE_URL=… hermes-bulk worker` when this shell's endpoint is another)."""
    return " ".join([*_env_for(st, cmd), "hermes-bulk", args])


def workers_table(workers: list[WorkerInfo], now_s: float, *, heartbeat_s: float) -> Table:
    """Who is live, what each serves and holds, fitted to 80 columns: the cells wrap at spaces
    (a worker shows as its host and pid, as ps finds it; its id ends in a random part that
    only tells apart two processes of one pid)."""
    table = Table(
        "Workers",
        [
            Column("worker", no_wrap=False, fold=True),
            Column("last seen", no_wrap=False),
            Column("serves", no_wrap=False, fold=True),
            Column("holding", no_wrap=False),
        ],
    )
    for w in workers:
        age_s = now_s - w.heartbeat_at
        seen = (
            f"{age_s:.1f} s ago"
            if answering(w, now_s, heartbeat_s=heartbeat_s)
            else f"not answering for {age_s:.0f} s"
        )
        table.rows.append(
            [
                f"{w.host} pid {w.pid}, {count(w.threads, 'thread')}, up "
                f"{age(now_s - w.started_at)}",
                seen,
                serves_words(w),
                _holding(w.holding) or "-",
            ]
        )
    return table


def _holding(held: list[tuple[str, int]], shown: int = 6) -> str:
    """ "3f2a91c04b7e: #4, #5 …": the items a worker holds by job, the first `shown`."""
    by_job: dict[str, list[str]] = {}
    for job, index in held[:shown]:
        by_job.setdefault(job, []).append(f"#{index + 1}")
    text = "; ".join(f"{job}: {', '.join(items)}" for job, items in by_job.items())
    return text + (f" … ({len(held)} in all)" if len(held) > shown else "")


#: What a worker of a kind other than HTTP serves, in words.
_KIND_WORDS = {"hermes": "jobs created in Hermes (Hermes' model)"}


def serves_words(worker: WorkerInfo) -> str:
    """What a worker serves, as `workers` shows it: its endpoint and protocol, whether it runs
    provider batches, the one job of a `run JOB --wait`; what an older worker does not say."""
    o = offer(worker)
    if not o.reported:
        return "jobs with no endpoint recorded (an older hermes-bulk: it says no more)"
    parts = []
    if o.http:
        batches = {True: ", batches", False: ", no batches", None: ""}[o.batches]
        if o.endpoint:
            parts.append(f"{o.endpoint} ({o.protocol}{batches})")
        else:
            parts.append(f"an endpoint it does not name (an older hermes-bulk){batches}")
    for route in sorted(o.routes):
        if route != "http" and not route.startswith("http@"):
            parts.append(_KIND_WORDS.get(route, f"jobs of kind {route}"))
    text = "; ".join(parts) or "nothing"
    return f"job {o.only_job} only: {text}" if o.only_job else text
