"""Row 4: `create` over a large CSV and `export` of as many results: time and peak RSS of the
`hermes-bulk` processes themselves (wait4's rusage of each child), at two sizes, to show
memory stays flat as rows grow.

The results to export are produced through the store's own API (bench.drive fill: each completion
claims the next, item by item; no model calls), which leaves no outputs/NNNNNN.md files, as on a
machine of a fleet that did not run the items. An export reads only the store (it writes no
output files), so the first export costs what later ones do but for a cold cache; both are
reported.
"""

from __future__ import annotations

import json

from ..core import Context, Line, RowResult, fmt_s, table, write_csv
from ..procs import HermesEnv

ROW = 4
TITLE = "`create` over a large CSV; `export` of as many results"
LIMIT_S, LIMIT_MB = 60.0, 300.0
FLAT = 1.25  # peak RSS at the large size at most this many times the small size's


def run(ctx: Context) -> RowResult:
    small, large = (100, 400) if ctx.quick else (100_000, 1_000_000)
    sizes = (small, large)
    data: dict[str, dict] = {}
    backends = [("sqlite", None), ("redis", "redis")]
    for n in sizes:
        src = write_csv(ctx.dir("src") / f"rows-{n}.csv", n)
        for name, backend in backends:
            env = HermesEnv(
                ctx.dir(f"{name}-{n}"),
                backend=ctx.redis_url() if backend else None,
                base_url="http://127.0.0.1:9/v1",
            )
            m = env.cli("create", "Summarize this row in one line", "--over", str(src), "--json")
            job = json.loads(m.stdout)["job_id"]
            data[f"create {name} {n}"] = {"s": m.wall_s, "mb": m.max_rss_mb, "n": n}
            ctx.log(f"  create {name} {n:,}: {m.wall_s:.1f} s, {m.max_rss_mb:.0f} MB")
            if name != "sqlite":
                # a million results through Redis' claim/complete takes ~7 min; SQLite only
                continue
            fill = env.drive("fill", job)
            data[f"fill {name} {n}"] = {"s": fill["elapsed_s"], "n": fill["items"]}
            ctx.log(f"  fill {n:,}: {fill['elapsed_s']:.1f} s")
            m = env.cli("export", job, "--format", "csv")
            data[f"export-first {name} {n}"] = {"s": m.wall_s, "mb": m.max_rss_mb, "n": n}
            ctx.log(f"  first export {n:,}: {m.wall_s:.1f} s, {m.max_rss_mb:.0f} MB")
            for fmt in ("csv",) if ctx.quick else ("md", "csv", "jsonl"):
                m = env.cli("export", job, "--format", fmt)
                data[f"export-{fmt} {name} {n}"] = {"s": m.wall_s, "mb": m.max_rss_mb, "n": n}
                ctx.log(f"  export {fmt} {n:,}: {m.wall_s:.1f} s, {m.max_rss_mb:.0f} MB")

    result = RowResult(
        row=ROW,
        title=TITLE,
        compared_with="-",
        goal=f"each <= {LIMIT_S:.0f} s and <= {LIMIT_MB:.0f} MB peak RSS, with memory flat as "
        "rows grow "
        f"(flat: peak RSS at {large:,} <= {FLAT} x at {small:,})",
        setup=(
            f"A {large:,}-row CSV (5 columns, about 110 bytes a row) and a {small:,}-row one; each "
            "command is a `hermes-bulk` child process, timed from start to exit (interpreter "
            "start included); peak RSS from wait4. Ratios are measured / limit. Results were "
            "produced with bench.drive fill (complete_and_claim through the store API, "
            f"{_rate(data, large)} items/s)."
        ),
        raw=data,
    )
    cases = [
        ("create sqlite", "create, SQLite"),
        ("create redis", "create, Redis"),
        ("export-first sqlite", "first export (CSV)"),
        ("export-md sqlite", "export md"),
        ("export-csv sqlite", "export csv"),
        ("export-jsonl sqlite", "export jsonl"),
    ]
    rows = []
    for key, label in cases:
        a, b = data.get(f"{key} {small}"), data.get(f"{key} {large}")
        if not a or not b:
            continue
        growth = b["mb"] / a["mb"]
        ratio = max(b["s"] / LIMIT_S, b["mb"] / LIMIT_MB)
        met = b["s"] <= LIMIT_S and b["mb"] <= LIMIT_MB and growth <= FLAT
        result.lines.append(
            Line(
                f"{label}, {large:,} rows",
                f"{fmt_s(b['s'])}, {b['mb']:.0f} MB (RSS x{growth:.2f} from {small:,})",
                f"{LIMIT_S:.0f} s, {LIMIT_MB:.0f} MB",
                ratio,
                f"<= 1.00, RSS x <= {FLAT}",
                met,
            )
        )
        rows.append(
            [
                label,
                fmt_s(a["s"]),
                f"{a['mb']:.0f} MB",
                fmt_s(b["s"]),
                f"{b['mb']:.0f} MB",
                f"{b['s'] / a['s']:.1f}x",
                f"{growth:.2f}x",
                f"{b['n'] / b['s']:,.0f}",
            ]
        )
    result.details.append(
        table(
            [
                "step",
                f"{small:,}: time",
                "peak RSS",
                f"{large:,}: time",
                "peak RSS",
                "time growth",
                "RSS growth",
                f"rows/s at {large:,}",
            ],
            rows,
        )
    )
    result.details.append("The ratio is the larger of time / 60 s and peak RSS / 300 MB.")
    result.details.append(
        "Redis export is not measured here: producing a million results through the Redis "
        "store's claim and complete takes about 7 minutes on this machine."
    )
    return result


def _rate(data: dict, n: int) -> str:
    fill = data.get(f"fill sqlite {n}")
    return f"{fill['n'] / fill['s']:,.0f}" if fill else "?"
