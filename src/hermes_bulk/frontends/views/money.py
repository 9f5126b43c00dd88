"""What a job costs, in words: the estimate at create, the spend in status and lists, the limits'
warnings and the bound every claim reserves."""

from __future__ import annotations

from ...jobs import prices


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


def worst_case_line(tokens: int, output_bound: int) -> str:
    """What every claim reserves, summed: the bound --max-tokens and --max-cost are kept by."""
    return (
        f"At most {tokens:,} tokens (each item once: its input bytes, max_tokens {output_bound:,})"
    )


def spent(job) -> str:
    """A job's spending so far for a list: "$0.42", or "?" when it has no price."""
    cost = prices.job_cost(job)
    return "?" if cost.spent is None else prices.format_usd(cost.spent)
