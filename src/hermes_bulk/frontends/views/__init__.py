"""What users read, by what is shown; every name is here too, so `views.status_text` reads as one
place from the front ends.

status.py      the status block of one job (its batches, concurrency, limits, waits)
next_steps.py  whether a job has ended, the notice when it does, the command that moves it on
workers.py     who is live and what each worker serves; which worker a job needs
create.py      what create says: the job made, or a dry run's plan and first request
money.py       what a job costs, in words: estimates, spend, limits' warnings
items.py       one item (`show`), failed items, the event lines
job_list.py    the recent jobs: plain lines, or a table
progress.py    watching a job run: the live bar, plain progress lines, what Ctrl-C says
times.py       how times and durations read
"""

from __future__ import annotations

from .create import SCREENFUL_CHARS, SCREENFUL_LINES, created_text, plan_text, screenful
from .items import event_lines, failed_text, item_error, show_text
from .job_list import jobs_table, jobs_text
from .money import (
    cache_cost_line,
    cost_estimate_line,
    cost_limit_warning,
    cost_line,
    spent,
    unkept_line,
    worst_case_line,
)
from .next_steps import FINAL_STATES, end_notice, has_ended
from .progress import (
    PROGRESS_LINE_EVERY_S,
    abandoned_line,
    follow,
    follow_lines,
    progress_line,
    stopped_line,
    stopping_lines,
)
from .status import (
    BATCHES_SHOWN,
    batch_lines,
    concurrency_line,
    concurrency_notes,
    request_line,
    status_text,
)
from .times import format_seconds, short_time
from .workers import serves_words, worker_command, worker_wanted, workers_live, workers_table

__all__ = [
    "BATCHES_SHOWN",
    "FINAL_STATES",
    "PROGRESS_LINE_EVERY_S",
    "SCREENFUL_CHARS",
    "SCREENFUL_LINES",
    "abandoned_line",
    "batch_lines",
    "cache_cost_line",
    "concurrency_line",
    "concurrency_notes",
    "cost_estimate_line",
    "cost_limit_warning",
    "cost_line",
    "created_text",
    "end_notice",
    "event_lines",
    "failed_text",
    "follow",
    "follow_lines",
    "format_seconds",
    "has_ended",
    "item_error",
    "jobs_table",
    "jobs_text",
    "plan_text",
    "progress_line",
    "request_line",
    "screenful",
    "serves_words",
    "short_time",
    "show_text",
    "spent",
    "status_text",
    "stopped_line",
    "stopping_lines",
    "unkept_line",
    "worker_command",
    "worker_wanted",
    "workers_live",
    "workers_table",
    "worst_case_line",
]
