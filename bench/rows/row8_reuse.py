"""Row 8: `create` with reuse (issue 14). Over a large CSV whose every row an earlier job of the
store answered (the answer index holds them all), `create` finds each answer and completes the
item at once; compared with a plain `create` of the same rows into an empty store. Then a CSV of
the same rows plus 1% new ones: what is left to run (each item left to run is one request; the
reused are never sent: tests/test_reuse.py counts them at the provider).

The earlier job's answers are written set-wise (bench.drive answer-all: results, counters and
the answer index, as its completions would leave them; through claim and complete a million
take tens of minutes on a loaded machine). SQLite; time and peak RSS of the
`hermes-bulk` child processes.
"""

from __future__ import annotations

import json

from ..core import Context, Line, RowResult, fmt_s, table, write_csv
from ..procs import HermesEnv

ROW = 8
TITLE = "`create` reusing a full index of earlier answers"
GOAL = 1.25  # create with the index at most this many times a plain create
FLAT = 1.25  # peak RSS at the large size at most this many times the small size's


def run(ctx: Context) -> RowResult:
    small, large = (100, 400) if ctx.quick else (100_000, 1_000_000)
    data: dict[str, dict] = {}
    for n in (small, large):
        src = write_csv(ctx.dir("src") / f"rows-{n}.csv", n)
        grown = write_csv(
            ctx.dir("src") / f"rows-{n}-plus1pct.csv", n + n // 100
        )  # same seed: same first n rows
        plain = HermesEnv(ctx.dir(f"plain-{n}"), backend=None, base_url="http://127.0.0.1:9/v1")
        m = plain.cli("create", "Summarize this row in one line", "--over", str(src), "--json")
        data[f"plain {n}"] = {"s": m.wall_s, "mb": m.max_rss_mb}
        ctx.log(f"  plain create {n:,}: {m.wall_s:.1f} s, {m.max_rss_mb:.0f} MB")
        env = HermesEnv(ctx.dir(f"reuse-{n}"), backend=None, base_url="http://127.0.0.1:9/v1")
        first = json.loads(
            env.cli("create", "Summarize this row in one line", "--over", str(src), "--json").stdout
        )
        fill = env.drive("answer-all", first["job_id"])
        ctx.log(f"  answered {fill['items']:,} in {fill['elapsed_s']:.1f} s")
        m = env.cli("create", "Summarize this row in one line", "--over", str(src), "--json")
        reused = json.loads(m.stdout)
        data[f"reuse {n}"] = {
            "s": m.wall_s,
            "mb": m.max_rss_mb,
            "reused": reused["reused"],
            "items": reused["items"],
        }
        ctx.log(
            f"  create with the index {n:,}: {m.wall_s:.1f} s, {m.max_rss_mb:.0f} MB, "
            f"{reused['reused']:,} reused"
        )
        m = env.cli("create", "Summarize this row in one line", "--over", str(grown), "--json")
        more = json.loads(m.stdout)
        data[f"grown {n}"] = {
            "s": m.wall_s,
            "mb": m.max_rss_mb,
            "reused": more["reused"],
            "items": more["items"],
        }
        ctx.log(
            f"  create over +1% {n:,}: {more['items'] - more['reused']:,} of {more['items']:,} "
            "to run"
        )

    result = RowResult(
        row=ROW,
        title=TITLE,
        compared_with="plain create",
        goal=f"create with a full index <= {GOAL} x a plain create, memory flat (RSS at "
        f"{large:,} <= {FLAT} x at "
        f"{small:,}); after 1% new rows, 1% of the items left to run",
        setup=(
            f"CSVs of {small:,} and {large:,} rows (about 110 bytes a row) and the same plus 1% "
            "new rows; SQLite; each command a `hermes-bulk` child process, timed start to exit; "
            "peak RSS from wait4. The earlier job's answers were written set-wise by bench.drive "
            "answer-all (as its completions would leave them)."
        ),
        raw=data,
    )
    a, b, g = data[f"reuse {small}"], data[f"reuse {large}"], data[f"grown {large}"]
    p = data[f"plain {large}"]
    ratio = b["s"] / p["s"]
    growth = b["mb"] / a["mb"]
    result.lines.append(
        Line(
            f"create, every row answered before, {large:,} rows",
            f"{fmt_s(b['s'])}, {b['mb']:.0f} MB (RSS x{growth:.2f} from {small:,}), "
            f"{b['reused']:,} reused",
            f"plain create {fmt_s(p['s'])}",
            ratio,
            f"<= {GOAL}, RSS x <= {FLAT}",
            ratio <= GOAL and growth <= FLAT and b["reused"] == large,
        )
    )
    to_run = g["items"] - g["reused"]
    share = to_run / g["items"]
    result.lines.append(
        Line(
            f"create over the rows + 1% new, {large:,} rows",
            f"{to_run:,} of {g['items']:,} to run ({share:.2%})",
            "1% new rows",
            share / (1 / 101),
            "= 1.00",
            to_run == large // 100,
        )
    )
    result.details.append(
        table(
            [
                "size",
                "plain create",
                "peak RSS",
                "create with index",
                "peak RSS",
                "reused",
                "+1%: to run",
            ],
            [
                [
                    f"{n:,}",
                    fmt_s(data[f"plain {n}"]["s"]),
                    f"{data[f'plain {n}']['mb']:.0f} MB",
                    fmt_s(data[f"reuse {n}"]["s"]),
                    f"{data[f'reuse {n}']['mb']:.0f} MB",
                    f"{data[f'reuse {n}']['reused']:,}",
                    f"{data[f'grown {n}']['items'] - data[f'grown {n}']['reused']:,}",
                ]
                for n in (small, large)
            ],
        )
    )
    return result
