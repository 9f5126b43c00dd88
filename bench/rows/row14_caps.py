"""Row 14: the price of exactness (issue 43). --max-cost reserves each item's worst case (its
input bytes and max_tokens), so a capped job stops with up to one worst case left unspent, and
claims wait on reservations in flight. Measured: the share of the cap a job spends before it
pauses (the provider bills answers of a quarter of max_tokens), and items/s of the same job with
a cap far above its bill against none, on both backends, beside the provider's own bill.
"""

from __future__ import annotations

from ..core import Context, Line, RowResult, median, table, write_jsonl
from ..procs import FakeProviderProc, HermesEnv

ROW = 14
TITLE = "hard caps: the share of --max-cost spent, items/s with a cap"
PRICE = "100,400"  #: $100 in, $400 out per million tokens (HERMES_BULK_PRICE)
MAX_OUT, ANSWER = 400, 100  #: each request's max_tokens; what each answer bills


def _billed_usd(provider: FakeProviderProc) -> float:
    billed = provider.stats()["billed"]
    return (billed["input"] * 100 + billed["output"] * 400) / 1e6


def run(ctx: Context) -> RowResult:
    n, threads = (60, 8) if ctx.quick else (2000, 16)
    src = write_jsonl(ctx.dir("src") / "items.jsonl", n)
    provider = FakeProviderProc(latency_s=0.02)
    # A cap well below what the job bills, and one far above it.
    per_item = (300 * 100 + ANSWER * 400) / 1e6  # below an item's bill (its input is longer)
    caps = {"capped": f"{n * per_item / 2:.2f}", "roomy": f"{n * per_item * 100:.2f}"}
    cases = [(b, c) for b in ("sqlite", "redis") for c in ("none", "roomy", "capped")]
    runs: dict[tuple[str, str], list[dict]] = {case: [] for case in cases}
    try:
        for r in range(ctx.rounds):
            for backend, cap in cases[r % 2 :] + cases[: r % 2]:
                provider.configure(output_tokens=[ANSWER], input_as_bytes=True)
                env = HermesEnv(
                    ctx.dir(f"{backend}-{cap}-{r}"),
                    backend=ctx.redis_url() if backend == "redis" else None,
                    base_url=provider.base_url,
                    price=PRICE,
                    max_concurrency=threads,
                )
                flags = ["--concurrency", str(threads), "--max-output-tokens", str(MAX_OUT)]
                if cap != "none":
                    flags += ["--max-cost", caps[cap]]
                job = env.create(src, *flags)
                out = env.drive("run", job, "--threads", str(threads))
                out["billed_usd"] = _billed_usd(provider)
                runs[(backend, cap)].append(out)
                ctx.log(
                    f"  round {r + 1} {backend} {cap}: {out['completed']} items, "
                    f"${out['billed_usd']:.4f} billed, {out['completed'] / out['elapsed_s']:.0f}/s"
                )
    finally:
        provider.stop()

    result = RowResult(
        row=ROW,
        title=TITLE,
        compared_with="the cap (share spent); the same job without a cap (items/s)",
        goal="never above the cap; reported otherwise",
        setup=(
            f"{n:,} items of about 120 bytes, {threads} threads (`bench.drive run`), max_tokens "
            f"{MAX_OUT}, the loopback provider billing {ANSWER} output tokens an answer and an "
            f"input token a byte (an honest provider's most), 20 ms a request, price {PRICE} per "
            f"million; caps ${caps['capped']} (below the bill) and ${caps['roomy']}; "
            f"{ctx.rounds} round(s), the median."
        ),
        raw={f"{b}-{c}": o for (b, c), o in runs.items()},
    )
    for backend, label in (("sqlite", "SQLite"), ("redis", "Redis")):
        capped = runs[(backend, "capped")]
        share = median([o["billed_usd"] / float(caps["capped"]) for o in capped])
        result.lines.append(
            Line(
                f"{label}, share of the cap spent",
                f"{share:.3f}",
                f"cap ${caps['capped']}",
                share,
                "<= 1.000",
                share <= 1.0,
            )
        )
        speed = {
            c: median([o["completed"] / o["elapsed_s"] for o in runs[(backend, c)]])
            for c in ("none", "roomy")
        }
        result.lines.append(
            Line(
                f"{label}, items/s with a roomy cap",
                f"{speed['roomy']:.0f} items/s",
                f"no cap {speed['none']:.0f} items/s",
                speed["roomy"] / speed["none"] if speed["none"] else None,
                "",
                None,
            )
        )
    result.details.append(
        table(
            ["backend", "cap", "round", "items", "billed", "job's cost", "items/s"],
            [
                [
                    b,
                    c,
                    str(r + 1),
                    str(o["completed"]),
                    f"${o['billed_usd']:.4f}",
                    f"${o['cost_usd']:.4f}",
                    f"{o['completed'] / o['elapsed_s']:.0f}",
                ]
                for (b, c), outs in runs.items()
                for r, o in enumerate(outs)
            ],
        )
    )
    return result
