"""--max-cost and --max-tokens are bounds, not expectations (DESIGN.md invariant 6): side by
side with the provider's own count of what it billed, against an honest provider's worst case
(it never answers past the request's max_tokens and never counts more input tokens than the
request's text has bytes: FakeConfig.output_tokens and input_as_bytes).

Each case is one the old, estimate-based reservations lost: short answers first and long ones
after at 32 in flight (the learned allowance reserved a few tokens for answers of 1,900), two
Redis workers, multi-byte input (three bytes a character, a token each), and a batch job that
starts from the small allowance an earlier job learned.
"""

from __future__ import annotations

import json
import signal

import pytest

from .helpers import wait_for

#: $100 in, $400 out per million tokens: an answer of 2,000 tokens costs $0.80.
PRICE = "100,400"
RATES = (100, 400)


def billed_usd(fake, rates: tuple[int, int] = RATES) -> float:
    """What the loopback provider billed, by its own count (every answer it gave)."""
    tokens_in, tokens_out = fake.billed()
    return (tokens_in * rates[0] + tokens_out * rates[1]) / 1e6


def _rows(tmp_path, n: int, text: str = "row {i} of the table") -> object:
    src = tmp_path / "rows.jsonl"
    lines = (json.dumps({"text": text.format(i=i)}, ensure_ascii=False) for i in range(n))
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return src


def _until_stopped(cli, job_id: str, workers: int, threads: int) -> dict:
    """Serve the job with `workers` worker processes until it stops claiming; its status."""
    cli("run", job_id)
    procs = [cli.spawn_worker("-w", str(threads)) for _ in range(workers)]
    try:
        return wait_for(
            lambda: (
                (
                    (st := cli.status(job_id))["state"] in ("paused", "completed")
                    and st["running"] == 0
                )
                and st
            ),
            timeout=120,
            interval=0.2,
            message="the job to pause at its limit",
        )
    finally:
        for p in procs:
            p.send_signal(signal.SIGINT)
            p.wait(60)


def _check_bill(job: dict, fake, cap_usd: float, rates: tuple[int, int] = RATES) -> None:
    billed = billed_usd(fake, rates)
    assert job["cost_reserved_usd"] == 0 and job["tokens_reserved"] == 0
    assert billed <= cap_usd, f"the provider billed ${billed:.4f}"
    assert job["cost_usd"] == pytest.approx(billed, abs=1e-6), "the job's bill"


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-workers"])
def test_short_answers_first_buy_no_long_ones_past_max_cost(
    backend_cli, fake_provider, tmp_path, workers
):
    """The outside report: 20 one-token answers, then 1,900 tokens each, 32 in flight, --max-cost
    10 and max_tokens 2,000: the provider billed $54.66. Every claim now holds $0.80 of output;
    here 64 threads, in one process or two."""
    cli = backend_cli
    cli.env.update(HERMES_BULK_PRICE=PRICE, HERMES_BULK_MAX_CONCURRENCY="64")
    fake_provider.configure(output_tokens=[1] * 20 + [1_900], input_as_bytes=True, latency_s=0.05)
    job_id = cli.create(
        "Say A", _rows(tmp_path, 90), "--max-cost", "10", "--max-output-tokens", "2000",
        "--concurrency", "64",
    )  # fmt: skip
    job = _until_stopped(cli, job_id, workers, 64 // workers)
    assert (job["state"], job["pause_reason"]) == ("paused", "cost limit reached")
    assert 20 < job["completed"] < 90
    _check_bill(job, fake_provider, 10)
    assert len(fake_provider.requests) == job["completed"], "each answer kept, none sent twice"


def test_the_token_cap_holds_with_long_answers_after_short_ones(
    backend_cli, fake_provider, tmp_path
):
    """--max-tokens 10,000 on two workers billed 66,240 tokens."""
    cli = backend_cli
    fake_provider.configure(output_tokens=[1] * 10 + [1_900], input_as_bytes=True)
    job_id = cli.create(
        "Say A", _rows(tmp_path, 40), "--max-tokens", "10000", "--max-output-tokens", "2000",
        "--concurrency", "16",
    )  # fmt: skip
    job = _until_stopped(cli, job_id, 2, 8)
    assert (job["state"], job["pause_reason"]) == ("paused", "token limit reached")
    billed = sum(fake_provider.billed())
    assert billed <= 10_000 and job["tokens_charged"] == billed


def test_multi_byte_input_is_reserved_by_its_bytes(backend_cli, fake_provider, tmp_path):
    """300 CJK characters an item (900 bytes); a tokenizer may count a token a byte: --max-cost 5
    spent $9.87 when input was reserved at a token per three characters. Here an item's input
    bills up to about $1.40."""
    cli = backend_cli
    cli.env["HERMES_BULK_PRICE"] = "1000,400"  # input dear, so the input bound decides
    fake_provider.configure(input_as_bytes=True, output_tokens=[10])
    src = _rows(tmp_path, 40, text="{i} " + "漢" * 300)
    job_id = cli.create(
        "Say A", src, "--max-cost", "5", "--max-output-tokens", "10", "--concurrency", "8"
    )
    job = _until_stopped(cli, job_id, 1, 8)
    assert (job["state"], job["pause_reason"]) == ("paused", "cost limit reached")
    _check_bill(job, fake_provider, 5, (1000, 400))


def test_a_batch_after_a_learned_job_is_cut_to_what_its_worst_cases_fit(
    backend_cli, fake_provider, tmp_path
):
    """A job that learned one-token answers lent its small allowance to the next: a batch of 40
    bought under it spent $76.40 under a $5 cap. A batch takes only the lines whose worst cases
    fit beside what is spent."""
    cli = backend_cli
    cli.env.update(HERMES_BULK_PRICE=PRICE, HERMES_BULK_BATCH_POLL_SECONDS="0.1")
    src = _rows(tmp_path, 40)
    fake_provider.configure(output_tokens=[1] * 5 + [1_900], input_as_bytes=True)
    learned = cli.create("Say A", src, "--max-output-tokens", "2000", "--concurrency", "1")
    cli("run", learned, "--wait", "--sample", "5")
    before = billed_usd(fake_provider)
    job_id = cli.create(
        "Say A", src, "--fresh", "--batch", "--max-cost", "5", "--max-output-tokens", "2000"
    )
    job = _until_stopped(cli, job_id, 1, 2)
    assert job["state"] == "paused" and job["cost_usd"] <= 5
    assert billed_usd(fake_provider) - before <= 5
    assert job["cost_usd"] == pytest.approx(billed_usd(fake_provider) - before, abs=1e-6)


def test_a_limit_below_one_items_worst_case_is_refused_at_create(backend_cli, tmp_path):
    cli = backend_cli
    cli.env["HERMES_BULK_PRICE"] = PRICE
    src = _rows(tmp_path, 3)
    proc = cli(
        "create", "Say A", "--over", str(src), "--max-cost", "0.5", "--max-output-tokens",
        "2000", check=False,
    )  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "--max-cost $0.50 is below what item line:1 may cost: up to $0.8" in proc.stderr
    assert "2,000 output tokens at most" in proc.stderr
    proc = cli("create", "Say A", "--over", str(src), "--max-tokens", "100", check=False)
    assert proc.returncode == 1 and "--max-tokens 100 is below what item line:1" in proc.stderr
    assert "rows.jsonl" not in cli("list").stdout, "nothing was created"


@pytest.mark.parametrize(
    ("usage", "says"),
    [
        (
            {"prompt_tokens": 5, "completion_tokens": 101},
            "billed 101 output tokens for item line:1",
        ),
        ({"prompt_tokens": 50_000, "completion_tokens": 5}, "billed 50,000 input tokens"),
    ],
    ids=["output", "input"],
)
def test_usage_above_the_bound_is_charged_and_pauses_the_job(
    backend_cli, fake_provider, tmp_path, usage, says
):
    """A provider that bills more than a request could (output past max_tokens, more input
    tokens than the request has bytes) is charged what it reports, and the job stops claiming:
    the caps were proven for an honest provider. One token less is no reason to stop."""
    cli = backend_cli
    fake_provider.configure(usage={**usage, "total_tokens": sum(usage.values())})
    job_id = cli.create(
        "Say A", _rows(tmp_path, 10), "--max-output-tokens", "100", "--concurrency", "1"
    )
    proc = cli("run", job_id, "--wait", check=False)
    job = cli.status(job_id)
    assert proc.returncode == 4 and job["state"] == "paused", proc.stdout
    assert (
        says in job["pause_reason"] and "the job's limits assume it does not" in job["pause_reason"]
    )
    assert job["completed"] == 1 and job["tokens_charged"] == sum(usage.values())

    honest = {k: (v - 1 if k == "completion_tokens" and v == 101 else v) for k, v in usage.items()}
    if honest == usage:
        return  # the input case: its honest neighbour is every other test's usage
    fake_provider.configure(usage={**honest, "total_tokens": sum(honest.values())})
    other = cli.create(
        "Say B", _rows(tmp_path, 3), "--max-output-tokens", "100", "--concurrency", "1"
    )
    assert cli("run", other, "--wait").returncode == 0, "100 output tokens is within the bound"
    assert cli.status(other)["state"] == "completed"
