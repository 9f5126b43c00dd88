"""What a job's tokens cost, in US dollars.

A job's price is found once, at create, and recorded on it (`JobSpec.price`, and for a batch
job the live `list_price` too): the estimate `create` shows and what `status` counts use the same
figures, whichever worker runs the job and whatever prices change later. Prices come from
genai-prices, a maintained price database (with its batch prices and cached-input prices);
`HERMES_BULK_PRICE` names a price for a model it does not know, or one the user pays instead.

Each completed item's cost is worked out by the worker that completed it (`priced`: its reported
tokens, its cached input at the cached price, at the batch price when a batch answered it) and
added up by the store in nano-USD (integers, so both backends sum exactly). Prices above a model's
long-context threshold (some charge more for a request of over 200,000 input tokens) are not
applied: the base price is recorded.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.fields import names_a_price, parse_price
from ..errors import ConfigError, InputError
from ..store.records import NANO_PER_USD, worst_case_nusd
from . import prompt

if TYPE_CHECKING:
    from ..store.records import JobRecord, Usage

#: The largest HERMES_BULK_PRICE file read: a table of models, not data.
MAX_PRICE_FILE_BYTES = 1024 * 1024
#: A price read per 1,000 tokens, scaled: small enough to stay under every long-context tier.
_PROBE_TOKENS = 1000


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens: input, output, input read from the provider's prompt cache, and
    input written to it (Anthropic bills a write at 1.25x input; None: at the input price, as
    OpenAI's caching costs nothing extra, and as prices recorded before writes were priced)."""

    input: float
    output: float
    cached_input: float
    source: str  # where the figures come from, as status shows it
    cache_write_input: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def write_rate(self) -> float:
        """What a token written to the prompt cache costs."""
        return self.input if self.cache_write_input is None else self.cache_write_input

    def cost_nusd(
        self, tokens_in: int, tokens_out: int, tokens_cached: int = 0, tokens_written: int = 0
    ) -> int:
        """Nano-USD for one request (cached reads and writes are among tokens_in)."""
        cached = min(tokens_cached, tokens_in)
        written = min(tokens_written, tokens_in - cached)
        per_mtok = (
            (tokens_in - cached - written) * self.input
            + cached * self.cached_input
            + written * self.write_rate
        )
        return round((per_mtok + tokens_out * self.output) * 1000)  # USD/1e6 tokens -> nano-USD


def price_of(recorded: dict[str, Any] | None) -> Price | None:
    return None if not recorded else Price(**recorded)


@dataclass(frozen=True, slots=True)
class JobPrice:
    """What create records: the price the job pays (a batch job's batch price), the live list
    price where it differs, or why there is none."""

    price: Price | None
    list_price: Price | None = None
    unknown: str | None = None


def parse_setting_price(text: str, where: str) -> Price:
    """`input,output[,cached_input[,cache_write]]` in USD per million tokens, or ConfigError
    naming `where`."""
    try:
        given = parse_price(text)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}.") from None
    return Price(*given[:3], source="HERMES_BULK_PRICE", cache_write_input=given[3])


def _setting_price(setting: str, model: str | None) -> Price | None:
    """The setting's price for `model`: the one price it gives, or the file's entry for the
    model (a JSON object of model name -> "input,output[,cached_input]"); None when the file
    has no entry for it."""
    if names_a_price(setting):
        return parse_setting_price(setting, "HERMES_BULK_PRICE")
    from ..sources.regular_files import read_regular_file  # here: status and list start without it

    path = Path(setting).expanduser()
    fix = 'give input,output USD per million tokens, or a JSON file {"model": "0.15,0.60"}.'
    try:  # as sources read a file: a FIFO or a device in its place is refused, never waited on
        data = read_regular_file(path, MAX_PRICE_FILE_BYTES)
    except InputError as exc:  # it names the file and what is wrong with it
        raise ConfigError(f"HERMES_BULK_PRICE: {exc} The setting: {fix}") from None
    try:
        table = None if data is None else json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        table = None
    if table is None:
        raise ConfigError(
            f"HERMES_BULK_PRICE: the price file {path} is not JSON (or is over "
            f"{MAX_PRICE_FILE_BYTES:,} bytes); {fix}"
        )
    if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
        raise ConfigError(
            f'HERMES_BULK_PRICE: {path} must be a JSON object of model -> "input,output", e.g. '
            '{"my-model": "0.15,0.60"}.'
        )
    if model is None or model not in table:
        return None
    found = parse_setting_price(table[model], f"HERMES_BULK_PRICE ({path}, {model})")
    return replace(found, source=f"HERMES_BULK_PRICE ({path.name})")


def _database_price(model: str, base_url: str | None, batch: bool) -> Price | None:
    """genai-prices' price for the model (at the provider the base URL names, else the one its
    name suggests), batch-discounted when `batch`; None when it does not know the model."""
    import genai_prices  # 13 ms beside pydantic: only create and the dry run price a job

    probe = genai_prices.Usage
    context = {"processing": "batch"} if batch else None

    def calc(usage: Any) -> Any:
        try:
            return genai_prices.calc_price(
                usage, model, provider_api_url=base_url, price_context=context
            )
        except LookupError:
            return genai_prices.calc_price(usage, model, price_context=context)

    try:
        plain = calc(probe(input_tokens=_PROBE_TOKENS, output_tokens=_PROBE_TOKENS))
        cached = calc(probe(input_tokens=_PROBE_TOKENS, cache_read_tokens=_PROBE_TOKENS))
        written = calc(probe(input_tokens=_PROBE_TOKENS, cache_write_tokens=_PROBE_TOKENS))
    except LookupError:
        return None
    scale = 1_000_000 / _PROBE_TOKENS
    kind = ", batch" if batch else ""
    return Price(  # rounded: the scaling leaves float noise (0.15000000000000002)
        input=round(float(plain.input_price) * scale, 9),
        output=round(float(plain.output_price) * scale, 9),
        cached_input=round(float(cached.input_price) * scale, 9),
        cache_write_input=round(float(written.input_price) * scale, 9),
        source=f"genai-prices {genai_prices.__version__}: {plain.provider.id} "
        f"{plain.model.id}{kind}",
    )


def resolve(model: str | None, base_url: str | None, *, batch: bool, setting: str) -> JobPrice:
    """A new job's price: the setting's where it names one for the model, else genai-prices'
    (the batch price for a batch job, with the live price beside it)."""
    if setting:
        chosen = _setting_price(setting, model)
        if chosen is not None:
            return JobPrice(chosen)
    if not model:
        return JobPrice(None, unknown="no model is named; set HERMES_BULK_PRICE")
    live = _database_price(model, base_url, batch=False)
    if live is None:
        return JobPrice(
            None,
            unknown=f"genai-prices does not know {model!r}; set HERMES_BULK_PRICE to "
            "input,output USD per million tokens",
        )
    return JobPrice(_database_price(model, base_url, batch=True), live) if batch else JobPrice(live)


def priced(job: JobRecord, content: str, usage: Usage, *, by_batch: bool) -> Usage:
    """The usage of an item of the job (its content as stored) with its cost at the job's price
    and at the list price: of the reported tokens, else of its estimate (as the store then
    charges it). A batch job's items answered live (past --batch-deadline) pay the list price."""
    spec = job.spec
    pays = price_of(spec.price)
    if pays is None:
        return usage
    listed = price_of(spec.list_price) or pays
    if not by_batch:
        pays = listed
    if usage.reported:
        tokens = (
            usage.tokens_in or 0,
            usage.tokens_out or 0,
            usage.tokens_cached or 0,
            usage.tokens_written or 0,
        )
    else:
        estimate_in = prompt.estimate_tokens(content, spec.instruction, 0, spec.system)
        tokens = (estimate_in, job.output_allowance, 0, 0)
    return replace(usage, cost_nusd=pays.cost_nusd(*tokens), list_nusd=listed.cost_nusd(*tokens))


def usd(nusd: int) -> float:
    return nusd / NANO_PER_USD


def format_usd(amount: float) -> str:
    """$1,234.50, $0.42, $0.0042: cents, or two significant figures below a cent."""
    if amount == 0 or amount >= 0.01:
        return f"${amount:,.2f}"
    return f"${amount:.{1 - math.floor(math.log10(amount))}f}"


def estimate_nusd(price: Price, tokens: int, items: int, output_allowance: int) -> int:
    """An estimate of `tokens` for `items` items in nano-USD: each item's output allowance at the
    output price, the rest at the input price."""
    output = min(tokens, items * output_allowance)
    return price.cost_nusd(tokens - output, output)


@dataclass(frozen=True, slots=True)
class JobCost:
    """A job's money, in USD: spent so far, the whole job's estimate, what reuse and the batch
    price saved; all None with `unknown` saying why when the job has no price."""

    price: Price | None
    unknown: str | None
    spent: float | None = None
    estimated: float | None = None
    saved_by_reuse: float | None = None
    saved_by_batch: float | None = None
    #: The prompt cache: what its reads cost, what they saved against the input price, and what
    #: its writes cost (at the job's price)
    cache_read: float | None = None
    cache_saved: float | None = None
    cache_written: float | None = None
    #: The most the job may cost with each item asked once (its items' worst cases; more only
    #: through retries, which --max-cost also bounds), never less than what is spent
    worst_case: float | None = None
    #: Of spent, what the answers that were not kept cost (truncated, invalid, refused)
    unkept: float | None = None

    @property
    def saved(self) -> float | None:
        if self.saved_by_reuse is None or self.saved_by_batch is None:
            return None
        return self.saved_by_reuse + self.saved_by_batch


#: Why a job made before prices were recorded has none.
NO_PRICE_RECORDED = "the job was created before hermes-bulk recorded prices"


def job_cost(job: JobRecord) -> JobCost:
    """What status shows of a job's money. The estimate is what was spent plus the rest of the
    projected tokens (JobRecord.projected_tokens) at the job's price, the pending items' output
    allowance at the output price."""
    spec = job.spec
    price = price_of(spec.price)
    if price is None:
        return JobCost(None, spec.price_unknown or NO_PRICE_RECORDED)
    # Before LEARN_AFTER answers the projection is the items' estimates, spent or not: once
    # nothing is pending or running, nothing more will be spent.
    settled = job.pending == 0 and job.running == 0
    rest = 0 if settled else max(0, job.projected_tokens - job.tokens_charged)
    estimated = job.cost_nusd + estimate_nusd(price, rest, job.pending, job.output_allowance)
    # n counts duplicates too (their worst cases are not in worst_tokens): a larger share of
    # output, at the dearer rate, keeps the figure a bound
    worst = worst_case_nusd(spec, job.worst_tokens, job.total - job.reused)
    return JobCost(
        price,
        None,
        spent=usd(job.cost_nusd),
        estimated=usd(estimated),
        # a job made before worst cases were recorded has none
        worst_case=usd(max(worst, job.cost_nusd + job.cost_reserved)) if job.worst_tokens else None,
        saved_by_reuse=usd(job.saved_nusd),
        saved_by_batch=usd(max(0, job.list_nusd - job.cost_nusd)),
        cache_read=job.tokens_cached * price.cached_input / 1e6,
        cache_saved=job.tokens_cached * max(0.0, price.input - price.cached_input) / 1e6,
        cache_written=job.tokens_written * price.write_rate / 1e6,
        unkept=usd(job.cost_unkept),
    )


def describe(price: Price) -> str:
    """ "$0.15 in, $0.60 out per million tokens ($0.075 cached; genai-prices 0.2.5: openai …)"."""

    def per_mtok(value: float) -> str:
        return f"${value:.2f}" if round(value, 2) == value else f"${value:.6g}"

    cached = f"{per_mtok(price.cached_input)} cached; " if price.cached_input != price.input else ""
    if price.write_rate != price.input:
        cached += f"{per_mtok(price.write_rate)} cache write; "
    return (
        f"{per_mtok(price.input)} in, {per_mtok(price.output)} out per million tokens "
        f"({cached}{price.source})"
    )
