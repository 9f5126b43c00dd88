"""create/resume --max-cost: a job pauses before what it spends would go over a limit in US
dollars, exactly as --max-tokens does in tokens (the store's rule: tests/contract/
test_store_max_cost.py). Real CLI and workers against the loopback provider, on both backends;
/bulk's is in tests/plugin/test_bulk_max_cost.py."""

from __future__ import annotations

import json
import re

import pytest

#: $100 in, $400 out per million tokens: an item of the loopback provider costs about a cent.
PRICE = "100,400"
ROWS = 12
#: "cost limit reached: $X spent + $Y for item N would exceed --max-cost $Z"
PAUSED = re.compile(
    r"cost limit reached: \$([\d.]+) spent \+ \$([\d.]+) for item (\d+) would exceed "
    r"--max-cost \$([\d.]+)"
)


def _rows(tmp_path, n: int = ROWS):
    src = tmp_path / "rows.jsonl"
    src.write_text(
        "".join(json.dumps({"text": f"row {i} " + "word " * i}) + "\n" for i in range(n))
    )
    return src


@pytest.fixture
def priced(backend_cli):
    backend_cli.env["HERMES_BULK_PRICE"] = PRICE
    return backend_cli


def test_a_job_pauses_before_its_cost_would_go_over_max_cost(priced, fake_provider, tmp_path):
    cli = priced
    # 20 output tokens an item at most: an item reserves its worst case, about 5 cents (its
    # input bytes at $100 per million and 20 output tokens), and spends about 1.5.
    job_id = cli.create(
        "Say A", _rows(tmp_path), "--max-cost", "0.12", "--max-output-tokens", "20",
        "--concurrency", "1",
    )  # fmt: skip
    proc = cli("run", job_id, "--wait", check=False)
    assert proc.returncode == 4, proc.stdout + proc.stderr  # paused
    assert "Paused: cost limit reached" in proc.stdout and "--max-cost <usd>" in proc.stdout
    job = cli.status(job_id)
    assert (job["state"], job["pause_reason"]) == ("paused", "cost limit reached")
    assert 0 < job["completed"] < ROWS and job["running"] == 0
    assert job["cost_usd"] <= 0.12 and job["max_cost_usd"] == 0.12
    assert job["cost_reserved_usd"] == 0
    # Nothing was sent past the limit: one request for each item answered.
    assert len(fake_provider.requests) == job["completed"]
    # It paused because the next item would not fit beside what was spent.
    events = cli("events", job_id).stdout
    (found,) = PAUSED.findall(events)
    spent, need, item, limit = float(found[0]), float(found[1]), int(found[2]), float(found[3])
    assert spent == pytest.approx(job["cost_usd"], abs=1e-9) and limit == 0.12
    assert spent + need > limit and item == job["completed"] + 1
    text = cli("status", job_id).stdout
    assert "Cost limit: $0.12 (" in text and "spent, $0.00 reserved)" in text
    assert "Paused: cost limit reached. Continue with:" in text

    # Resuming needs room for the next item: without a new limit, or with one too small, it
    # says so and changes nothing.
    for flags, says in [
        ((), "paused at its cost limit ($0.12); resume it with a larger one"),
        (("--max-cost", "0.001"), "is below what the job has already spent"),
        (("--max-cost", f"{spent + need / 4:.6f}"), "leaves no room for the next item"),
    ]:
        proc = cli("resume", job_id, *flags, check=False)
        assert proc.returncode == 1 and says in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    assert cli.status(job_id)["state"] == "paused"

    proc = cli("resume", job_id, "--max-cost", "5", "--wait", check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = cli.status(job_id)
    assert (job["state"], job["completed"], job["max_cost_usd"]) == ("completed", ROWS, 5)
    assert len(fake_provider.requests) == ROWS, "no item was sent twice"
    assert "resumed with --max-cost $5.00" in cli("events", job_id).stdout


def test_reservations_in_flight_hold_the_job_under_the_limit(priced, fake_provider, tmp_path):
    """With eight items at once, claims wait for reservations in flight instead of going over:
    what the job spends never passes the limit, though every item would fit alone."""
    cli = priced
    job_id = cli.create(
        "Say A", _rows(tmp_path, 30), "--max-cost", "0.3", "--max-output-tokens", "20",
        "--concurrency", "8",
    )  # fmt: skip
    fake_provider.configure(latency_s=0.2)
    cli("run", job_id, "--wait", "-w", "8", check=False)
    job = cli.status(job_id)
    assert job["pause_reason"] == "cost limit reached" and job["cost_usd"] <= 0.3
    assert len(fake_provider.requests) == job["completed"] < 30


def test_a_limit_needs_a_price_and_a_sane_amount(backend_cli, tmp_path):
    cli, src = backend_cli, _rows(tmp_path, 3)
    proc = cli("create", "Say A", "--over", str(src), "--max-cost", "1", check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--max-cost needs the job's price, and there is none" in proc.stderr
    assert "HERMES_BULK_PRICE" in proc.stderr
    assert "rows.jsonl" not in cli("list").stdout, "nothing was created"
    for amount, says in [
        ("0", "out of range"),
        ("-1", "out of range"),
        ("1e7", "out of range"),
        ("nan", "out of range"),
        ("ten", "not an amount in US dollars"),
        ("0.0000000001", "less than a nano-dollar"),
    ]:
        proc = cli("create", "Say A", "--over", str(src), "--max-cost", amount, check=False)
        assert proc.returncode == 2 and says in proc.stderr, (amount, proc.stderr)
    # Dollars as people write them.
    cli.env["HERMES_BULK_PRICE"] = PRICE
    job_id = cli.create("Say A", src, "--max-cost", "$1,000.50")
    assert cli.status(job_id)["max_cost_usd"] == 1000.5
    # A job made without a price cannot take a limit later either.
    del cli.env["HERMES_BULK_PRICE"]
    unpriced = cli.json("create", "Say C", "--over", str(src), "--json")["job_id"]
    cli("run", unpriced, "--wait")
    proc = cli("resume", unpriced, "--max-cost", "1", check=False)
    assert proc.returncode != 0 and "needs the job's price" in proc.stderr


def test_the_plan_warns_when_the_limit_is_below_the_estimate(priced, tmp_path):
    """Each item may cost up to about $1.68 (4,096 output tokens); twelve are expected to
    cost about $2.60: a limit of $2 lets any one run, and warns."""
    cli, src = priced, _rows(tmp_path)
    for args in (("--dry-run",), ()):
        out = cli("create", "Say A", "--over", str(src), "--max-cost", "2", *args).stdout
        (warning,) = [line for line in out.splitlines() if line.startswith("Warning:")]
        assert "--max-cost $2.00 is below the estimate" in warning
        assert "larger --max-cost" in warning
    roomy = cli("create", "Say A", "--over", str(src), "--max-cost", "100", "--dry-run").stdout
    assert "Warning" not in roomy
