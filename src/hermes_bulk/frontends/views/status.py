"""The status block of one job: plain text in the seed's shape, so `/bulk status` (a chat reply)
and `hermes-bulk status` say the same thing."""

from __future__ import annotations

from ...durations import zoned_clock
from ...jobs import model_options, prices
from ...jobs.service import JobStatus, next_poll, state_label
from ...store.protocol import JobSpec
from ...words import count
from .items import event_lines
from .money import cache_cost_line, cost_line, unkept_line, worst_case_line
from .next_steps import next_step_lines
from .times import clock, format_seconds


def _cache_tokens(j) -> str:
    """ " (800 from the prompt cache, 300 written to it)": of the input tokens."""
    parts = [f"{j.tokens_cached:,} from the prompt cache"] if j.tokens_cached else []
    if j.tokens_written:
        parts.append(f"{j.tokens_written:,} written to {'it' if parts else 'the prompt cache'}")
    return f" ({', '.join(parts)})" if parts else ""


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
    lines += _limit_lines(st)
    lines += _waiting_lines(st)
    lines += next_step_lines(st, cmd)
    if j.skipped:
        lines.append(f"Left out at create: {count(j.skipped, 'entry')}")
    if st.events:
        lines.append("Events:")
        lines += ["  " + line for line in event_lines(st.events, st.event_names)]
    return "\n".join(lines)


def _limit_lines(st: JobStatus) -> list[str]:
    """What bounds the job and shapes its requests: its token and cost limits, its sample, what
    each request carries."""
    j, spec = st.job, st.job.spec
    lines = []
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
    return lines


def _waiting_lines(st: JobStatus) -> list[str]:
    """What the job waits on besides a worker: a provider's rate limit, the cron budget."""
    lines = []
    if st.rate_limit and st.state == "processing":
        lines.append(
            f"Waiting on a rate limit until {zoned_clock(st.rate_limit.until)} (all workers wait "
            "together)"
        )
    if st.budget_held_until:
        from ...budget.windows import ZonedInstant  # here: a read command never loads the budget

        # In the budget's zone, named, as the budget's status shows it.
        reopens = st.budget_held_until
        reopens_at = reopens.shown() if isinstance(reopens, ZonedInstant) else clock(reopens)
        lines.append(
            f"Waiting for the request budget: the window reopens at {reopens_at} "
            "(requests are kept for chat)"
        )
    return lines


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
        when = f"polled {clock(b.polled_at)}" if b.polled_at else "not polled yet"
        if (due := next_poll(b, st.poll_s)) is not None:
            when += f", next about {clock(due)}"
        lines.append(
            f"  {b.provider_id or b.batch_id} {b.status.replace('_', ' ')}: {counts}; {when}"
        )
    if len(open_) > BATCHES_SHOWN:
        lines.append(f"  … and {len(open_) - BATCHES_SHOWN} more open")
    return lines


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
