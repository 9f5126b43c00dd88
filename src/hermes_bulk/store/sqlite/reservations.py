"""What a claim reserves, in SQL: the statements of SqliteJobStore's claim_item and open_batch
share these fragments, so the two take items under --max-tokens and --max-cost by one rule."""

from __future__ import annotations

from typing import Any

from ..claim_rule import fits_sql
from ..records import JobRecord, cost_rates

# The reservation rule in SQL: an item reserves its stored `estimate`, the worst case recorded
# at create (NewItem.claim_tokens), and under --max-cost what that costs (records.reserved_cost,
# the SQL function database.py registers), with the check that both fit beside what is spent
# and reserved (store/claim_rule.py). _job.lua's claim_item and open_batch are the Redis copy.
# Parameters: limits().
RESERVED_COST = (
    "CASE WHEN :max_cost IS NULL THEN 0 ELSE reserved_cost(estimate, :output_bound, :rin, :rout) "
    "END"
)
FITS = (
    f"{fits_sql(':tokens_used', 'estimate', ':max_tokens')} AND "
    f"{fits_sql(':cost_used', RESERVED_COST, ':max_cost')}"
)


def limits(job: JobRecord, *, batch: bool) -> dict[str, Any]:
    """The parameters of RESERVED_COST and FITS for a claim of the job (batch: at the price a
    batch pays)."""
    rates = cost_rates(job.spec) or (0.0, 0.0, 0.0, 0.0)
    rin, rout = rates[2:] if batch else rates[:2]
    return {
        "output_bound": job.spec.output_bound,
        "max_tokens": job.spec.max_tokens,
        "tokens_used": job.tokens_charged + job.tokens_reserved,
        "max_cost": job.spec.max_cost,
        "cost_used": job.cost_nusd + job.cost_reserved,
        "rin": rin,
        "rout": rout,
    }
