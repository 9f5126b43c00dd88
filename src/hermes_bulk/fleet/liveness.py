"""Who is alive: worker identity, heartbeat cadence, and which owners of running items are dead.

A worker is live while its registry entry in the store is fresh (it heartbeats every
`heartbeat_interval`), except that on this host a worker whose lock file is free is dead at once,
without waiting for its entry to lapse. Both the service API (`jobs/service.py`: status, run,
delete) and the worker runtime (`runtime/worker.py`) ask this module; it depends on the store
protocol alone."""

from __future__ import annotations

import fcntl
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote, unquote

from ..files import private_dir
from ..store.protocol import (
    AWAITING_RECOVERY,
    BATCH_OWNER_PREFIX,
    INTERRUPTED_ORPHANED,
    INTERRUPTED_WORKER_STOP,
    RUNNING,
    Event,
    JobRecord,
    JobStore,
    WorkerInfo,
)
from . import endpoints

log = logging.getLogger("hermes_bulk.fleet.liveness")

#: Why a job waits for `run`, by JobRecord.interrupted (its awaiting_recovery event says so).
AWAITING_BECAUSE = {
    INTERRUPTED_WORKER_STOP: "its workers stopped gracefully before it finished (the items they "
    "held went back "
    "to the queue); run it to continue",
    INTERRUPTED_ORPHANED: "its workers stopped without a graceful worker stop (a crash, a Hermes "
    "gateway or a "
    "run --wait that exited); run it to continue",
}


#: The longest interval between a worker's heartbeats, whatever its lease.
MAX_HEARTBEAT_S = 5.0


def heartbeat_interval(lease_s: float) -> float:
    """How often a worker heartbeats and renews its leases: a third of a lease, 5 s at most."""
    return max(0.2, min(lease_s / 3, MAX_HEARTBEAT_S))


#: A worker whose last heartbeat is older than this many heartbeat intervals is not answering
#: (killed on another host, frozen, cut off), though it stays registered until its lease runs out.
SILENT_AFTER_BEATS = 3


def answering(worker: WorkerInfo, now_s: float, *, heartbeat_s: float) -> bool:
    """Whether a live worker heartbeat lately. What `status` counts as serving a job: a worker
    killed on another host shows within SILENT_AFTER_BEATS heartbeats, not a whole lease. Its
    items still wait for the lease (a worker merely slow to heartbeat keeps them).

    Never less than three of the longest heartbeat interval (5 s): the worker may run with
    another lease, so with another cadence, than the process that asks."""
    return now_s - worker.heartbeat_at <= SILENT_AFTER_BEATS * max(heartbeat_s, MAX_HEARTBEAT_S)


def this_host() -> str:
    """This machine's host name, as gethostname(2) gives it (uname's node name: socket's
    gethostname is the same call, and loading socket is a cost `status` need not pay)."""
    return os.uname().nodename


def new_worker_id() -> str:
    """host:pid:random; the host part is how Liveness knows a worker ran on this machine."""
    return f"{this_host()}:{os.getpid()}:{os.urandom(3).hex()}"


ONLY_JOB = "job:"  #: the serves token of a worker that serves one job alone (`run JOB --wait`)
#: The tokens with which a worker says what it offers, beside its routes (hashes, which name no
#: endpoint): its HTTP endpoint's public URL (percent-encoded, so no comma is left in it), the
#: protocol it speaks there, and whether it runs provider batches. A worker older than them
#: records none; readers older than them ignore them (none is a route or a job).
ENDPOINT_TOKEN, PROTOCOL_TOKEN, BATCHES_TOKEN = "endpoint=", "protocol=", "batches="


def serves_record(
    routes: list[str],
    only_job: str | None = None,
    *,
    endpoint: str | None = None,
    protocol: str | None = None,
    batches: bool | None = None,
) -> str:
    """What a worker serves, as its registry entry records it (WorkerInfo.serves): the routes
    it consumes (endpoints.route), for `run JOB --wait` the one job it serves, and what it
    offers in words: its HTTP endpoint's public URL and protocol, and whether it runs batches."""
    tokens = [*routes, *([ONLY_JOB + only_job] if only_job else [])]
    if endpoint:
        tokens.append(ENDPOINT_TOKEN + quote(endpoint, safe=":/"))
    if protocol:
        tokens.append(PROTOCOL_TOKEN + protocol)
    if batches is not None:
        tokens.append(BATCHES_TOKEN + ("yes" if batches else "no"))
    return ",".join(tokens)


@dataclass(frozen=True, slots=True)
class Offer:
    """What a live worker serves, read from its registry entry (serves_record)."""

    routes: frozenset[str]
    only_job: str | None  #: `run JOB --wait`: the one job it serves
    endpoint: str | None  #: its HTTP endpoint's public URL; None: no HTTP kind, or not said
    protocol: str | None  #: the protocol it speaks there; None: as endpoint
    batches: bool | None  #: whether it runs provider batches; None: not said (an older worker)
    reported: bool  #: False: an entry older than the serves record (it serves "http" jobs)

    @property
    def http(self) -> bool:
        """It serves jobs made by `hermes-bulk create` (some HTTP route)."""
        return any(r == endpoints.HTTP or r.startswith(endpoints.HTTP + "@") for r in self.routes)


def offer(worker: WorkerInfo) -> Offer:
    """The worker's entry read as an Offer. An entry without a serves record (a worker older
    than it) serves the HTTP jobs that recorded no endpoint, and says nothing more."""
    if not worker.serves:
        return Offer(frozenset([endpoints.HTTP]), None, None, None, None, reported=False)
    routes, only, url, protocol, batches = set(), None, None, None, None
    for token in worker.serves.split(","):
        if token.startswith(ONLY_JOB):
            only = token[len(ONLY_JOB) :]
        elif token.startswith(ENDPOINT_TOKEN):
            url = unquote(token[len(ENDPOINT_TOKEN) :])
        elif token.startswith(PROTOCOL_TOKEN):
            protocol = token[len(PROTOCOL_TOKEN) :]
        elif token.startswith(BATCHES_TOKEN):
            batches = token[len(BATCHES_TOKEN) :] == "yes"
        else:
            routes.add(token)
    return Offer(frozenset(routes), only, url, protocol, batches, reported=True)


#: Why a live worker does not serve a job (Unserved.reason), most telling first.
ONLY_OTHER_JOB = "only_job"  #: it serves another job alone (`run OTHER --wait`)
OTHER_KIND = "kind"  #: it has no model client of the job's kind (Hermes' model, or an endpoint)
OTHER_ENDPOINT = "endpoint"  #: another URL (or, when the URL is the same, another protocol)
OTHER_CREDENTIALS = "credentials"  #: the job's URL and protocol, with other credentials
UNSAID_ENDPOINT = "unsaid"  #: another route, and the worker (older) does not say which endpoint
NO_BATCHES = "batches"  #: the job is a batch job and the worker runs no provider batches


class Unserved(NamedTuple):
    """A live worker that does not serve a job, and why (one of the reasons above)."""

    worker: WorkerInfo
    reason: str
    offer: Offer


def unserved_because(worker: WorkerInfo, job: JobRecord) -> str | None:
    """Why the worker does not take the job's items (a reason above), or None: it does. The
    rule is can_serve's: the job's route among the worker's, every job or this one, and for a
    batch job a worker that runs batches; the reason names the first part that fails."""
    o = offer(worker)
    if o.only_job is not None and o.only_job != job.job_id:
        return ONLY_OTHER_JOB
    spec = job.spec
    if endpoints.route(spec) not in o.routes:
        if spec.client != endpoints.HTTP or not o.http:
            return OTHER_KIND
        if o.endpoint is None:
            return UNSAID_ENDPOINT
        if o.endpoint == spec.endpoint and o.protocol == spec.protocol:
            return OTHER_CREDENTIALS
        return OTHER_ENDPOINT
    if spec.mode == "batch" and o.batches is False:
        return NO_BATCHES
    return None


def can_serve(worker: WorkerInfo, job: JobRecord) -> bool:
    """Whether this worker takes the job's items: it consumes the job's route (its kind, and
    for HTTP its endpoint and key), serves every job or this one, and for a batch job runs
    provider batches (a worker that does not say whether it does is taken to: every HTTP worker
    that records no such word runs them). An entry without a serves record serves the HTTP jobs
    that recorded no endpoint."""
    return unserved_because(worker, job) is None


class Liveness:
    """Tells live workers from dead ones: the registry everywhere, lock files on this host."""

    def __init__(self, store: JobStore, locks_dir: Path) -> None:
        self.store, self.locks_dir, self.host = store, locks_dir, this_host()

    def lock_path(self, worker_id: str) -> Path:
        return self.locks_dir / (worker_id.replace("/", "_") + ".lock")

    def hold_lock(self, worker_id: str) -> int:
        private_dir(self.locks_dir)
        fd = os.open(self.lock_path(worker_id), os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd

    def _lock_is_free(self, worker_id: str) -> bool:
        """True when the worker ran on this host with this data dir and its process is gone."""
        if not worker_id.startswith(self.host + ":"):
            return False
        try:
            fd = os.open(self.lock_path(worker_id), os.O_RDWR)
        except OSError:
            return False  # no lock file here: it ran with another data dir; trust its lease
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)
        return True

    def live_workers(self) -> list[WorkerInfo]:
        """Live workers (entry fresh, and on this host their lock held), without holdings."""
        return [
            w for w in self.store.live_workers(holding=False) if not self._lock_is_free(w.worker_id)
        ]

    def capable_workers(
        self, job: JobRecord, live: list[WorkerInfo] | None = None
    ) -> list[WorkerInfo]:
        """The live workers that take this job's items (can_serve)."""
        return [w for w in (self.live_workers() if live is None else live) if can_serve(w, job)]

    def unserving_workers(
        self, job: JobRecord, live: list[WorkerInfo] | None = None
    ) -> list[Unserved]:
        """The live workers that do not take this job's items, each with why."""
        found = []
        for w in self.live_workers() if live is None else live:
            reason = unserved_because(w, job)
            if reason is not None:
                found.append(Unserved(w, reason, offer(w)))
        return found

    def live_worker_ids(self) -> set[str]:
        # Without holdings: reading them would load every running item, a batch's 50,000 too,
        # every maintenance pass and status (benchmarks, row 12: a worker's RSS grows with them).
        return {
            w.worker_id
            for w in self.store.live_workers(holding=False)
            if not self._lock_is_free(w.worker_id)
        }

    def dead_owners(self, exclude: str | None = None) -> list[str]:
        """Owners of running items that are not live workers (a provider batch is no worker)."""
        live = self.live_worker_ids()
        return [
            o
            for o in self.store.item_owners()
            if o not in live and o != exclude and not o.startswith(BATCH_OWNER_PREFIX)
        ]

    def recover_dead(self, exclude: str | None = None) -> dict[str, int]:
        """Return the items of dead owners to pending; counts by job. Each such job is marked
        orphaned: its items were cut off, not handed back (a later graceful stop overrides it)."""
        released: dict[str, int] = {}
        for owner in self.dead_owners(exclude):
            for job_id, n in self.store.release_worker_items(owner).items():
                released[job_id] = released.get(job_id, 0) + n
        for job_id in released:
            self.store.mark_interrupted(job_id, INTERRUPTED_ORPHANED)
        return released

    def sweep(self) -> None:
        """Forget workers of this host whose process is gone: registry entry and lock file.

        Done only after their items were returned (recover_dead), since the lock file is how
        others on this host tell that they are dead.
        """
        if not self.locks_dir.is_dir():
            return
        for path in self.locks_dir.glob("*.lock"):
            worker_id = path.name[: -len(".lock")]
            if self._lock_is_free(worker_id) and worker_id not in self.store.item_owners():
                self.store.remove_worker(worker_id)
                path.unlink(missing_ok=True)


class Recovery(NamedTuple):
    released: dict[str, int]  #: items of dead workers returned to the queue, per job
    resumed: list[str]  #: jobs continued after a graceful worker stop (resume=True)


def stopped_gracefully(job: JobRecord) -> bool:
    """The job's last interruption is a graceful worker stop, and no item was claimed since."""
    return (
        job.interrupted == INTERRUPTED_WORKER_STOP
        and job.interrupted_at is not None
        and job.interrupted_at >= (job.last_claim_at or 0)
    )


def interruption(job: JobRecord) -> str | None:
    """Why a job that no worker runs now was cut off (INTERRUPTED_*), or None: not cut off (never
    picked up since it was run, finished, paused). What `status` shows while it awaits recovery."""
    if job.finished:
        return None
    if job.state == AWAITING_RECOVERY:
        return job.interrupted or INTERRUPTED_ORPHANED
    if job.state == RUNNING and job.last_claim_at and job.last_claim_at >= (job.run_at or 0):
        return INTERRUPTED_WORKER_STOP if stopped_gracefully(job) else INTERRUPTED_ORPHANED
    return None


def recover_interrupted(
    liveness: Liveness, exclude: str | None = None, *, resume: bool = False
) -> Recovery:
    """When Bulk starts (a worker, or the plugin in a Hermes process): items dead workers left
    running go back to the queue at once, whether or not other workers are alive (on this host
    a dead worker's lock file is free, so this needs no lease to lapse); with no other worker
    alive, jobs cut off mid-run also wait for someone to run them.

    Jobs never start by themselves (DESIGN.md invariant 9): a restart must not spend tokens
    nobody asked for. A running job that some worker has claimed items of since it was last
    run was interrupted; one that was run but never picked up is still waiting for a worker.
    The one exception is opt-in (resume, `worker --resume-interrupted`): a job whose last
    interruption was a graceful worker stop, with nothing claimed and no item found orphaned
    since, keeps running, so a rolling restart of a fleet continues its jobs. A job cut off by
    a crash (of a worker or of a Hermes gateway) always waits for `run`.
    """
    alone = not (liveness.live_worker_ids() - {exclude})
    released = liveness.recover_dead(exclude=exclude)
    resumed: list[str] = []
    if alone:
        store = liveness.store
        for job_id in store.active_job_ids():
            job = store.get_job(job_id)
            if not (
                job
                and not job.finished
                and job.last_claim_at
                and job.last_claim_at >= (job.run_at or 0)
            ):
                continue
            graceful = stopped_gracefully(job)
            if resume and graceful:
                if store.mark_interrupted(
                    job_id,
                    None,
                    event=Event(
                        "resumed",
                        "continued after a graceful worker stop (worker --resume-interrupted)",
                    ),
                ):
                    resumed.append(job_id)
                    log.info(
                        "job %s continues: its workers stopped gracefully and this worker resumes "
                        "such jobs (--resume-interrupted)",
                        job_id,
                    )
                continue
            if not graceful:
                store.mark_interrupted(job_id, INTERRUPTED_ORPHANED)
            reason = INTERRUPTED_WORKER_STOP if graceful else INTERRUPTED_ORPHANED
            if store.set_state(
                job_id,
                AWAITING_RECOVERY,
                from_states=[RUNNING],
                event=Event("awaiting_recovery", AWAITING_BECAUSE[reason]),
            ):
                log.info("job %s awaits recovery: %s", job_id, AWAITING_BECAUSE[reason])
    return Recovery(released, resumed)
