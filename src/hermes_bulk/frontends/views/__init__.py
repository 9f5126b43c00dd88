"""What users read, by what is shown; every name is here too, so `views.status_text` reads as one
place from the front ends. A name's module is imported when the name is first used: `list` loads
the job list, not the status block or the live bar (docs/benchmarks.md, row 7).

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

import importlib

#: Each public name and the module of this package that defines it.
HOMES: dict[str, str] = {
    **dict.fromkeys(
        ("SCREENFUL_CHARS", "SCREENFUL_LINES", "created_text", "plan_text", "screenful"), "create"
    ),
    **dict.fromkeys(("event_lines", "failed_text", "item_error", "show_text"), "items"),
    **dict.fromkeys(("jobs_table", "jobs_text"), "job_list"),
    **dict.fromkeys(
        (
            "cache_cost_line",
            "cost_estimate_line",
            "cost_limit_warning",
            "cost_line",
            "spent",
            "unkept_line",
            "worst_case_line",
        ),
        "money",
    ),
    **dict.fromkeys(("FINAL_STATES", "end_notice", "has_ended"), "next_steps"),
    **dict.fromkeys(
        (
            "PROGRESS_LINE_EVERY_S",
            "abandoned_line",
            "follow",
            "follow_lines",
            "progress_line",
            "stopped_line",
            "stopping_lines",
        ),
        "progress",
    ),
    **dict.fromkeys(
        (
            "BATCHES_SHOWN",
            "batch_lines",
            "concurrency_line",
            "concurrency_notes",
            "request_line",
            "status_text",
        ),
        "status",
    ),
    **dict.fromkeys(("format_seconds", "short_time"), "times"),
    **dict.fromkeys(
        ("serves_words", "worker_command", "worker_wanted", "workers_live", "workers_table"),
        "workers",
    ),
}

__all__ = sorted(HOMES)


def __getattr__(name: str):
    if name not in HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{HOMES[name]}", __name__), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(HOMES))
