"""The recent jobs: plain lines for a chat reply, a table for a terminal."""

from __future__ import annotations

import datetime
import time

from ...jobs import hints
from ...jobs.service import JobStatus, state_label
from ..terminal import Column, Table
from .money import spent
from .times import short_time


def jobs_text(statuses: list[JobStatus], *, cmd: str = "hermes-bulk") -> str:
    """The most recent jobs as plain lines (a chat reply has no tables)."""
    if not statuses:
        return f"No jobs yet. Create one with: {hints.create(cmd)}"
    lines = ["Recent jobs (newest first):"]
    for st in statuses:
        j = st.job
        instruction = j.spec.instruction.replace("\n", " ")
        instruction = instruction if len(instruction) <= 40 else instruction[:39] + "…"
        lines.append(
            f"{j.job_id}  {state_label(st.state)}  {j.completed}/{j.total} completed, {j.failed} "
            f"failed, {spent(j)}  "
            f"{datetime.datetime.fromtimestamp(j.created_at).strftime('%Y-%m-%d %H:%M')}  "
            f"{instruction}"
        )
    lines.append(f"Details of one job: {cmd} status <job_id>")
    return "\n".join(lines)


def jobs_table(statuses: list[JobStatus]) -> Table:
    # Every column no_wrap but the state: rich squeezes wrappable columns first, and would squeeze
    # the counts out at 80 columns.
    table = Table(
        "Bulk jobs (newest first)",
        [
            Column("job"),
            Column("state", no_wrap=False),
            Column("done", "right"),  # "completed/total": room for the cost in 80 columns
            Column("failed", "right"),
            Column("cost", "right"),
            Column("created"),
            Column("instruction", max_width=40),
        ],
    )
    for st in statuses:
        j = st.job
        table.rows.append(
            [
                j.job_id,
                state_label(st.state),
                f"{j.completed}/{j.total}",
                str(j.failed),
                spent(j),
                short_time(j.created_at, time.time()),
                j.spec.instruction.replace("\n", " "),
            ]
        )
    return table
