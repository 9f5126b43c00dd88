"""What the dashboard's pages show, as plain dicts (the JSON API), read through the jobs API.

Every figure comes from the job's counters, its newest events, its first failed items
(`failed_items`: the store reads no other item) and the worker registry, so a page costs the
same over a million items as over ten. Rates, times to finish and the chart come from samples
of each job's counters that this process takes every SAMPLE_EVERY_S and keeps in memory for
HISTORY_S: the store holds no history of counts, and a read must not write one (DESIGN.md
invariant 13). A dashboard started a minute ago has a minute of history.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from ...errors import HermesBulkError
from ...fleet.liveness import answering, heartbeat_interval
from ...jobs import prices
from ...jobs.service import Jobs, JobStatus, missing_database, state_label
from ...store.protocol import JobRecord
from ..views import item_error

log = logging.getLogger("hermes_bulk.frontends.dashboard")

SAMPLE_EVERY_S = 2.0  #: how often the counters of the jobs shown are sampled
HISTORY_S = 3600.0  #: samples kept per job (the chart's span)
RATE_WINDOW_S = 300.0  #: items per minute are measured over the last five minutes
MIN_RATE_SPAN_S = 4.0  #: no rate is shown from samples closer together than this
JOBS_SHOWN = 50
EVENTS_SHOWN = 30
FAILED_SHOWN = 50
HOLDING_SHOWN = 10
INSTRUCTION_CHARS = 300


class Samples:
    """(time, completed, failed) of each job seen, the last HISTORY_S of them, in memory."""

    def __init__(self, history_s: float = HISTORY_S) -> None:
        self.history_s = history_s
        self._by_job: dict[str, deque[tuple[float, int, int]]] = {}
        self._lock = threading.Lock()

    def add(self, job: JobRecord, at_s: float) -> None:
        with self._lock:
            series = self._by_job.setdefault(job.job_id, deque())
            if series and at_s - series[-1][0] < 1.0:  # several requests in one second: one sample
                series[-1] = (series[-1][0], job.completed, job.failed)
            else:
                series.append((at_s, job.completed, job.failed))
            while series and series[0][0] < at_s - self.history_s:
                series.popleft()

    def series(self, job_id: str) -> list[tuple[float, int, int]]:
        with self._lock:
            return list(self._by_job.get(job_id, ()))

    def per_minute(
        self, job_id: str, now_s: float, window_s: float = RATE_WINDOW_S
    ) -> float | None:
        """Items settled (completed or failed) per minute over the last window_s, or None when
        the samples span less than MIN_RATE_SPAN_S."""
        recent = [s for s in self.series(job_id) if s[0] >= now_s - window_s]
        if len(recent) < 2 or recent[-1][0] - recent[0][0] < MIN_RATE_SPAN_S:
            return None
        (t0, c0, f0), (t1, c1, f1) = recent[0], recent[-1]
        return max((c1 + f1) - (c0 + f0), 0) * 60.0 / (t1 - t0)

    def forget_except(self, job_ids: set[str]) -> None:
        with self._lock:
            for job_id in set(self._by_job) - job_ids:
                del self._by_job[job_id]


class Figures:
    """The read side of the dashboard over one Jobs (and so one backend)."""

    def __init__(self, jobs: Jobs, *, clock: Callable[[], float] = time.time) -> None:
        self.jobs, self.clock = jobs, clock
        self.samples = Samples()
        self._viewed: dict[str, float] = {}  # job id -> when its page was last asked for
        self._stop = threading.Event()

    # Sampling ---------------------------------------------------------------------------------
    def sample(self) -> None:
        """One sample of the jobs the list shows and of the jobs whose page was open lately."""
        now = self.clock()
        statuses = self.jobs.list(JOBS_SHOWN)
        for st in statuses:
            self.samples.add(st.job, now)
        seen = {st.job.job_id for st in statuses}
        for job_id, viewed_at in list(self._viewed.items()):
            if viewed_at < now - HISTORY_S:
                del self._viewed[job_id]
            elif job_id not in seen and (job := self.jobs.store.get_job(job_id)) is not None:
                self.samples.add(job, now)
        self.samples.forget_except(seen | set(self._viewed))

    def start_sampling(self, every_s: float = SAMPLE_EVERY_S) -> threading.Thread:
        def loop() -> None:
            while not self._stop.is_set():
                try:
                    self.sample()
                except (
                    Exception
                ) as exc:  # a backend outage must not end the sampling: the pages say it
                    log.warning("dashboard: sampling failed (%s)", type(exc).__name__)
                self._stop.wait(every_s)

        thread = threading.Thread(target=loop, name="hermes-bulk-dashboard-sampler", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

    # Pages ------------------------------------------------------------------------------------
    def jobs_page(self) -> dict:
        now = self.clock()
        statuses = self.jobs.list(JOBS_SHOWN)
        for st in statuses:
            self.samples.add(st.job, now)
        return {"now": now, "jobs": [self._job_row(st, now) for st in statuses]}

    def job_page(self, job_id: str) -> dict:
        """One job (by its exact id); JobNotFound when there is none."""
        now = self.clock()
        st = self.jobs.status(job_id, events=EVENTS_SHOWN)
        self._viewed[st.job.job_id] = now
        self.samples.add(st.job, now)
        failed = self.jobs.failed_items(st.job.job_id, FAILED_SHOWN) if st.job.failed else []
        return {
            "now": now,
            "job": self._job_row(st, now),
            "series": self.samples.series(st.job.job_id),
            "events": [
                {
                    "at": e.at,
                    "kind": e.kind,
                    "message": e.message,
                    "error_type": e.error_type,
                    "http_status": e.http_status,
                    "item": None
                    if e.item_index is None
                    else st.event_names.get(e.item_index, f"item {e.item_index + 1}"),
                }
                for e in reversed(st.events)
            ],
            "failed_items": [
                {
                    "number": i.index + 1,
                    "name": i.name,
                    "error": item_error(i),
                    "attempts": i.attempts,
                }
                for i in failed
            ],
            "failed_shown": len(failed),
        }

    def workers_page(self) -> dict:
        if (
            missing_database(self.jobs.settings) is not None
        ):  # no database: no worker ever started here
            return {"now": self.clock(), "workers": [], "heartbeat_s": None}
        store = self.jobs.store
        now = store.now()
        beat_s = heartbeat_interval(self.jobs.settings.lease_seconds)
        workers = []
        for w in sorted(store.live_workers(), key=lambda w: (w.host, w.worker_id)):
            age_s = max(now - w.heartbeat_at, 0.0)
            workers.append(
                {
                    "id": w.worker_id,
                    "host": w.host,
                    "pid": w.pid,
                    "threads": w.threads,
                    "started_at": w.started_at,
                    "heartbeat_at": w.heartbeat_at,
                    "heartbeat_age_s": age_s,
                    "answering": answering(w, now, heartbeat_s=beat_s),
                    "holding": len(w.holding),
                    "holding_shown": [
                        f"{job}#{index + 1}" for job, index in w.holding[:HOLDING_SHOWN]
                    ],
                }
            )
        return {"now": now, "workers": workers, "heartbeat_s": beat_s}

    def _job_row(self, st: JobStatus, now: float) -> dict:
        j = st.job
        row = st.as_dict()  # the `status --json` shape, and what a page adds to it
        row["instruction"] = j.spec.instruction[:INSTRUCTION_CHARS]
        settled = j.completed + j.failed
        rate = self.samples.per_minute(j.job_id, now)
        left = max(j.total - settled, 0)
        processing = st.state == "processing"
        waiting = (
            st.rate_limit.until
            if st.rate_limit and st.rate_limit.until > now and processing
            else None
        )
        row.update(
            {
                "state_label": state_label(st.state),
                "progress": settled / j.total if j.total else 0.0,
                "items_per_minute": rate,
                "eta_s": left * 60.0 / rate if rate and left and processing else None,
                "tokens_used": j.tokens_charged,
                "cost_shown": cost_shown(prices.job_cost(j)),
                "rate_limited_until": waiting,
                "actions": {
                    "pause": not j.finished
                    and st.state
                    in ("not_started", "processing", "waiting_for_worker", "awaiting_recovery"),
                    "resume": st.state == "paused",
                    "retry": j.failed > 0,
                },
            }
        )
        return row


def cost_shown(cost: prices.JobCost) -> str:
    """A job's money as the pages show it: "$0.12 of about $0.40 (at most $1.60)", or
    "unknown" (status says why)."""
    if cost.spent is None or cost.estimated is None:
        return "unknown"
    shown = f"{prices.format_usd(cost.spent)} of about {prices.format_usd(cost.estimated)}"
    if cost.worst_case is None:
        return shown
    return f"{shown} (at most {prices.format_usd(cost.worst_case)})"


def describe_failure(exc: BaseException) -> str:
    """What a page shows when the backend could not answer: our own message, never a traceback."""
    return (
        str(exc)
        if isinstance(exc, HermesBulkError)
        else f"the backend could not answer ({type(exc).__name__})"
    )
