"""The job's cost is the provider's bill: an answer the provider billed is charged whether or not
it is kept (cut at the output limit, off the schema), shown apart in `status` and `status --json`,
and each item's row of the export says what it was billed. Side by side with what the loopback
provider billed (FakeProvider.billed), on both backends; an off-schema answer then a valid one is
in tests/test_answer_validation.py, a provider batch's cut lines there too."""

from __future__ import annotations

import csv
import io
import json

import pytest

from hermes_bulk.jobs import prices

#: $100 in, $400 out per million tokens: the loopback provider's items cost cents
PRICE = "100,400"


def bill_usd(tokens_in: int, tokens_out: int) -> float:
    return (tokens_in * 100 + tokens_out * 400) / 1e6


def test_every_answer_cut_short_is_charged_as_billed_and_shown_apart(
    backend_cli, fake_provider, tmp_path
):
    cli = backend_cli
    cli.env |= {"HERMES_BULK_PRICE": PRICE, "HERMES_BULK_MAX_OUTPUT_TOKENS": "64"}
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps({"t": f"row {i} CUT " + "x" * i}) + "\n" for i in range(4)))
    fake_provider.configure(item_faults={"CUT": "length"})
    job = cli.create("Summarise", src)
    assert cli("run", job, "--wait", timeout=60, check=False).returncode == 1, "all failed"

    billed_in, billed_out = fake_provider.billed()
    assert len(fake_provider.requests) == 4 and billed_out == 4 * 64, "each cut once, billed"
    bill = bill_usd(billed_in, billed_out)
    st = cli.status(job)
    assert (st["completed"], st["failed"], st["tokens_in"], st["tokens_out"]) == (0, 4, 0, 0)
    assert st["tokens_charged"] == st["tokens_unkept"] == billed_in + billed_out
    assert st["cost_usd"] == pytest.approx(bill, rel=1e-12) and bill > 0.1
    assert st["cost_unkept_usd"] == pytest.approx(bill, rel=1e-12)

    text = cli("status", job).stdout
    assert f"Cost: {prices.format_usd(bill)} so far" in text
    shown = (
        f"Of that, {prices.format_usd(bill)} spent on answers not kept "
        f"({billed_in + billed_out} tokens)"
    )
    assert shown in text.splitlines()

    out = cli("export", job, "--format", "csv", "--output", "-").stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    assert sum(int(r["tokens_in"]) for r in rows) == billed_in
    assert [int(r["tokens_out"]) for r in rows] == [64] * 4
    assert sum(float(r["cost_usd"]) for r in rows) == pytest.approx(bill, rel=1e-9)
    for r in rows:
        assert float(r["cost_usd"]) == pytest.approx(
            bill_usd(int(r["tokens_in"]), int(r["tokens_out"])), rel=1e-9
        ), "each row at the job's price"


def test_a_job_without_a_price_shows_the_tokens_spent_on_answers_not_kept():
    """No price: the tokens, and null in money (the status text in-process: views.status_text)."""
    from hermes_bulk.frontends import views
    from hermes_bulk.store.records import JobRecord, JobSpec

    spec = JobSpec("j1", "x", "/s", "jsonl", 1, 0, price_unknown="no model is named")
    job = JobRecord(spec, 0, "paused", None, 2, 0, 0, 0, 2, 0, 0, 90, 0, 0, 0, None, None)
    assert views.unkept_line(job, prices.job_cost(job)) == []
    unkept = JobRecord(
        spec, 0, "paused", None, 2, 0, 0, 0, 2, 0, 0, 90, 0, 0, 0, None, None, tokens_unkept=90
    )
    line = views.unkept_line(unkept, prices.job_cost(unkept))
    assert line == ["Of the tokens charged, 90 were spent on answers not kept"]
    assert prices.job_cost(unkept).unkept is None
