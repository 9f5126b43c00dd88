"""What users read: the status block, job and worker tables, and the live progress view.

The status block is plain text in the seed's shape, so `/bulk status` (a chat reply) and
`hermes-bulk status` say the same thing; tables and progress bars use rich in a terminal.
"""

from __future__ import annotations

import datetime
import json
import shlex
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..durations import zoned_clock
from ..fleet.liveness import (
    NO_BATCHES,
    ONLY_OTHER_JOB,
    OTHER_CREDENTIALS,
    OTHER_ENDPOINT,
    OTHER_KIND,
    answering,
    offer,
)
from ..jobs import hints, model_options, prices
from ..jobs.service import Created, ItemShown, Jobs, JobStatus, Plan, next_poll, state_label
from ..store.protocol import (
    INTERRUPTED_WORKER_STOP,
    PAUSE_COST_LIMIT,
    PAUSE_SAMPLE,
    PAUSE_TOKEN_LIMIT,
    PAUSE_USER,
    RUNNING,
    Event,
    ItemRecord,
    JobSpec,
    WorkerInfo,
)
from ..words import count, plural
from .terminal import Column, Table

if TYPE_CHECKING:  # rich is loaded for a table or a bar, not for a line of text
    from rich.console import Console

FINAL_STATES = ("completed", "completed_with_errors", "failed")


def has_ended(st: JobStatus) -> bool:
    """Finished, or paused (by a user, or at its token limit): nothing more happens by itself."""
    return st.state in FINAL_STATES or st.state == "paused"


#: A job paused at a limit: how the end notice says so, and the flag its resume needs.
_LIMIT_PAUSES = {
    PAUSE_TOKEN_LIMIT: ("paused at its token limit", " --max-tokens <n>"),
    PAUSE_COST_LIMIT: ("paused at its cost limit", " --max-cost <usd>"),
}


def end_notice(st: JobStatus, cmd: str) -> str:
    """How a job ended, and on a line of its own what to do next (each fits 80 columns)."""
    j = st.job
    done = f"{j.completed:,}/{count(j.total, 'item')} completed, {j.failed:,} failed"
    if st.state == "paused":
        why, flag = _LIMIT_PAUSES.get(j.pause_reason, ("paused", ""))
        if j.pause_reason == PAUSE_SAMPLE:
            why = "answered its sample and paused"
        elif j.pause_reason and j.pause_reason not in (*_LIMIT_PAUSES, PAUSE_USER):
            why = f"paused: {j.pause_reason}"
        hint = f"{cmd} resume {j.job_id}{flag}"
        return f"Job {j.job_id} {why} ({done}).\nContinue with: {hint}"
    hint = f"{cmd} retry {j.job_id}" if j.failed else f"{cmd} export {j.job_id}"
    return f"Job {j.job_id} ended: {state_label(st.state)} ({done}).\nNext: {hint}"


def _clock(at_s: float, now_s: float | None = None) -> str:
    """A local time; with its date when that is not today (a window reopening tomorrow at 09:28)."""
    when = datetime.datetime.fromtimestamp(at_s)
    today = datetime.datetime.fromtimestamp(time.time() if now_s is None else now_s).date()
    return when.strftime("%H:%M:%S" if when.date() == today else "%Y-%m-%d %H:%M:%S")


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


def cost_limit_warning(max_cost: int | None, estimated: float | None) -> list[str]:
    """A warning when --max-cost (nano-USD) is below the job's estimate (USD)."""
    if max_cost is None or estimated is None or prices.usd(max_cost) >= estimated:
        return []
    return [
        f"Warning: --max-cost {prices.format_usd(prices.usd(max_cost))} is below the estimate: "
        "the job will pause at the limit; resume it then with a larger --max-cost."
    ]


def cost_estimate_line(cost: prices.JobCost) -> str:
    """What the job would cost, at which price; or why that is not known."""
    if cost.price is None or cost.estimated is None:
        return f"Estimated cost: unknown ({cost.unknown})"
    return (
        f"Estimated cost: about {prices.format_usd(cost.estimated)}"
        + _at_most(cost)
        + f" at {prices.describe(cost.price)}"
    )


def _at_most(cost: prices.JobCost) -> str:
    """ ", at most $Y" when the job's worst case is known (prices.JobCost.worst_case)."""
    if cost.worst_case is None:
        return ""
    return f", at most {prices.format_usd(cost.worst_case)}"


def cost_line(cost: prices.JobCost) -> str:
    """status: spent, the whole job's estimate, and what reuse and the batch price saved."""
    if cost.price is None or cost.spent is None or cost.estimated is None:
        return f"Cost: unknown ({cost.unknown})"
    saved = [
        f"{prices.format_usd(amount)} by {how}"
        for amount, how in ((cost.saved_by_reuse, "reuse"), (cost.saved_by_batch, "batch"))
        if amount
    ]
    return (
        f"Cost: {prices.format_usd(cost.spent)} so far, about "
        f"{prices.format_usd(cost.estimated)}{_at_most(cost)} for the whole job"
        + (f"; saved {' and '.join(saved)}" if saved else "")
        + f" (at {prices.describe(cost.price)})"
    )


def unkept_line(j, cost: prices.JobCost) -> list[str]:
    """status, once the provider billed answers that were not kept (truncated, invalid,
    refused): what they cost, part of the cost above; their tokens where there is no price."""
    if not j.tokens_unkept:
        return []
    if cost.unkept is None:
        return [f"Of the tokens charged, {j.tokens_unkept:,} were spent on answers not kept"]
    return [
        f"Of that, {prices.format_usd(cost.unkept)} spent on answers not kept "
        f"({j.tokens_unkept:,} tokens)"
    ]


def _cache_tokens(j) -> str:
    """ " (800 from the prompt cache, 300 written to it)": of the input tokens."""
    parts = [f"{j.tokens_cached:,} from the prompt cache"] if j.tokens_cached else []
    if j.tokens_written:
        parts.append(f"{j.tokens_written:,} written to {'it' if parts else 'the prompt cache'}")
    return f" ({', '.join(parts)})" if parts else ""


def cache_cost_line(j, cost: prices.JobCost) -> list[str]:
    """status, when the prompt cache was used and the job has a price: what its reads cost and
    saved, and what its writes cost."""
    if cost.price is None or not (j.tokens_cached or j.tokens_written):
        return []
    parts = []
    if j.tokens_cached and cost.cache_read is not None:
        parts.append(
            f"{prices.format_usd(cost.cache_read)} for {j.tokens_cached:,} tokens read"
            + (f" (saving {prices.format_usd(cost.cache_saved)})" if cost.cache_saved else "")
        )
    if j.tokens_written and cost.cache_written is not None:
        parts.append(f"{prices.format_usd(cost.cache_written)} for {j.tokens_written:,} written")
    return [f"Prompt cache: {', '.join(parts)}"]


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


def worst_case_line(tokens: int, output_bound: int) -> str:
    """What every claim reserves, summed: the bound --max-tokens and --max-cost are kept by."""
    return (
        f"At most {tokens:,} tokens (each item once: its input bytes, max_tokens {output_bound:,})"
    )


def _estimate_basis(j) -> str:
    if j.projected_tokens == j.estimated_tokens:
        return f" (allowing {j.spec.output_tokens_estimate:,} output tokens an item, a default)"
    return (
        f" (learned from {count(j.answered, 'completed item')}: {j.output_allowance:,} output "
        "tokens expected an item)"
    )


def status_text(
    st: JobStatus, *, tokens_source: str = "the provider", cmd: str = "hermes-bulk"
) -> str:
    """The status block (the seed's shape, plus what the user needs to act)."""
    j, spec = st.job, st.job.spec
    summary = {"processing": "running", "not_started": "not started"}.get(
        st.state, state_label(st.state)
    )
    # With no worker alive, items still marked running are not running: they were interrupted,
    # and go back to the queue when Bulk next starts or the job is run.
    running = (
        f"{j.running:,} interrupted"
        if st.state == "awaiting_recovery" and j.running
        else f"{j.running:,} in provider batches"
        if spec.mode == "batch" and not any(b.run_rest_live for b in st.batches)
        else f"{j.running:,} running"
    )
    lines = [
        f"Job {j.job_id}: {summary}",
        f"State: {state_label(st.state)}",
        f"Items: {j.completed:,}/{j.total:,} completed, {j.failed:,} failed, "
        f"{j.pending:,} pending, {running}",
        f"Actual tokens (reported by {tokens_source}): {j.tokens_in:,} in"
        + _cache_tokens(j)
        + f", {j.tokens_out:,} out",
        f"Estimated tokens for the whole job: {j.projected_tokens:,}{_estimate_basis(j)}",
        *([worst_case_line(j.worst_tokens, spec.output_bound)] if j.worst_tokens else []),
        cost_line(prices.job_cost(j)),
        *unkept_line(j, prices.job_cost(j)),
        *cache_cost_line(j, prices.job_cost(j)),
        *([concurrency_line(st)] if _sent_live(st) else []),
    ]
    if j.reused:
        lines.insert(
            4,
            f"Reused answers: {j.reused} of {count(j.total, 'item')} answered before, "
            f"{j.tokens_saved:,} tokens saved",
        )
    lines += concurrency_notes(st)
    if spec.mode == "batch":  # items "running" are in a provider batch
        lines += batch_lines(st)
    if spec.max_tokens is not None:
        lines.append(
            f"Token limit: {spec.max_tokens:,} ({j.tokens_charged:,} charged, "
            f"{j.tokens_reserved:,} reserved)"
        )
    if spec.max_cost is not None:
        usd = prices.format_usd
        lines.append(
            f"Cost limit: {usd(prices.usd(spec.max_cost))} ({usd(prices.usd(j.cost_nusd))} "
            f"spent, {usd(prices.usd(j.cost_reserved))} reserved)"
        )
    if j.sample:
        lines.append(
            f"Sample (run --sample): {count(len(j.sample), 'item')} spread over the job; it "
            "pauses once they have settled"
        )
    if request := request_line(spec):
        lines.append(request)
    if st.rate_limit and st.state == "processing":
        lines.append(
            f"Waiting on a rate limit until {zoned_clock(st.rate_limit.until)} (all workers wait "
            "together)"
        )
    if st.budget_held_until:
        from ..budget.windows import ZonedInstant  # here: a read command never loads the budget

        reopens = (
            st.budget_held_until
        )  # in the budget's zone, named, as the budget's status shows it
        reopens_at = reopens.shown() if isinstance(reopens, ZonedInstant) else _clock(reopens)
        lines.append(
            f"Waiting for the request budget: the window reopens at {reopens_at} "
            "(requests are kept for chat)"
        )
    lines += _next_step(st, cmd)
    if j.skipped:
        lines.append(f"Left out at create: {count(j.skipped, 'entry')}")
    if st.events:
        lines.append("Events:")
        lines += ["  " + line for line in event_lines(st.events, st.event_names)]
    return "\n".join(lines)


#: Open batches `status` shows a line each (the rest are counted).
BATCHES_SHOWN = 5


def batch_lines(st: JobStatus) -> list[str]:
    """A batch job's batches: how many, and for each open one what the provider last said, when
    it was asked and when it is asked next."""
    open_ = [b for b in st.batches if b.open]
    every = f"; polled every {format_seconds(st.poll_s)}" if st.poll_s else ""
    lines = [
        f"Mode: batch (the provider's Batch API): {count(len(st.batches), 'batch')}, "
        f"{len(open_)} open{every}"
    ]
    for b in open_[:BATCHES_SHOWN]:
        counts = f"{b.completed}/{b.items} answered" + (f", {b.failed} failed" if b.failed else "")
        when = f"polled {_clock(b.polled_at)}" if b.polled_at else "not polled yet"
        if (due := next_poll(b, st.poll_s)) is not None:
            when += f", next about {_clock(due)}"
        lines.append(
            f"  {b.provider_id or b.batch_id} {b.status.replace('_', ' ')}: {counts}; {when}"
        )
    if len(open_) > BATCHES_SHOWN:
        lines.append(f"  … and {len(open_) - BATCHES_SHOWN} more open")
    return lines


def stopping_lines(on_their_way: int, timeout_s: float) -> list[str]:
    """What the first Ctrl-C of `run --wait` says (each line fits 80 columns): that nothing new
    starts, how many answers on their way are saved first and for how long at most, and that a
    second Ctrl-C abandons them."""
    if not on_their_way:
        return ["Stopping: no new item starts, and no answer is on its way."]
    one = on_their_way == 1
    them = "the answer on its way is" if one else f"the {on_their_way:,} answers on their way are"
    return [
        f"Stopping: no new item starts; {them} saved first",
        f"(up to {format_seconds(timeout_s)}). Ctrl-C again to abandon "
        f"{'it: it' if one else 'them: they'} will be asked again.",
    ]


def stopped_line(on_their_way: int, saved: int, drained: bool, timeout_s: float) -> str:
    """How the wait for the answers on their way ended."""
    if not on_their_way:
        return "Stopped."
    of = f"{saved:,} of {count(on_their_way, 'answer')} saved"
    if not drained:
        return f"Stopped ({format_seconds(timeout_s)} passed): {of}; the rest will be asked again."
    if saved == on_their_way:
        return (
            f"Stopped: {'the answer was' if saved == 1 else f'all {saved:,} answers were'} saved."
        )
    return f"Stopped: {of} (the others failed, or will be asked again)."


def abandoned_line(on_their_way: int) -> str:
    """What the second Ctrl-C says."""
    if not on_their_way:
        return "Stopped."
    items = "its item goes" if on_their_way == 1 else f"their {on_their_way:,} items go"
    return f"Abandoned: {items} back to the queue and will be asked again."


def format_seconds(seconds: float) -> str:
    return f"{seconds:g} s" if seconds < 120 else f"{seconds / 60:g} min"


def request_line(spec: JobSpec) -> str:
    """What every request of the job carries besides the item, when it carries more than the
    instruction: its options (create --temperature, -o), output limit, system prompt, and the
    --template or --fields that shape each item."""
    parts = [model_options.describe(spec.options)] if spec.options else []
    if spec.max_output_tokens:
        parts.append(f"at most {spec.max_output_tokens:,} output tokens")
    if spec.system:
        parts.append(f"a system prompt of {count(len(spec.system), 'character')}")
    if spec.template is not None:
        shown = spec.template if len(spec.template) <= 60 else spec.template[:59] + "…"
        parts.append(f"each item as the template {shown!r}")
    elif spec.fields:
        parts.append(f"only the fields {', '.join(spec.fields)} of each item")
    return f"Each request: {'; '.join(parts)}" if parts else ""


def _sent_live(st: JobStatus) -> bool:
    """Whether items go one request each (where concurrency holds): not a batch job's, unless
    it runs its rest live."""
    return st.job.spec.mode != "batch" or any(b.run_rest_live for b in st.batches)


def concurrency_line(st: JobStatus) -> str:
    line = f"Concurrency: up to {count(st.concurrency, 'item')} at once"
    # The threads are named only when they, not the max_concurrency setting, are what holds it back.
    cap = min(st.job.spec.concurrency, st.max_concurrency or st.job.spec.concurrency)
    if st.live_threads and st.concurrency == st.live_threads < cap:
        line += (
            f" (the job asks for {st.job.spec.concurrency}; the live workers that serve it have "
            f"{count(st.live_threads, 'thread')})"
        )
    elif st.concurrency < st.job.spec.concurrency:
        line += (
            f" (the job asks for {st.job.spec.concurrency}; max_concurrency is "
            f"{st.max_concurrency})"
        )
    return line


def concurrency_notes(st: JobStatus) -> list[str]:
    """When the setting changed under running workers: what is in force, and when the new value
    is."""
    now, in_force = st.max_concurrency_setting, st.max_concurrency
    if now is None or in_force is None or now == in_force:
        return []
    return [
        f"max_concurrency is now {now}; the workers running this job started with {in_force} and "
        "keep it until they stop. The new value applies when workers next start."
    ]


def _next_step(st: JobStatus, cmd: str) -> list[str]:
    """The command to act on the job, one that works where the status is shown
    (frontends/hints.py)."""
    j = st.job
    if st.state == "paused":
        if j.pause_reason == PAUSE_TOKEN_LIMIT:
            return [
                "Paused: token limit reached. Continue with: "
                f"{hints.process(j, 'resume', cmd, '--max-tokens <n>')}"
            ]
        if j.pause_reason == PAUSE_COST_LIMIT:
            return [
                "Paused: cost limit reached. Continue with: "
                f"{hints.process(j, 'resume', cmd, '--max-cost <usd>')}"
            ]
        if j.pause_reason == PAUSE_SAMPLE:
            return [
                "Paused after its sample (run --sample). Look at the answers: "
                f"{cmd} export {j.job_id}",
                f"Run the rest with: {hints.process(j, 'resume', cmd)}",
            ]
        if (
            j.pause_reason and j.pause_reason != PAUSE_USER
        ):  # paused itself (its endpoint): why, in full
            return [
                f"Paused: {j.pause_reason}.",
                f"Continue with: {hints.process(j, 'resume', cmd)}",
            ]
        return [f"Paused. Continue with: {hints.process(j, 'resume', cmd)}"]
    if st.state == "awaiting_recovery":
        if cmd == hints.CLI and hints.PROCESSED_BY.get(j.spec.client, hints.CLI) == hints.CLI:
            return _awaiting_recovery_cli(st)
        return [
            "No worker is running this job. Items that were in progress when its workers stopped "
            "go back to the queue and are sent again only when the job runs.",
            f"Continue with: {hints.process(j, 'run', cmd)}",
        ]
    if st.state == "waiting_for_worker":
        return _waiting_for_worker(st, cmd)
    if st.state == "not_started":
        return [f"Start it with: {hints.process(j, 'run', cmd)}"]
    if st.state in ("completed_with_errors", "failed"):
        return [f"Return failed items to the queue with: {hints.process(j, 'retry', cmd)}"]
    return []


def _waiting_for_worker(st: JobStatus, cmd: str) -> list[str]:
    """Run, nothing interrupted, and no live worker that can serve it: which worker it needs."""
    j = st.job
    if hints.PROCESSED_BY.get(j.spec.client, hints.CLI) == hints.CLI:
        needs = (
            f"a hermes-bulk worker for {j.spec.endpoint} ({j.spec.protocol}) with the API key "
            "the job was created with"
            if j.spec.endpoint
            else "a hermes-bulk worker"
        )
        return [f"Nothing was interrupted; it waits for {needs}.", worker_wanted(st, cmd)]
    return [
        *([f"{workers_live(st)}."] if st.live_workers_total else []),
        "No live worker can serve this job: it needs Hermes' model (a Hermes process, or a "
        "hermes-bulk worker with HERMES_HOME set to the profile it was created in).",
        f"Process it with: {hints.process(j, 'run', cmd)}",
    ]


def _awaiting_recovery_cli(st: JobStatus) -> list[str]:
    """In a shell, `run` alone changes nothing while no worker is alive: say what is missing."""
    j, live = st.job, count(st.live_workers, "live worker")
    if st.live_workers:  # workers are alive: the job was cut off and waits for someone to run it
        return [
            f"The job's workers stopped before it finished; it waits to be run again ({live} now).",
            f"Continue with: hermes-bulk run {j.job_id}",
        ]
    cut_off = j.state != RUNNING or (j.last_claim_at or 0) >= (j.run_at or 0)
    if not cut_off:  # run, but no worker has taken an item since: a worker is all it needs
        return [worker_wanted(st, hints.CLI)]
    lines = [
        f"{workers_live(st)}. Items that were in progress when its workers stopped go back to "
        "the queue and are sent again only when the job runs.",
        f"Continue with: {worker_command(st, hints.CLI, f'run {j.job_id} --wait')}, or start "
        f"{worker_command(st, hints.CLI)} and then: hermes-bulk run {j.job_id}",
    ]
    if st.interrupted == INTERRUPTED_WORKER_STOP and j.state == RUNNING:
        lines.append(
            "Its worker stopped gracefully: hermes-bulk worker --resume-interrupted continues it "
            "by itself."
        )
    return lines


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


def event_lines(events: list[Event], names: dict[int, str] | None = None) -> list[str]:
    """One line per event, its item by name (as exports name it) where the name is known."""
    names = names or {}
    lines = []
    for e in events:
        where = (
            ""
            if e.item_index is None
            else f" {names.get(e.item_index) or f'item {e.item_index + 1}'}"
        )
        lines.append(f"{_clock(e.at)} {_event_text(e, where)}")
    return lines


def _event_text(e: Event, where: str) -> str:
    """ "kind item HTTP n: message", or the message alone where it says the kind already
    ("resumed with --max-tokens 5000", not "resumed: resumed with …")."""
    message, http = _once(e.message), _http(e.http_status, e.message)
    if not where and not http and (message == e.kind or message.startswith(e.kind + " ")):
        return message
    return f"{e.kind}{where}{http}: {message}"


def _http(http_status: int | None, message: str) -> str:
    """' HTTP 503', unless the message already says it (each thing is said once)."""
    return f" HTTP {http_status}" if http_status and f"HTTP {http_status}" not in message else ""


def _once(message: str) -> str:
    """A message without the kind restated (events recorded before the kind carried it)."""
    return message.removeprefix("attempt failed: ")


def item_error(item: ItemRecord) -> str:
    status = (
        f" HTTP {item.http_status}"
        if item.http_status and f"HTTP {item.http_status}" not in (item.error_message or "")
        else ""
    )
    return f"{item.error_type or 'error'}{status}: {item.error_message or ''}".rstrip(": ")


def failed_text(job_id: str, failed: list[ItemRecord], total_failed: int, cmd: str) -> str:
    """`status --failed`: failed items by name with their recorded errors, capped."""
    if not failed:
        return f"Job {job_id} has no failed items."
    lines = [f"Failed items of job {job_id}:"] + [
        f"  {item.name}: {item_error(item)}" for item in failed
    ]
    if total_failed > len(failed):
        lines.append(
            f"  … and {total_failed - len(failed):,} more: {cmd} export {job_id} --only failed"
        )
    lines.append(f"One item in full: {cmd} show {job_id} ITEM")
    return "\n".join(lines)


def show_text(shown: ItemShown) -> str:
    """`show JOB ITEM`: state, tokens, the content as sent (framed), the answer, every attempt."""
    item = shown.detail.item
    lines = [
        f"Item {item.name} (number {item.index + 1} of job {shown.job.job_id})",
        f"State: {state_label(item.status)}",
        f"Tokens (reported by the provider): {item.tokens_in:,} in, {item.tokens_out:,} out",
    ]
    if item.model or item.provider:
        lines.append(f"Answered by: {' '.join(x for x in (item.model, item.provider) if x)}")
    if item.status == "failed":
        lines.append(f"Error: {item_error(item)}")
    lines += ["", "Sent:"] + [f"[{m['role']}]\n{m['content']}" for m in shown.messages]
    if shown.detail.content is None:
        lines.append(
            f"(not kept once the item completed: the file is {item.name} in "
            f"{shown.job.spec.source})"
        )
    lines += ["", "Answer:", item.result if item.result is not None else "(none yet)"]
    lines += ["", "Attempts and events:"]
    lines += ["  " + line for line in event_lines(shown.attempts, {item.index: item.name})] or [
        "  (none)"
    ]
    return "\n".join(lines)


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


def spent(job) -> str:
    """A job's spending so far for a list: "$0.42", or "?" when it has no price."""
    cost = prices.job_cost(job)
    return "?" if cost.spent is None else prices.format_usd(cost.spent)


def jobs_table(statuses: list[JobStatus]) -> Table:
    # Every column no_wrap: rich squeezes wrappable columns first, and the counts vanished in 80
    # columns.
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


def short_time(at: float, now: float) -> str:
    """When, in as few columns as tell it apart: "14:18" today, "Dec 07" this year, else
    "2025-12-07" (at 80 columns a full date and time left `list` no room for the instruction)."""
    when, today = datetime.datetime.fromtimestamp(at), datetime.datetime.fromtimestamp(now)
    if when.date() == today.date():
        return when.strftime("%H:%M")
    return when.strftime("%b %d" if when.year == today.year else "%Y-%m-%d")


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
                f"{_age(now_s - w.started_at)}",
                seen,
                serves_words(w),
                _holding(w.holding) or "-",
            ]
        )
    return table


def _age(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


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


def follow(
    jobs: Jobs,
    job_id: str,
    console: Console,
    *,
    until: Callable[[JobStatus], bool],
    interval_s: float = 0.5,
    timeout_s: float | None = None,
) -> JobStatus:
    """A live progress bar until `until(status)` or timeout_s; returns the last status."""
    deadline_s = None if timeout_s is None else time.monotonic() + timeout_s
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.table import Column as RichColumn
    from rich.text import Text

    class TwoLines(Progress):
        """The figures on a line of their own above the bar: at 80 columns nothing is cut."""

        header = Text()

        def get_renderables(self):
            yield self.header
            yield self.make_tasks_table(self.tasks)

    # Fixed widths: rich shrinks a column to "0:…" when the line is short of room. Each time
    # is followed by its word: "12/50 0:00:40 left 0:00:10 elapsed".
    columns = (
        BarColumn(bar_width=None),
        MofNCompleteColumn(table_column=RichColumn(no_wrap=True, min_width=9)),
        TimeRemainingColumn(table_column=RichColumn(no_wrap=True, min_width=7)),
        TextColumn("left"),
        TimeElapsedColumn(table_column=RichColumn(no_wrap=True, min_width=7)),
        TextColumn("elapsed"),
    )
    with TwoLines(
        *columns, console=console, transient=False, expand=console.width < 100
    ) as progress:
        task = progress.add_task(job_id, total=None)
        while True:
            st = jobs.status(job_id)
            j = st.job
            detail = (
                f"{job_id} {state_label(st.state)}: {j.failed} failed, {j.running} running, "
                f"{count(j.tokens_in + j.tokens_out, 'token')}"
            )
            if st.rate_limit:
                detail += f"\nrate limited until {zoned_clock(st.rate_limit.until)}"
            progress.header = Text(detail, no_wrap=False, overflow="fold")
            progress.update(task, total=j.total, completed=j.completed + j.failed)
            if until(st) or (deadline_s is not None and time.monotonic() >= deadline_s):
                progress.refresh()
                return st
            time.sleep(interval_s)


#: Without a terminal (a log, CI), a plain progress line this often: a bar there draws nothing
#: until the end, and then one line cut at 80 columns.
PROGRESS_LINE_EVERY_S = 5.0


def progress_line(st: JobStatus, rate_per_s: float | None) -> str:
    """One plain line of progress: done/failed/total, the rate and the time left at that rate."""
    j = st.job
    line = (
        f"job {j.job_id}: {j.completed:,}/{j.total:,} done, {j.failed:,} failed, "
        f"{state_label(st.state)}"
    )
    if rate_per_s:
        left_s = max(j.total - j.completed - j.failed, 0) / rate_per_s
        line += f", {rate_per_s:.1f} items/s, about {left_s:.0f} s left"
    if st.rate_limit:
        line += f", rate limited until {zoned_clock(st.rate_limit.until)}"
    return line


def follow_lines(
    jobs: Jobs,
    job_id: str,
    write: Callable[[str], None],
    *,
    until: Callable[[JobStatus], bool],
    every_s: float = PROGRESS_LINE_EVERY_S,
    interval_s: float = 0.5,
    timeout_s: float | None = None,
) -> JobStatus:
    """follow() without a terminal: a progress line every every_s through write (`--json` passes
    one that drops it); returns the last status."""
    start_s = time.monotonic()
    deadline_s = None if timeout_s is None else start_s + timeout_s
    next_line_s = start_s + every_s
    first = None
    while True:
        st = jobs.status(job_id)
        now_s = time.monotonic()
        settled = st.job.completed + st.job.failed
        first = first if first is not None else (now_s, settled)
        if until(st) or (deadline_s is not None and now_s >= deadline_s):
            return st
        if now_s >= next_line_s:
            elapsed_s = now_s - first[0]
            rate = (
                (settled - first[1]) / elapsed_s if elapsed_s > 0 and settled > first[1] else None
            )
            write(progress_line(st, rate))
            next_line_s = now_s + every_s
        time.sleep(interval_s)
