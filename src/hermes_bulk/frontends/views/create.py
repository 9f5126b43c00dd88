"""What create says: the job it made, or with --dry-run the job it would make and its first
request."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ...jobs import prices
from ...words import count, plural
from .money import cost_estimate_line, cost_limit_warning, worst_case_line

if TYPE_CHECKING:
    from ...jobs.creating import Created, Plan


def created_text(created: Created, run_command: str) -> str:
    job = created.job
    if job.reused:  # "with 1,010 items: 1,000 answered before (reused), 10 to run."
        lines = [
            f"Created job {job.job_id} with {job.total:,} {plural(job.total, 'item')}: "
            f"{job.reused:,} answered before (reused), {job.total - job.reused:,} to run."
        ]
    else:
        lines = [f"Created job {job.job_id} with {count(job.total, 'item')}."]
    if job.skipped:
        reasons: dict[str, int] = {}
        for s in created.skipped:
            reasons[s.reason] = reasons.get(s.reason, 0) + 1
        shown = ", ".join(f"{r}: {n}" for r, n in sorted(reasons.items()))
        more = "" if job.skipped <= len(created.skipped) else ", …"
        lines.append(
            f"Left out {count(job.skipped, 'entry')} ({shown}{more}); each is listed in the "
            "job's events."
        )
    if job.worst_tokens:
        lines.append(worst_case_line(job.worst_tokens, job.spec.output_bound))
    cost = prices.job_cost(job)
    lines.append(cost_estimate_line(cost))
    lines += cost_limit_warning(job.spec.max_cost, cost.estimated)
    limit = job.spec.max_tokens
    if limit is not None and limit < job.estimated_tokens:
        lines.append(
            f"Warning: --max-tokens {limit} is below the estimate of {job.estimated_tokens:,} "
            "tokens for "
            "the whole job: it will pause at the limit; resume it then with a larger --max-tokens."
        )
    if job.finished:  # every item was answered before (reused): there is nothing to run
        lines.append(
            f"Nothing to run: the job is completed. Export it with: "
            f"{run_command.rsplit(' ', 1)[0]} export {job.job_id}"
        )
    else:
        lines.append(f"Start it with: {run_command} {job.job_id}")
    return "\n".join(lines)


#: create --dry-run shows the first request cut to about a screenful (an item may be megabytes)
SCREENFUL_LINES = 40
SCREENFUL_CHARS = 3000


def screenful(text: str) -> tuple[str, int]:
    """text cut to SCREENFUL_LINES lines and SCREENFUL_CHARS characters, and how many
    characters were left out."""
    cut = "\n".join(text.splitlines()[:SCREENFUL_LINES])[:SCREENFUL_CHARS]
    return cut, len(text) - len(cut)


def plan_text(plan: Plan, *, full: bool = False) -> str:
    """create --dry-run: nothing was created; what the job would be and its first request (about
    a screenful of it, unless full)."""
    left_out = f" ({count(plan.skipped, 'entry')} left out)" if plan.skipped else ""
    not_asked = [
        f"{plan.reused} answered before (reused)" if plan.reused else "",
        f"{count(plan.repeats, 'repeat')} of an item before them" if plan.repeats else "",
    ]
    split = ", ".join([*filter(None, not_asked), f"{plan.to_run} to run"])
    basis = (
        f"as job {plan.allowance_from} learned"
        if plan.allowance_from
        else "a default; a running job learns the real figure from its answers"
    )
    lines = [
        f"Dry run: no job created. {count(plan.items, 'item')}{left_out}"
        + (f": {split}." if plan.to_run < plan.items else "."),
        "Estimated tokens for "
        + ("the whole job" if plan.to_run == plan.items else f"the {plan.to_run} to run")
        + f": {plan.estimated_tokens:,} (allowing {plan.output_allowance:,} output tokens an item; "
        f"{basis})",
        worst_case_line(plan.worst_tokens, plan.output_bound),
    ]
    lines.append(
        cost_estimate_line(
            prices.JobCost(
                plan.price,
                plan.price_unknown,
                estimated=plan.estimated_cost_usd,
                worst_case=plan.worst_case_cost_usd,
            )
        )
    )
    if plan.max_tokens is not None and plan.max_tokens < plan.estimated_tokens:
        lines.append(
            f"Warning: --max-tokens {plan.max_tokens} is below this estimate: the job would pause "
            "at the limit; resume it then with a larger --max-tokens."
        )
    lines += cost_limit_warning(plan.max_cost, plan.estimated_cost_usd)
    lines.append(f"The request for the first item ({plan.first_item}):")
    request = json.dumps(plan.request, indent=2, ensure_ascii=False)
    shown, left_out = (request, 0) if full else screenful(request)
    lines.append(shown)
    if left_out:
        lines.append(f"… and {count(left_out, 'more character')}: --full shows the whole request.")
    return "\n".join(lines)
