"""The price in money: a job's price found at create (genai-prices, HERMES_BULK_PRICE), each
completed item's cost from its reported tokens (cached input at the cached price, a batch at the
batch price), what reuse and batches saved, shown by create, the dry run, status, list and
status --json. Real CLI and workers against the loopback provider, on both backends; /bulk's is
in tests/plugin/test_bulk_money.py."""

from __future__ import annotations

import json
import os

import pytest

from hermes_bulk.config.settings import load_settings
from hermes_bulk.errors import ConfigError
from hermes_bulk.jobs import prices, prompt
from hermes_bulk.store.records import JobRecord, JobSpec, Usage

#: genai-prices' figures for gpt-4o-mini at OpenAI (USD per million tokens), live and batch
MINI = prices.Price(0.15, 0.6, 0.075, "")
MINI_BATCH = prices.Price(0.075, 0.3, 0.075, "")


@pytest.fixture(params=["sqlite", "redis"])
def priced_cli(request, cli):
    """The CLI with a model genai-prices knows (the loopback provider answers any model)."""
    cli.env["HERMES_BULK_MODEL"] = "gpt-4o-mini"
    if request.param == "redis":
        cli.env["HERMES_BULK_BACKEND"] = request.getfixturevalue("redis_url")
    return cli


def _source(tmp_path, n: int = 6, name: str = "items.jsonl"):
    src = tmp_path / name
    src.write_text("".join(json.dumps({"t": f"item {i} " + "x" * i}) + "\n" for i in range(n)))
    return src


def _expected_usd(status: dict, price: prices.Price) -> float:
    cached = status["tokens_cached"]
    return (
        (status["tokens_in"] - cached) * price.input
        + cached * price.cached_input
        + status["tokens_out"] * price.output
    ) / 1e6


def _running(spec: JobSpec) -> JobRecord:
    """A job of one item, running, nothing done yet."""
    return JobRecord(spec, 0, "running", None, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, None, None)


# Prices and costs --------------------------------------------------------------------------------
def test_a_request_costs_its_tokens_at_the_price_with_cached_input_at_the_cached_price():
    assert MINI.cost_nusd(1_000_000, 0) == 150_000_000
    assert MINI.cost_nusd(0, 1_000_000) == 600_000_000
    assert MINI.cost_nusd(1000, 100, 400) == round((600 * 0.15 + 400 * 0.075 + 100 * 0.6) * 1000)
    assert MINI.cost_nusd(10, 0, 50) == MINI.cost_nusd(10, 0, 10), "never more cached than input"
    assert MINI.cost_nusd(0, 0) == 0


def test_amounts_read_as_money():
    assert [prices.format_usd(x) for x in (0, 0.004215, 0.01, 0.5, 12.345, 1234.5)] == [
        "$0.00",
        "$0.0042",
        "$0.01",
        "$0.50",
        "$12.35",
        "$1,234.50",
    ]
    assert prices.describe(prices.Price(0.15, 0.6, 0.075, "src")) == (
        "$0.15 in, $0.60 out per million tokens ($0.075 cached; src)"
    )
    assert (
        prices.describe(prices.Price(2, 8, 2, "src"))
        == "$2.00 in, $8.00 out per million tokens (src)"
    )


def test_the_price_database_knows_the_model_and_its_batch_price():
    live = prices.resolve("gpt-4o-mini", "https://api.openai.com/v1", batch=False, setting="")
    assert (live.price.input, live.price.output, live.price.cached_input) == (0.15, 0.6, 0.075)
    assert live.price.source.startswith("genai-prices ") and "gpt-4o-mini" in live.price.source
    assert live.list_price is None and live.unknown is None
    batch = prices.resolve("gpt-4o-mini", None, batch=True, setting="")
    assert (batch.price.input, batch.price.output) == (0.075, 0.3)
    assert batch.list_price.input == 0.15 and batch.price.source.endswith(", batch")
    unknown = prices.resolve("fake-model", "http://127.0.0.1:1/v1", batch=False, setting="")
    assert unknown.price is None and "does not know 'fake-model'" in unknown.unknown
    assert "HERMES_BULK_PRICE" in unknown.unknown
    assert "no model" in prices.resolve(None, None, batch=False, setting="").unknown


def test_the_price_setting_names_a_price_or_a_file_of_them(tmp_path, monkeypatch):
    given = prices.resolve("fake-model", None, batch=False, setting="1.5, 6")
    assert given.price == prices.Price(1.5, 6.0, 1.5, "HERMES_BULK_PRICE")
    assert prices.resolve("gpt-4o-mini", None, batch=True, setting="1,2,0.5").price == (
        prices.Price(1.0, 2.0, 0.5, "HERMES_BULK_PRICE")
    ), "the setting is the price the user pays, batch or not"
    # A fourth figure is what a prompt-cache write costs (Anthropic: 1.25x input).
    written = prices.resolve("m", None, batch=False, setting="3,15,0.3,3.75").price
    assert written == prices.Price(3, 15, 0.3, "HERMES_BULK_PRICE", cache_write_input=3.75)
    # 1,000 in (400 read, 500 written, 100 plain), 10 out, in nano-USD
    assert written.cost_nusd(1000, 10, 400, 500) == round(
        (100 * 3 + 400 * 0.3 + 500 * 3.75 + 10 * 15) * 1000
    )
    assert prices.Price(3, 15, 0.3, "x").cost_nusd(1000, 10, 400, 500) == round(
        (600 * 3 + 400 * 0.3 + 10 * 15) * 1000
    ), "without a write price, a write costs input"
    table = tmp_path / "prices.json"
    table.write_text(json.dumps({"my-model": "0.2,0.8"}))
    found = prices.resolve("my-model", None, batch=False, setting=str(table))
    assert found.price == prices.Price(0.2, 0.8, 0.2, "HERMES_BULK_PRICE (prices.json)")
    # A model the file does not list is priced by the database.
    assert prices.resolve("gpt-4o-mini", None, batch=False, setting=str(table)).price.input == 0.15
    for bad, says in [
        ("1", "not a price"),
        ("1,2,3,4,5", "not a price"),
        ("1,2,3,-4", "not a price"),
        ("-1,2", "not a price"),
        ("nan,2", "not a price"),
        ("1_000,1", "not a price"),
        ("1e3,1", "not a price"),
        ("inf,1", "not a price"),
        ("+1,2", "not a price"),
        ("1,2,", "not a price"),
        ("١,2", "not a price"),  # digits of another script: float() reads them
        ("1,20000", "not a price"),
        ("a,b", "not a price"),
        (str(tmp_path / "missing.json"), "missing.json: cannot read it"),
        (str(tmp_path), "a directory; only regular files are read"),
    ]:
        with pytest.raises(ConfigError, match=says):
            prices.resolve("m", None, batch=False, setting=bad)
    # Spaces around a number are no doubt; what else float() reads is refused, naming the setting.
    assert prices.parse_setting_price(" 0.15 , .6 ", "x").output == 0.6
    monkeypatch.setenv("HERMES_BULK_PRICE", "1_000,1")
    with pytest.raises(ConfigError, match="HERMES_BULK_PRICE: .*'1_000,1' is not a price"):
        load_settings()
    table.write_text('{"my-model": 0.2}')
    with pytest.raises(ConfigError, match="JSON object of model"):
        prices.resolve("my-model", None, batch=False, setting=str(table))
    for data in (b"[1", b"null", b'{"caf\xe9": "1,2"}'):  # unfinished, no object, not UTF-8
        table.write_bytes(data)
        with pytest.raises(ConfigError, match="not JSON"):
            prices.resolve("my-model", None, batch=False, setting=str(table))
    table.write_text('{"my-model": "0.2,0.8", "pad": "' + "x" * prices.MAX_PRICE_FILE_BYTES + '"}')
    with pytest.raises(ConfigError, match="not JSON \\(or is over 1,048,576 bytes\\)"):
        prices.resolve("my-model", None, batch=False, setting=str(table))
    # A FIFO where the file was is refused at once: nothing waits for a writer.
    fifo = tmp_path / "prices.fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="a FIFO"):
        prices.resolve("my-model", None, batch=False, setting=str(fifo))


def test_an_item_is_priced_at_the_batch_price_only_when_a_batch_answered_it():
    spec = JobSpec(
        "j", "Do", "/s", "jsonl", 1, 0, price=MINI_BATCH.as_dict(), list_price=MINI.as_dict()
    )
    job = _running(spec)
    usage = Usage(1000, 100, 200)
    by_batch = prices.priced(job, "", usage, by_batch=True)
    assert (by_batch.cost_nusd, by_batch.list_nusd) == (
        MINI_BATCH.cost_nusd(1000, 100, 200),
        MINI.cost_nusd(1000, 100, 200),
    )
    live = prices.priced(job, "", usage, by_batch=False)
    assert live.cost_nusd == live.list_nusd == MINI.cost_nusd(1000, 100, 200)
    # Unreported usage is priced as the store charges it: the estimate.
    guessed = prices.priced(job, "x" * 300, Usage(), by_batch=False)
    estimate_in = prompt.estimate_tokens("x" * 300, "Do", 0)
    assert estimate_in > 100 and guessed.cost_nusd == MINI.cost_nusd(estimate_in, 512)
    unpriced = _running(JobSpec("j", "Do", "/s", "jsonl", 1, 0))
    assert prices.priced(unpriced, "", usage, by_batch=False) == usage
    assert prices.job_cost(unpriced).unknown == prices.NO_PRICE_RECORDED


# Through the CLI ---------------------------------------------------------------------------------
def test_a_job_counts_what_it_spent_and_a_reusing_job_what_it_saved(priced_cli, tmp_path):
    cli, src = priced_cli, _source(tmp_path)
    plan = cli.json("create", "Summarise", "--over", str(src), "--dry-run", "--json")
    assert plan["price"]["input"] == 0.15 and plan["estimated_cost_usd"] > 0
    dry = cli("create", "Summarise", "--over", str(src), "--dry-run").stdout
    assert "Estimated cost: about $" in dry and "$0.15 in, $0.60 out per million tokens" in dry
    created = cli("create", "Summarise", "--over", str(src)).stdout
    assert "Estimated cost: about $" in created
    job_id = created.split()[2]
    cli("run", job_id, "--wait")
    status = cli.status(job_id)
    assert status["cost_usd"] == pytest.approx(_expected_usd(status, MINI), abs=1e-8)
    assert status["cost_usd"] > 0 and status["estimated_cost_usd"] == pytest.approx(
        status["cost_usd"]
    ), "once every item is done, the estimate is what was spent"
    assert (status["saved_usd"], status["saved_by_batch_usd"], status["price_unknown"]) == (
        0,
        0,
        None,
    )
    text = cli("status", job_id).stdout
    assert f"Cost: {prices.format_usd(status['cost_usd'])} so far" in text
    assert "genai-prices" in text

    # The same request again: everything is reused; nothing is spent, and what was saved is
    # what the first job spent. Its dry run estimates 0 tokens and $0.
    plan = cli.json("create", "Summarise", "--over", str(src), "--dry-run", "--json")
    assert (plan["estimated_tokens"], plan["estimated_cost_usd"]) == (0, 0)
    again = cli.json("create", "Summarise", "--over", str(src), "--json")
    second = cli.status(again["job_id"])
    assert (second["cost_usd"], second["estimated_cost_usd"]) == (0, 0)
    assert second["saved_by_reuse_usd"] == pytest.approx(status["cost_usd"], abs=1e-9)
    assert "saved $" in cli("status", again["job_id"]).stdout
    listed = cli("list").stdout
    assert "cost" in listed and prices.format_usd(status["cost_usd"]) in listed


def test_a_long_shared_instruction_is_read_from_the_prompt_cache_at_its_price(
    priced_cli, fake_provider, tmp_path
):
    cli = priced_cli
    instruction = "Follow the house style guide below.\n" + "Rule: be brief. " * 400  # ~1,600 tok
    job_id = cli.json(
        "create", instruction, "--over", str(_source(tmp_path)), "--json", "--concurrency", "1"
    )["job_id"]
    cli("run", job_id, "--wait", "-w", "1")
    status = cli.status(job_id)
    assert status["tokens_cached"] >= 5 * 1536, "every request after the first hit the cache"
    assert status["cost_usd"] == pytest.approx(_expected_usd(status, MINI), abs=1e-8)
    uncached = (status["tokens_in"] * MINI.input + status["tokens_out"] * MINI.output) / 1e6
    assert status["cost_usd"] < uncached
    text = cli("status", job_id).stdout
    assert f"{status['tokens_cached']:,} from the prompt cache" in text


def test_a_model_without_a_price_says_why_and_the_setting_gives_one(cli, tmp_path):
    src = _source(tmp_path, 3)
    job_id = cli.json("create", "Do", "--over", str(src), "--json")["job_id"]
    cli("run", job_id, "--wait")
    status = cli.status(job_id)
    assert (status["cost_usd"], status["estimated_cost_usd"], status["saved_usd"]) == (
        None,
        None,
        None,
    )
    assert "does not know 'fake-model'" in status["price_unknown"]
    text = cli("status", job_id).stdout
    assert "Cost: unknown (genai-prices does not know 'fake-model'" in text
    assert "?" in cli("list").stdout.split(job_id, 1)[1].splitlines()[0]

    priced = cli.json(
        "create", "Do", "--over", str(src), "--fresh", "--json", HERMES_BULK_PRICE="2,8"
    )
    cli("run", priced["job_id"], "--wait")
    status = cli.status(priced["job_id"])
    assert status["price"]["source"] == "HERMES_BULK_PRICE"
    assert status["cost_usd"] == pytest.approx(
        (status["tokens_in"] * 2 + status["tokens_out"] * 8) / 1e6, abs=1e-8
    )
    bad = cli("create", "Do", "--over", str(src), check=False, HERMES_BULK_PRICE="2")
    assert (
        bad.returncode != 0 and "HERMES_BULK_PRICE" in bad.stderr and "Traceback" not in bad.stderr
    )


def test_a_batch_job_pays_the_batch_price_and_says_what_it_saved(priced_cli, tmp_path):
    cli = priced_cli
    env = {"HERMES_BULK_BATCH_POLL_SECONDS": "0.1"}
    job_id = cli.json(
        "create", "Do", "--over", str(_source(tmp_path, 4)), "--batch", "--json", **env
    )["job_id"]
    assert cli.status(job_id, **env)["price"]["input"] == 0.075
    cli.run_batch_job(job_id, **env)
    status = cli.status(job_id, **env)
    assert status["cost_usd"] == pytest.approx(_expected_usd(status, MINI_BATCH), abs=1e-8)
    assert status["saved_by_batch_usd"] == pytest.approx(status["cost_usd"], abs=1e-8)
    assert "by batch" in cli("status", job_id, **env).stdout


def test_the_dashboard_shows_spent_of_the_estimate_or_unknown():
    from hermes_bulk.frontends.dashboard.figures import cost_shown

    assert cost_shown(prices.JobCost(MINI, None, spent=0.0042, estimated=1.5)) == (
        "$0.0042 of about $1.50"
    ), "a job made before worst cases were recorded"
    assert cost_shown(prices.JobCost(MINI, None, spent=0.0042, estimated=1.5, worst_case=6.25)) == (
        "$0.0042 of about $1.50 (at most $6.25)"
    )
    assert cost_shown(prices.JobCost(None, "why")) == "unknown"


def test_a_jobs_money_is_spent_plus_the_rest_of_its_estimate_and_what_it_saved():
    spec = JobSpec("j", "Do", "/s", "jsonl", 1, 0, price=MINI.as_dict())
    job = JobRecord(
        spec, 0, "running", None, 12, 10, 0, 2, 0, 50, 5, 55, 0, 10_055, 0, None, None,
        reused=0, cost_nusd=1000, list_nusd=3000, saved_nusd=500,
    )  # fmt: skip
    cost = prices.job_cost(job)
    # 10,000 tokens left for 10 pending items: their 5,120 output tokens at the output price,
    # the other 4,880 at the input price.
    assert cost.estimated == (1000 + 4880 * 150 + 5120 * 600) / 1e9
    assert (cost.spent, cost.saved_by_reuse, cost.saved_by_batch) == (1e-6, 5e-7, 2e-6)
    assert cost.saved == 5e-7 + 2e-6 and cost.unknown is None
    assert prices.estimate_nusd(MINI, 100, 1, 512) == MINI.cost_nusd(0, 100)
    assert prices.JobCost(None, "why").saved is None


def test_edges_of_pricing_a_usage_and_a_jobs_money():
    spec = JobSpec("j", "Do", "/s", "jsonl", 1, 0, price=MINI.as_dict())
    job = _running(spec)
    # A usage reported in part is priced as reported; the missing counts are none.
    assert prices.priced(job, "", Usage(None, 100), by_batch=False).cost_nusd == 60_000
    assert prices.priced(job, "", Usage(1000, None), by_batch=False).cost_nusd == 150_000
    assert prices.priced(job, "", Usage(1000, 0, None), by_batch=False).cost_nusd == 150_000
    assert prices.estimate_nusd(MINI, 1000, 1, 512) == MINI.cost_nusd(488, 512)
    # Charged past the projection, or a list cost below the cost: nothing negative is shown.
    over = JobRecord(
        spec, 0, "running", None, 1, 0, 0, 1, 0, 10, 0, 10, 0, 5, 0, None, None,
        cost_nusd=2000, list_nusd=1000,
    )  # fmt: skip
    cost = prices.job_cost(over)
    assert (cost.estimated, cost.saved_by_batch) == (2e-6, 0.0)
    assert prices.JobCost(MINI, None, saved_by_reuse=1.0, saved_by_batch=None).saved is None
    # Finished before it learned an allowance: its projection is still the items' estimates,
    # and yet nothing more will be spent.
    done = JobRecord(
        spec, 0, "running", None, 1, 0, 0, 1, 0, 10, 0, 10, 0, 900, 0, None, None,
        cost_nusd=2000,
    )  # fmt: skip
    assert prices.job_cost(done).estimated == 2e-6
    assert prices.describe(prices.Price(0.126, 1.5, 3, "s")) == (
        "$0.126 in, $1.50 out per million tokens ($3.00 cached; s)"
    )
