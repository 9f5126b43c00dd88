"""What users read: the status block, job and worker tables, and the live progress view.

The status block is plain text in the seed's shape, so `/bulk status` (a chat reply) and
`hermes-bulk status` say the same thing; tables and progress bars use rich in a terminal.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from . import hints
from .jobs import Created, Jobs, JobStatus, state_label
from .store.protocol import PAUSE_TOKEN_LIMIT, Event, WorkerInfo

FINAL_STATES = ("completed", "completed_with_errors", "failed")


def _clock(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts).strftime("%H:%M:%S")


def created_text(created: Created, run_command: str) -> str:
    job = created.job
    lines = [f"Created job {job.job_id} with {job.total} items."]
    if job.skipped:
        reasons: dict[str, int] = {}
        for s in created.skipped:
            reasons[s.reason] = reasons.get(s.reason, 0) + 1
        shown = ", ".join(f"{r}: {n}" for r, n in sorted(reasons.items()))
        more = "" if job.skipped <= len(created.skipped) else ", …"
        lines.append(f"Left out {job.skipped} entries ({shown}{more}); each is listed in the job's events.")
    lines.append(f"Start it with: {run_command} {job.job_id}")
    return "\n".join(lines)


def status_text(st: JobStatus, *, tokens_source: str = "the provider", cmd: str = "hermes-bulk") -> str:
    """The status block (the seed's shape, plus what the user needs to act)."""
    j, spec = st.job, st.job.spec
    summary = {"processing": "running", "not_started": "not started"}.get(st.state, state_label(st.state))
    # With no worker alive, items still marked running are not running: they were interrupted,
    # and go back to the queue when Bulk next starts or the job is run.
    running = f"{j.running} interrupted" if st.state == "awaiting_recovery" and j.running else f"{j.running} running"
    lines = [
        f"Job {j.job_id}: {summary}",
        f"State: {state_label(st.state)}",
        f"Items: {j.completed}/{j.total} completed, {j.failed} failed, {j.pending} pending, {running}",
        f"Actual tokens (reported by {tokens_source}): {j.tokens_in} in, {j.tokens_out} out",
        f"Estimated tokens for the whole job: {j.estimated_tokens}",
        concurrency_line(st),
    ]
    lines += concurrency_notes(st)
    if spec.max_tokens is not None:
        lines.append(f"Token limit: {spec.max_tokens} ({j.tokens_charged} charged, {j.tokens_reserved} reserved)")
    if st.rate_limit and st.state == "processing":
        lines.append(f"Waiting on a rate limit until {_clock(st.rate_limit.until)} (all workers wait together)")
    if st.budget_held_until:
        lines.append(f"Waiting for the request budget: the window reopens at {_clock(st.budget_held_until)} "
                     "(requests are kept for chat)")
    lines += _next_step(st, cmd)
    if j.skipped:
        lines.append(f"Left out at create: {j.skipped} entries")
    if st.events:
        lines.append("Events:")
        lines += ["  " + line for line in event_lines(st.events)]
    return "\n".join(lines)


def concurrency_line(st: JobStatus) -> str:
    line = f"Concurrency: up to {st.concurrency} items at once"
    if st.concurrency < st.job.spec.concurrency:
        line += f" (the job asks for {st.job.spec.concurrency}; max_concurrency is {st.max_concurrency})"
    return line


def concurrency_notes(st: JobStatus) -> list[str]:
    """When the setting changed under running workers: what is in force, and when the new value is."""
    now, in_force = st.max_concurrency_setting, st.max_concurrency
    if now is None or in_force is None or now == in_force:
        return []
    return [f"max_concurrency is now {now}; the workers running this job started with {in_force} and keep it "
            "until they stop. The new value applies when workers next start."]


def _next_step(st: JobStatus, cmd: str) -> list[str]:
    """The command to act on the job, one that works where the status is shown (hints.py)."""
    j = st.job
    if st.state == "paused":
        if j.pause_reason == PAUSE_TOKEN_LIMIT:
            return [f"Paused: token limit reached. Continue with: {hints.process(j, 'resume', cmd, '--max-tokens <n>')}"]
        return [f"Paused. Continue with: {hints.process(j, 'resume', cmd)}"]
    if st.state == "awaiting_recovery":
        return ["No worker is running this job. Items that were in progress when its workers stopped go back to "
                "the queue and are sent again only when the job runs.",
                f"Continue with: {hints.process(j, 'run', cmd)}"]
    if st.state == "not_started":
        return [f"Start it with: {hints.process(j, 'run', cmd)}"]
    if st.state in ("completed_with_errors", "failed"):
        return [f"Return failed items to the queue with: {hints.process(j, 'retry', cmd)}"]
    return []


def event_lines(events: list[Event]) -> list[str]:
    lines = []
    for e in events:
        where = f" item {e.item_index + 1}" if e.item_index is not None else ""
        status = f" HTTP {e.http_status}" if e.http_status else ""
        lines.append(f"{_clock(e.at)} {e.kind}{where}{status}: {e.message}")
    return lines


def jobs_text(statuses: list[JobStatus], *, cmd: str = "hermes-bulk") -> str:
    """The most recent jobs as plain lines (a chat reply has no tables)."""
    if not statuses:
        return f'No jobs yet. Create one with: {cmd} "<instruction>" --over PATH'
    lines = ["Recent jobs (newest first):"]
    for st in statuses:
        j = st.job
        instruction = j.spec.instruction.replace("\n", " ")
        instruction = instruction if len(instruction) <= 40 else instruction[:39] + "…"
        lines.append(f"{j.job_id}  {state_label(st.state)}  {j.completed}/{j.total} completed, {j.failed} failed  "
                     f"{datetime.datetime.fromtimestamp(j.created_at).strftime('%Y-%m-%d %H:%M')}  {instruction}")
    lines.append(f"Details of one job: {cmd} status <job_id>")
    return "\n".join(lines)


def jobs_table(statuses: list[JobStatus]) -> Table:
    table = Table(title="Bulk jobs (newest first)")
    for col, kw in (("job", {"no_wrap": True}), ("state", {"no_wrap": True}), ("done", {"justify": "right"}),
                    ("failed", {"justify": "right"}), ("total", {"justify": "right"}), ("created", {"no_wrap": True}),
                    ("instruction", {"overflow": "ellipsis", "no_wrap": True, "max_width": 40})):
        table.add_column(col, **kw)
    for st in statuses:
        j = st.job
        table.add_row(j.job_id, state_label(st.state), str(j.completed), str(j.failed), str(j.total),
                      datetime.datetime.fromtimestamp(j.created_at).strftime("%Y-%m-%d %H:%M"),
                      j.spec.instruction.replace("\n", " "))
    return table


def workers_table(workers: list[WorkerInfo], now: float) -> Table:
    table = Table(title="Live workers")
    for col in ("worker", "host", "pid", "threads", "up", "last seen", "holding"):
        table.add_column(col)
    for w in workers:
        holding = ", ".join(f"{job}#{idx + 1}" for job, idx in w.holding[:6]) + (" …" if len(w.holding) > 6 else "")
        table.add_row(w.worker_id, w.host, str(w.pid), str(w.threads), f"{now - w.started_at:.0f}s",
                      f"{now - w.heartbeat_at:.1f}s ago", holding or "-")
    return table


def follow(jobs: Jobs, job_id: str, console: Console, *, until: Callable[[JobStatus], bool],
           interval_s: float = 0.5) -> JobStatus:
    """A live progress bar until `until(status)`; returns the last status."""
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(job_id, total=None, detail="")
        while True:
            st = jobs.status(job_id)
            j = st.job
            detail = f"{j.failed} failed, {j.running} running, {j.tokens_in + j.tokens_out} tokens"
            if st.rate_limit:
                detail += f", rate limited until {_clock(st.rate_limit.until)}"
            progress.update(task, total=j.total, completed=j.completed + j.failed,
                            description=f"{job_id} {state_label(st.state)}", detail=detail)
            if until(st):
                return st
            time.sleep(interval_s)
