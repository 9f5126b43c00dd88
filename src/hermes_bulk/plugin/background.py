"""Background work inside the Hermes process: one embedded worker per backend, while jobs need it.

`/bulk run`, `resume` and `retry` call `ensure_running`. The first call starts a WorkerRuntime
with an embedded Huey consumer (daemon threads; Hermes keeps its own signal handlers); later
calls reuse it. A supervisor thread stops it once no job it serves has had work for
IDLE_STOP_S, so Bulk's threads run in Hermes only while a job is active. When Hermes exits, the
threads end with it and items in progress go back to the queue; nothing starts them again until
someone runs the job (jobs never start by themselves).

`request_gate` is the seam for the cron budget: every ctx.llm call a worker makes is admitted
through it first, because Hermes' middleware does not see ctx.llm calls in 0.19.0. The gate
looks at the budget before each request, so a budget set while Hermes runs applies at once.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time

from ..config.backend_url import SqliteUrl, parse_backend_url
from ..config.settings import Settings
from ..fleet.broker import Backend, open_backend
from ..fleet.liveness import Liveness, recover_interrupted
from ..providers.pacing import RequestGate
from ..redact import public_url
from ..runtime.client_kinds import Served
from ..runtime.worker import ClientFactory, WorkerRuntime

log = logging.getLogger("hermes_bulk.plugin")

IDLE_STOP_S = 60.0  #: a runtime with nothing to do for this long stops (its threads end)
SUPERVISE_EVERY_S = 2.0

_lock = threading.Lock()
_runtimes: dict[str, WorkerRuntime] = {}  # backend URL -> the runtime serving it in this process
_gates: dict[str, RequestGate] = {}
_atexit_registered = False


def request_gate(settings: Settings) -> RequestGate:
    """The request budget for background model calls: the cron-budget ledger's gate, which charges
    nothing while no budget is configured. One per backend, shared by workers and status."""
    with _lock:
        gate = _gates.get(settings.backend_url)
        if gate is None:
            gate = _gates[settings.backend_url] = _budget_gate(settings)
        return gate


def _budget_gate(settings: Settings) -> RequestGate:
    """Every ctx.llm call of a bulk job is charged to the cron budget as class bulk.

    Hermes' middleware does not see ctx.llm in 0.19.0, so Bulk charges the ledger itself: from
    the first request when the cron-budget plugin counts in this process, else once a budget is
    configured under the root Hermes home; until then every request may go.
    """
    from ..budget.gate import gate_from_environment
    from . import cron_budget, hermes

    return gate_from_environment(
        profile=hermes.profile_name(),
        counting_here=cron_budget.counting,
        describe=hermes.request_route,  # the provider and API mode, as Hermes' chat rows have them
    )


def worker_clients(settings: Settings) -> Served:
    """`hermes-bulk worker` serving jobs created in Hermes (entry point `hermes_bulk.clients`):
    Hermes' model where this machine can call it, each call charged to the cron budget as this
    profile (every bulk request is, when a budget is configured here)."""
    from . import hermes

    clients, note = hermes.worker_clients(settings)
    return Served(clients, note, request_gate(settings) if clients else None)


def recover_at_start(settings: Settings) -> None:
    """Bulk starts in this Hermes process: items that workers which have since died left running
    go back to the queue, and jobs they were running wait for `/bulk run` (the seed: interrupted
    items return to the queue when Bulk next starts, and are sent again only after run). No
    worker starts here. Nothing is created where Bulk has no data yet."""
    location = parse_backend_url(settings.backend_url)
    if isinstance(location, SqliteUrl) and not location.path.exists():
        return
    backend = open_backend(settings)
    recover_interrupted(Liveness(backend.store, settings.home / "workers"))


def ensure_running(
    settings: Settings, backend: Backend, *, clients: dict[str, ClientFactory], gate: RequestGate
) -> WorkerRuntime:
    """The embedded worker for this backend, started if there is none (returns at once)."""
    global _atexit_registered
    with _lock:
        runtime = _runtimes.get(backend.url)
        if runtime is not None:
            return runtime
        _quiet_huey()
        runtime = WorkerRuntime(
            backend, settings, threads=settings.max_concurrency, clients=clients, request_gate=gate
        )
        runtime.start()
        runtime.start_embedded_consumer()
        _runtimes[backend.url] = runtime
        if not _atexit_registered:
            atexit.register(stop_all)
            _atexit_registered = True
        threading.Thread(
            target=_supervise,
            args=(backend.url, runtime),
            name="hermes-bulk-supervisor",
            daemon=True,
        ).start()
        log.info(
            "bulk: worker %s started in this process (%d threads) on %s",
            runtime.worker_id,
            runtime.threads,
            public_url(backend.url),
        )
        return runtime


def running(backend_url: str) -> WorkerRuntime | None:
    with _lock:
        return _runtimes.get(backend_url)


def stop_all() -> None:
    """Hermes is exiting: give items in progress back to the queue and deregister at once."""
    with _lock:
        runtimes = list(_runtimes.values())
        _runtimes.clear()
    for runtime in runtimes:
        try:
            runtime.stop(graceful=False)
        except Exception:  # exiting anyway; the next run recovers what is left (lock files, leases)
            log.exception("bulk: stopping worker %s", runtime.worker_id)


def has_work(runtime: WorkerRuntime) -> bool:
    """A job this runtime serves is running with items left, or it still holds items."""
    store = runtime.backend.store
    for job_id in store.active_job_ids():
        job = store.get_job(job_id)
        if job is not None and job.spec.client in runtime.clients and (job.pending or job.running):
            return True
    return runtime.worker_id in store.item_owners()


def _supervise(url: str, runtime: WorkerRuntime) -> None:
    idle_since: float | None = None
    while True:
        time.sleep(SUPERVISE_EVERY_S)
        try:
            busy = has_work(runtime)
        except Exception:  # the backend is unreachable for now: keep the workers, ask again
            log.warning("bulk: cannot check for work on %s", public_url(url), exc_info=True)
            busy = True
        if busy:
            idle_since = None
            continue
        idle_since = idle_since or time.monotonic()
        if time.monotonic() - idle_since < IDLE_STOP_S:
            continue
        with _lock:
            if _runtimes.get(url) is not runtime:
                return  # stopped at exit
            del _runtimes[url]  # from here on, ensure_running starts a fresh runtime
        runtime.stop(graceful=True)
        log.info("bulk: worker %s stopped: no work for %.0f s", runtime.worker_id, IDLE_STOP_S)
        return


def _quiet_huey() -> None:
    """Huey logs every task at INFO; in Hermes' log that is a line per item. Warnings still show."""
    huey_log = logging.getLogger("huey")
    if huey_log.level == logging.NOTSET:
        huey_log.setLevel(logging.WARNING)
