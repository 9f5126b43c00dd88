"""Row 3: goodput under a provider-side limit. The provider answers 429 (with retry-after-ms)
beyond its rate; hermes-bulk should run at the limit without bouncing off it.

Each backend runs the same job three times, one after the other: with pacing (`--rpm` at the
limit, the shared GCRA), with the limit announced only by the answers' rate-limit headers (no
`--rpm`: providers/rate_headers.py paces at it and holds every worker when nothing is left), and
with neither (429s, the shared wait and the adaptive AIMD rate only). Goodput is items completed
per second from `run` to the last one.
"""

from __future__ import annotations

from ..core import Context, Line, RowResult, at_least, fmt_rate, median, rate, table, write_jsonl
from ..procs import FakeProviderProc, HermesEnv

ROW = 3
TITLE = "goodput under a provider limit"
MAX_429_SHARE = 0.02
MAX_429_SHARE_HEADERS = 0.01
MODES = {"paced": "paced (--rpm)", "headers": "headers only", "unpaced": "no pacing"}


def run(ctx: Context) -> RowResult:
    limit, n, conc, latency = (60.0, 30, 8, 0.05) if ctx.quick else (20.0, 1000, 32, 0.2)
    src = write_jsonl(ctx.dir("src") / "items.jsonl", n)
    provider = FakeProviderProc(latency_s=latency)
    cases = [(backend, mode) for backend in ("sqlite", "redis") for mode in MODES]
    runs: dict[str, dict] = {}
    try:
        for backend, mode in cases:
            key = f"{backend}-{mode}"
            env = HermesEnv(
                ctx.dir(key),
                backend=ctx.redis_url() if backend == "redis" else None,
                base_url=provider.base_url,
                max_concurrency=conc,
            )
            flags = ["--concurrency", str(conc)] + (
                ["--rpm", str(int(limit * 60))] if mode == "paced" else []
            )
            job = env.create(src, *flags)
            # a full bucket (one second of burst); its headers only in the "headers" runs
            provider.configure(rate_per_s=limit, rate_headers=mode == "headers")
            out = env.drive("run", job, "--threads", str(conc))
            stats = provider.stats()
            out.update(
                goodput=rate(out["completed"], out["elapsed_s"]),
                requests=stats["requests"],
                rejected=stats["by_status"].get("429", 0),
            )
            out["share_429"] = out["rejected"] / max(1, out["requests"])
            runs[key] = out
            ctx.log(
                f"  {key}: {out['goodput']:.1f}/s, {out['rejected']} of {out['requests']} "
                "requests got 429"
            )
    finally:
        provider.stop()

    result = RowResult(
        row=ROW,
        title=TITLE,
        compared_with=f"the limit ({limit:g} requests/s); the same job with pacing off (429 and "
        "wait only)",
        goal=f">= 0.95 of the limit with <= {MAX_429_SHARE:.0%} of requests answered 429 (paced), "
        f"<= {MAX_429_SHARE_HEADERS:.0%} (headers only); the no-pacing figures reported too",
        setup=(
            f"{n:,} items, --concurrency {conc}, provider latency {latency} s and a token bucket "
            f"of {limit:g}/s with one second of burst (full at the start of each run); paced = "
            f"`--rpm {int(limit * 60)}`; headers only = no `--rpm`, the provider's answers say "
            f"`x-ratelimit-limit-requests: {int(limit * 60)}`, what is left and when it is full."
        ),
        raw=runs,
    )
    for key, o in runs.items():
        backend, mode = key.split("-")
        ratio = o["goodput"] / limit
        label = f"{'SQLite' if backend == 'sqlite' else 'Redis'}, {MODES[mode]}"
        measured = f"{fmt_rate(o['goodput'])}, {o['share_429']:.1%} 429"
        if mode in ("paced", "headers"):
            most = MAX_429_SHARE if mode == "paced" else MAX_429_SHARE_HEADERS
            goal, met = at_least(ratio, 0.95)
            goal, met = f"{goal}, 429 <= {most:.0%}", met and o["share_429"] <= most
        else:
            goal, met = "", None
        result.lines.append(Line(label, measured, f"limit {limit:g}/s", ratio, goal, met))
    result.details.append(
        table(
            ["run", "seconds", "completed", "failed", "requests", "429 answers", "goodput/s"],
            [
                [
                    k,
                    f"{o['elapsed_s']:.1f}",
                    str(o["completed"]),
                    str(o["failed"]),
                    str(o["requests"]),
                    f"{o['rejected']} ({o['share_429']:.1%})",
                    f"{o['goodput']:.2f}",
                ]
                for k, o in runs.items()
            ],
        )
    )
    # (one run per case: the runs are long and the limit, not the machine, sets the pace)
    _ = median
    return result
