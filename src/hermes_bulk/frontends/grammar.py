"""Every command of `hermes-bulk` and `/bulk` and its options, declared once as data.

The parser of both front ends (parser.build_parser), every --help, `/bulk help` and docs/cli.md are
made from GRAMMAR: a new option is one `Option` in its command's tuple, `where` saying which front
ends offer it. An option's `key` is the name its value has once parsed (argparse's dest): the name
the reply handlers take it by (parser.options_for).
"""

from __future__ import annotations

import argparse

from ..jobs.model_options import MAX_TEMPERATURE
from ..store.records import MAX_COST_USD
from . import values as v
from .options import CLI, Command, Option, Wording
from .values import span

PROG_DESCRIPTION = (
    "Apply one instruction to many items, each its own model call, as a durable background job."
)

EPILOG = """\
examples:
  hermes-bulk create "Summarize this report in 3 bullet points" --over ./reports
  hermes-bulk run 29b74c4db08b --wait
  hermes-bulk status 29b74c4db08b --watch
  hermes-bulk export 29b74c4db08b --format csv
  hermes-bulk worker -w 16            # process jobs that were run (any number of machines)
  hermes-bulk dashboard               # a live web page of the jobs and workers (prints its URL)
  hermes-bulk budget status           # the request budget shared with Hermes' cron-budget
  hermes-bulk doctor                  # can the endpoint, key and model serve a job?

exit status: 0 ok, 1 error, 2 bad usage, 3 backend unreachable, 4 the job paused (--wait, wait),
             130 interrupted
"""

JOB = Option("job", metavar="JOB")
JSON = Option("--json", action="store_true", help="machine-readable", where=CLI)
WAIT_HERE = Option(
    "--wait", action="store_true", help="also run workers here until the job ends", where=CLI
)

CREATE = (
    Option("instruction", nargs="?", help="what to do with each item (or --instruction-file)"),
    Option(
        "--instruction-file", metavar="PATH", help="read the instruction from a UTF-8 text file"
    ),
    Option(
        "--dry-run",
        action="store_true",
        help="show the first item's request, the item count and the token estimate; create nothing",
    ),
    Option(
        "--full",
        action="store_true",
        help="with --dry-run: show the whole first request (default: about a screenful of it)",
    ),
    Option(
        "--over",
        required=True,
        metavar="PATH",
        help="a directory, .csv, .json, .jsonl or any file",
    ),
    Option(
        "--concurrency",
        type=v.concurrency,
        metavar="N",
        help="items at once, 1 to max_concurrency (default 4; max_concurrency is at most "
        f"{v.MAX_CONCURRENCY})",
    ),
    Option(
        "--retries",
        type=v.retries,
        metavar="N",
        help=f"automatic retries per item, {span(0, v.MAX_RETRIES)} (default max_retries)",
    ),
    Option(
        "--max-tokens",
        type=v.max_tokens,
        metavar="N",
        help=f"pause the job before it goes over N tokens ({span(1, v.MAX_TOKENS)})",
    ),
    Option(
        "--max-cost",
        type=v.usd,
        metavar="USD",
        help="pause the job before it spends more than USD US dollars (at the job's price; "
        f"up to {MAX_COST_USD:,})",
    ),
    Option(
        "--rpm",
        type=v.whole(1, v.MAX_RPM),
        metavar="N",
        help=f"pace requests to N per minute, shared by all workers ({span(1, v.MAX_RPM)})",
    ),
    Option(
        "--tpm",
        type=v.whole(1, v.MAX_TPM),
        metavar="N",
        help=f"pace tokens to N per minute, shared by all workers ({span(1, v.MAX_TPM)})",
    ),
    Option(
        "--schema",
        metavar="FILE",
        help="JSON schema file: structured answers, one export column per field",
    ),
    Option(
        "--temperature",
        type=v.number(0, MAX_TEMPERATURE, above_minimum=False),
        metavar="X",
        help=f"sampling temperature, {span(0.0, MAX_TEMPERATURE)} (default: the provider's)",
    ),
    Option(
        "--max-output-tokens",
        type=v.whole(1, v.MAX_OUTPUT_TOKENS),
        metavar="N",
        help=f"at most N tokens per answer, {span(1, v.MAX_OUTPUT_TOKENS)} (default "
        "max_output_tokens)",
    ),
    Option(
        "--system",
        metavar="FILE",
        help="a UTF-8 text file: system prompt sent ahead of the item framing with every item",
    ),
    Option(
        "-o",
        dest="option",
        action="append",
        metavar="FIELD=VALUE",
        help="a request field sent with every item, e.g. -o top_p=0.9 (a JSON value, else "
        "text; repeatable)",
    ),
    Option(
        "--template",
        metavar="TEXT",
        help="CSV/JSON/JSONL: build each item from named fields, e.g. 'Title: {title}\\n{body}' "
        "(default: the whole row or record)",
    ),
    Option(
        "--fields",
        metavar="A,B",
        help="CSV/JSON/JSONL: send only these fields of each row or record",
    ),
    Option(
        "--fresh",
        action="store_true",
        help="ask the model for every item, reusing no earlier answer (default: HERMES_BULK_REUSE)",
    ),
    Option(
        "--batch",
        action="store_true",
        help="run through the provider's Batch API (about half the price, answers within its "
        "window) by a hermes-bulk worker",
    ),
    Option(
        "--batch-deadline",
        type=v.duration,
        metavar="DURATION",
        help="with --batch: items still in a batch this long (e.g. 6h, 90m) are cancelled there "
        "and run live",
    ),
    Option(
        "--poll",
        type=v.number(1, v.MAX_WAIT_S, above_minimum=False),
        metavar="SECONDS",
        help="with --batch: ask the provider how its batches are doing every SECONDS "
        f"({span(1.0, v.MAX_WAIT_S)}; default batch_poll_seconds)",
    ),
    Option("--model", metavar="NAME", help="model name (default HERMES_BULK_MODEL)", where=CLI),
    Option(
        "--json",
        action="store_true",
        help='print {"job_id", "items", "skipped", "skipped_entries"}',
        where=CLI,
    ),
)

#: run and resume: change how the job runs, recorded on it for every worker.
JOB_CONTROLS = (
    Option(
        "--concurrency",
        type=v.concurrency,
        metavar="N",
        help="items at once from now on, 1 to max_concurrency (recorded on the job)",
    ),
    Option(
        "--rpm",
        type=v.whole(1, v.MAX_RPM),
        metavar="N",
        help=f"pace requests to N per minute from now on ({span(1, v.MAX_RPM)})",
    ),
    Option(
        "--tpm",
        type=v.whole(1, v.MAX_TPM),
        metavar="N",
        help=f"pace tokens to N per minute from now on ({span(1, v.MAX_TPM)})",
    ),
)

RUN = (
    JOB,
    *JOB_CONTROLS,
    Option(
        "--sample",
        type=v.whole(1, v.MAX_SAMPLE),
        metavar="N",
        help="run only N pending items, spread over the job (the first, the last, evenly "
        f"between; {span(1, v.MAX_SAMPLE)}), then pause it; resume runs the rest",
    ),
    Option(
        "--wait",
        action="store_true",
        help="also run workers here until the job ends, with progress",
        where=CLI,
    ),
    Option(
        "-w --workers",
        type=v.concurrency,
        metavar="N",
        help=f"threads with --wait, {span(1, v.MAX_CONCURRENCY)} (default: the job's "
        "concurrency; more threads than it do not run more items: use --concurrency)",
        where=CLI,
    ),
    Option(
        "--no-check",
        action="store_true",
        help="do not check the endpoint, key and model first (as doctor does) before running",
        where=CLI,
    ),
)

STATUS = (
    Option("job", nargs="?", metavar="JOB"),
    Option(
        "--events",
        type=v.events,
        default=0,
        metavar="N",
        help=f"also show the last N events ({span(0, v.MAX_LISTED)})",
    ),
    Option(
        "--failed", action="store_true", help="list the failed items by name, with their errors"
    ),
    JSON,
    Option("--watch", action="store_true", help="live view until the job ends", where=CLI),
)

RESUME = (
    JOB,
    Option(
        "--max-tokens",
        type=v.max_tokens,
        metavar="N",
        help=f"a new token limit ({span(1, v.MAX_TOKENS)})",
    ),
    Option(
        "--max-cost",
        type=v.usd,
        metavar="USD",
        help=f"a new limit in US dollars (up to {MAX_COST_USD:,})",
    ),
    *JOB_CONTROLS,
    WAIT_HERE,
)

_OUTPUT_HELP = (
    "a regular file to write (default: results.FORMAT in the job's folder, named apart for "
    "--only and --with-input: results-failed-with-input.csv)"
)

EXPORT = (
    JOB,
    Option("--format", choices=("md", "csv", "jsonl"), default="md"),
    Option(
        "--with-input",
        action="store_true",
        help="csv, jsonl: put each item's input beside its answer (a CSV's own columns, "
        'a JSON record as "input", a file\'s "path")',
    ),
    Option(
        "--output",
        metavar="PATH",
        help=Wording(cli=_OUTPUT_HELP + "; - for standard output", slash=_OUTPUT_HELP),
    ),
    Option(
        "--only",
        choices=("failed", "completed"),
        help="only the items in this state (default: every item)",
    ),
    Option(
        "--column",
        metavar="NAME",
        help="csv, jsonl: the answer's column or key (default result; --schema fields keep theirs)",
    ),
)

SHOW = (
    JOB,
    Option(
        "item",
        metavar="ITEM",
        help="the item's name as exports show it (2026/q1.txt, row:4) or its number",
    ),
    JSON,
)

DELETE = (
    JOB,
    Option(
        "--abandon-batches",
        action="store_true",
        help="a --batch job: delete it even when its open batches cannot be cancelled at the "
        "provider (they run on there, and are billed)",
    ),
    Option(
        "-y --yes",
        action="store_true",
        help="do not ask first (it asks only when standard input is a terminal)",
        where=CLI,
    ),
)

WORKER = (
    Option(
        "-w --workers",
        type=v.concurrency,
        metavar="N",
        help=f"worker threads, {span(1, v.MAX_CONCURRENCY)} (default max_concurrency)",
    ),
    Option(
        "-d --delay",
        type=v.seconds,
        metavar="S",
        help=f"initial queue polling delay, more than 0 up to {v.MAX_WAIT_S:g} (SQLite)",
    ),
    Option(
        "-m --max-delay",
        type=v.seconds,
        metavar="S",
        help=f"longest queue polling delay, more than 0 up to {v.MAX_WAIT_S:g} (SQLite)",
    ),
    Option(
        "-b --backoff",
        type=v.number(1, v.MAX_BACKOFF, above_minimum=False),
        metavar="F",
        help=f"polling backoff factor, {span(1.0, v.MAX_BACKOFF)} (SQLite)",
    ),
    Option(
        "-t --shutdown-timeout",
        type=v.number(0, v.MAX_SHUTDOWN_S),
        metavar="S",
        help=f"bound the graceful shutdown, more than 0 up to {v.MAX_SHUTDOWN_S:g}",
    ),
    Option(
        "-g --graceful-signal",
        choices=("INT", "TERM"),
        default="INT",
        help="the signal that lets running items finish (the other stops at once)",
    ),
    Option("--burst", action="store_true", help="exit once no running job has work left"),
    Option(
        "--resume-interrupted",
        action="store_true",
        default=None,
        help="at start, continue jobs that a graceful worker stop (SIGINT, SIGTERM, SIGHUP) "
        "cut off, as in a rolling restart; never jobs cut off by a crash "
        "(default HERMES_BULK_RESUME_INTERRUPTED, else off: they wait for run)",
    ),
    Option(
        "--metrics-port",
        type=v.whole(1, v.MAX_PORT),
        metavar="N",
        help=f"serve Prometheus metrics on this port ({span(1, v.MAX_PORT)})",
    ),
    Option(
        "--metrics-host",
        default="127.0.0.1",
        metavar="ADDR",
        help="address for --metrics-port (default 127.0.0.1; 0.0.0.0 for a fleet)",
    ),
    Option("-l --logfile", metavar="FILE", help="log to this file"),
    Option("-v --verbose", action="store_true", help="debug logging", exclusive="verbosity"),
    Option("-q --quiet", action="store_true", help="warnings only", exclusive="verbosity"),
)

WAIT = (
    JOB,
    Option(
        "--timeout",
        type=v.seconds,
        metavar="S",
        help=Wording(
            cli="give up after S seconds (exit 124)", slash="give up sooner, after S seconds"
        ),
    ),
)

DASHBOARD = (
    Option(
        "--host",
        default="127.0.0.1",
        metavar="ADDR",
        help="address to listen on (default 127.0.0.1; another needs HERMES_BULK_DASHBOARD_TOKEN)",
    ),
    Option(
        "--port",
        type=v.whole(0, v.MAX_PORT),
        default=8765,
        metavar="N",
        help=f"port to listen on ({span(0, v.MAX_PORT)}, default 8765; 0: a free one)",
    ),
)


def budget_grammar(parser: argparse.ArgumentParser) -> None:
    from ..budget.grammar import add_budget_arguments

    add_budget_arguments(parser)


#: Every command, in the order help lists them.
GRAMMAR: tuple[Command, ...] = (
    Command(
        "create", help="create a job over a directory or file (no model calls)", options=CREATE
    ),
    Command("run", help="process the job's pending items", options=RUN),
    Command("status", help="one job, or the most recent jobs", options=STATUS),
    Command("pause", help="stop new items from starting", options=(JOB,)),
    Command("resume", help="continue a paused job", options=RESUME),
    Command(
        "retry",
        help="return failed items to the queue and process them",
        options=(JOB, WAIT_HERE),
    ),
    Command("export", help="write all results to one file (no model calls)", options=EXPORT),
    Command(
        "show",
        help="one item: its state, the content as sent, the answer, every attempt",
        options=SHOW,
    ),
    Command(
        "list",
        help="the most recent jobs",
        options=(
            Option(
                "--limit",
                type=v.listed,
                default=20,
                metavar="N",
                help=f"at most N jobs ({span(1, v.MAX_LISTED)})",
            ),
            Option("--json", action="store_true", where=CLI),
        ),
    ),
    Command(
        "events",
        help="a job's history: skipped entries, failed attempts, waits",
        options=(
            JOB,
            Option(
                "--limit",
                type=v.listed,
                default=50,
                metavar="N",
                help=f"the last N events ({span(1, v.MAX_LISTED)})",
            ),
        ),
    ),
    Command(
        "doctor",
        help=Wording(
            cli="check that the endpoint answers, the key is accepted and the model is known",
            slash="check Hermes' model with one 1-token request (counted as bulk)",
        ),
        description=Wording(
            cli="One line per check, from one cheap request (GET /models; a 1-token request "
            "only when the model is not listed there). Exit status 0 when usable, else 1.",
            slash="One 1-token request through Hermes' model, as an item's goes; while the "
            "request budget holds bulk requests nothing is sent.",
        ),
        options=(
            Option(
                "--model",
                metavar="NAME",
                help="check this model (default HERMES_BULK_MODEL)",
                where=CLI,
            ),
        ),
    ),
    Command("delete", help="remove a job, its results and its files", options=DELETE),
    Command(
        "worker",
        help="run a worker (a Huey consumer) for the configured backend",
        description="Processes triggers of jobs that were run. Flags follow huey_consumer.",
        options=WORKER,
        where=CLI,
    ),
    Command("workers", help="list live workers and the items they hold", where=CLI),
    Command(
        "wait",
        # /bulk wait: as long as a reply may wait (replies.wait), not until the end
        help=Wording(
            cli="block until a job ends (for scripts)",
            slash="wait for a job to end, as long as a reply may (then a notice follows)",
        ),
        description=Wording(
            cli="Blocks until the job ends, with a progress bar on a terminal, then prints its "
            "status. Runs no workers: something else processes the job.",
            slash=None,
        ),
        epilog=Wording(
            cli="exit status: 0 completed without failures, 1 completed with failed items or "
            "failed, 4 paused (by a user or at its token limit), 124 --timeout passed, "
            "2 bad usage, 3 backend unreachable",
            slash=None,
        ),
        options=WAIT,
    ),
    Command("path", help="print the data directory", where=CLI),
    Command(
        "dashboard",
        help="serve a live web dashboard of jobs and workers",
        description="Serves a web page of the jobs, one job and the workers, updated live, with "
        "pause, resume, retry and export. Prints its URL with an access token "
        "(HERMES_BULK_DASHBOARD_TOKEN, else a new one each start). Loopback only "
        "unless HERMES_BULK_DASHBOARD_TOKEN is set.",
        options=DASHBOARD,
        where=CLI,
    ),
    Command(
        "budget",
        help="the request budget that holds cron and bulk before the chat reserve",
        description="The cron-budget ledger (shared with Hermes' `hermes cron-budget`).",
        grammar=budget_grammar,
        where=CLI,
    ),
)

#: Every command name either front end knows: another first word is an instruction (or a typo).
COMMANDS = tuple(command.name for command in GRAMMAR)
