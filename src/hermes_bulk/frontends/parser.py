"""The command grammar, shared by `hermes-bulk …` and `/bulk …` (one parser serves both).

A first word that is not a command means `create`, so `/bulk "Summarize" --over ./reports`
and `hermes-bulk create "Summarize" --over ./reports` are the same request. Parse errors
raise UsageError (never exit), so the slash command can answer with the message.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import inspect
import math
import re
import shlex
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

from ..durations import parse_duration
from ..errors import UsageError
from ..jobs.model_options import MAX_TEMPERATURE
from ..store.records import MAX_COST_USD, NANO_PER_USD
from ..usage import Parser
from .terminal import CHAT_WIDTH

#: The most items `run --sample` takes: a look before paying for all (each claim walks the
#: sample for its next pending item).
MAX_SAMPLE = 1000

COMMANDS = (
    "create",
    "run",
    "status",
    "pause",
    "resume",
    "retry",
    "export",
    "list",
    "events",
    "show",
    "delete",
    "worker",
    "workers",
    "path",
    "budget",
    "wait",
    "dashboard",
    "doctor",
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


#: How help is laid out in a chat (/bulk): lines of CHAT_WIDTH.
CHAT_FORMATTER = functools.partial(argparse.HelpFormatter, width=CHAT_WIDTH)

# The range of every number on the command line (shown in --help and docs/cli.md). The upper
# bounds keep a typo from reaching the store as a value it cannot hold (SQLite's 64-bit
# integers, Lua's 2**53) or from starting a billion threads; each is far above real use.
MAX_CONCURRENCY = 1024  #: as the max_concurrency setting's own bound (config/settings.py)
MAX_RETRIES = 20  #: as the max_retries setting's bound
MAX_TOKENS = 10**12  #: --max-tokens: a trillion tokens
MAX_RPM = 1_000_000  #: --rpm, as the rpm setting's bound
MAX_TPM = 1_000_000_000  #: --tpm, as the tpm setting's bound
MAX_LISTED = 10_000  #: --limit, --events
MAX_PORT = 65_535
MAX_WAIT_S = 3600.0  #: worker polling delays
MAX_SHUTDOWN_S = 86_400.0
MAX_BACKOFF = 10.0
MAX_OUTPUT_TOKENS = 1_000_000  #: --max-output-tokens, as the max_output_tokens setting's bound


def _whole(minimum: int, maximum: int):
    """An argparse type: a whole number from minimum to maximum, with a message that says so."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not minimum <= value <= maximum:
            shown = (
                f"{value:,}"
                if len(str(value)) <= 24
                else f"{str(value)[:12]}… ({len(str(value))} digits)"
            )
            raise argparse.ArgumentTypeError(
                f"{shown} is out of range; use {minimum:,} to {maximum:,}"
            )
        return value

    return parse


def _number(minimum: float, maximum: float, *, above_minimum: bool = True):
    """An argparse type: a finite number in (minimum, maximum] (or [minimum, maximum])."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        low_ok = value > minimum if above_minimum else value >= minimum
        if not (math.isfinite(value) and low_ok and value <= maximum):
            low = f"more than {minimum:g}" if above_minimum else f"from {minimum:g}"
            raise argparse.ArgumentTypeError(f"{text} is out of range; use {low} up to {maximum:g}")
        return value

    return parse


def _range(minimum: float, maximum: float) -> str:
    return f"{minimum:,}-{maximum:,}" if isinstance(minimum, int) else f"{minimum:g}-{maximum:g}"


def _usd(text: str) -> int:
    """--max-cost: US dollars (more than 0, at most MAX_COST_USD), as nano-USD."""
    try:
        value = Decimal(text.strip().removeprefix("$").replace(",", ""))
    except (InvalidOperation, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not an amount in US dollars") from None
    if not (value.is_finite() and 0 < value <= MAX_COST_USD):
        raise argparse.ArgumentTypeError(
            f"{text} is out of range; use more than 0 up to {MAX_COST_USD:,} (US dollars)"
        )
    nusd = int(value * NANO_PER_USD)  # a fraction of a nano-dollar is dropped: never above it
    if nusd <= 0:
        raise argparse.ArgumentTypeError(f"{text} is less than a nano-dollar; give more")
    return nusd


_concurrency = _whole(1, MAX_CONCURRENCY)
_retries = _whole(0, MAX_RETRIES)
_max_tokens = _whole(1, MAX_TOKENS)
_listed, _events = _whole(1, MAX_LISTED), _whole(0, MAX_LISTED)
_seconds = _number(0, MAX_WAIT_S)


def _duration(text: str) -> float:
    seconds = parse_duration(text)
    if seconds is None or not 0 < seconds <= 30 * 86400:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration such as 90s, 30m, 6h or 2d (at most 30d)"
        )
    return seconds


def _add_job_controls(p: argparse.ArgumentParser) -> None:
    """run and resume: change how the job runs, recorded on it for every worker."""
    p.add_argument(
        "--concurrency",
        type=_concurrency,
        metavar="N",
        help="items at once from now on, 1 to max_concurrency (recorded on the job)",
    )
    p.add_argument(
        "--rpm",
        type=_whole(1, MAX_RPM),
        metavar="N",
        help=f"pace requests to N per minute from now on ({_range(1, MAX_RPM)})",
    )
    p.add_argument(
        "--tpm",
        type=_whole(1, MAX_TPM),
        metavar="N",
        help=f"pace tokens to N per minute from now on ({_range(1, MAX_TPM)})",
    )


def _add_version(parser: Parser, for_slash: bool) -> None:
    """hermes-bulk --version (a chat has no use for it)."""
    if not for_slash:
        from importlib.metadata import version  # the installed distribution's, as pip says it

        parser.add_argument(
            "--version", action="version", version=f"hermes-bulk {version('hermes-bulk')}"
        )


def _add_slash_wait(add_command: Callable[..., Parser], for_slash: bool) -> None:
    """/bulk wait: as long as a reply may wait (replies.wait), not until the end."""
    if for_slash:
        p = add_command(
            "wait",
            help="wait for a job to end, as long as a reply may (then a notice follows)",
        )
        p.add_argument("job", metavar="JOB")
        p.add_argument(
            "--timeout", type=_seconds, metavar="S", help="give up sooner, after S seconds"
        )


def build_parser(
    prog: str = "hermes-bulk", *, for_slash: bool = False, command: str | None = None
) -> Parser:
    """The parser of every command; given `command` (the first word typed), the budget's arguments
    are added only when it is `budget`."""
    parser = Parser(
        prog=prog,
        description="Apply one instruction to many items, each its own model call, "
        "as a durable background job.",
        epilog=None if for_slash else EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_version(parser, for_slash)
    # In a chat the help has the chat's width, not that of the terminal the gateway started in.
    parser_class = (
        functools.partial(Parser, formatter_class=CHAT_FORMATTER) if for_slash else Parser
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=parser_class)
    parser.subcommands = sub.choices
    parser.command_help = {}

    def add_command(name: str, **kwargs: Any) -> Parser:
        parser.command_help[name] = kwargs["help"]
        return sub.add_parser(name, **kwargs)

    p = add_command("create", help="create a job over a directory or file (no model calls)")
    p.add_argument(
        "instruction", nargs="?", help="what to do with each item (or --instruction-file)"
    )
    p.add_argument(
        "--instruction-file", metavar="PATH", help="read the instruction from a UTF-8 text file"
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="show the first item's request, the item count and the token estimate; create nothing",
    )
    p.add_argument(
        "--full",
        action="store_true",
        help="with --dry-run: show the whole first request (default: about a screenful of it)",
    )
    p.add_argument(
        "--over", required=True, metavar="PATH", help="a directory, .csv, .json, .jsonl or any file"
    )
    p.add_argument(
        "--concurrency",
        type=_concurrency,
        metavar="N",
        help="items at once, 1 to max_concurrency (default 4; max_concurrency is at most "
        f"{MAX_CONCURRENCY})",
    )
    p.add_argument(
        "--retries",
        type=_retries,
        metavar="N",
        help=f"automatic retries per item, {_range(0, MAX_RETRIES)} (default max_retries)",
    )
    p.add_argument(
        "--max-tokens",
        type=_max_tokens,
        metavar="N",
        help=f"pause the job before it goes over N tokens ({_range(1, MAX_TOKENS)})",
    )
    p.add_argument(
        "--max-cost",
        type=_usd,
        metavar="USD",
        help="pause the job before it spends more than USD US dollars (at the job's price; "
        f"up to {MAX_COST_USD:,})",
    )
    p.add_argument(
        "--rpm",
        type=_whole(1, MAX_RPM),
        metavar="N",
        help=f"pace requests to N per minute, shared by all workers ({_range(1, MAX_RPM)})",
    )
    p.add_argument(
        "--tpm",
        type=_whole(1, MAX_TPM),
        metavar="N",
        help=f"pace tokens to N per minute, shared by all workers ({_range(1, MAX_TPM)})",
    )
    p.add_argument(
        "--schema",
        metavar="FILE",
        help="JSON schema file: structured answers, one export column per field",
    )
    p.add_argument(
        "--temperature",
        type=_number(0, MAX_TEMPERATURE, above_minimum=False),
        metavar="X",
        help=f"sampling temperature, {_range(0.0, MAX_TEMPERATURE)} (default: the provider's)",
    )
    p.add_argument(
        "--max-output-tokens",
        type=_whole(1, MAX_OUTPUT_TOKENS),
        metavar="N",
        help=f"at most N tokens per answer, {_range(1, MAX_OUTPUT_TOKENS)} (default "
        "max_output_tokens)",
    )
    p.add_argument(
        "--system",
        metavar="FILE",
        help="a UTF-8 text file: system prompt sent ahead of the item framing with every item",
    )
    p.add_argument(
        "-o",
        dest="option",
        action="append",
        metavar="FIELD=VALUE",
        help="a request field sent with every item, e.g. -o top_p=0.9 (a JSON value, else "
        "text; repeatable)",
    )
    p.add_argument(
        "--template",
        metavar="TEXT",
        help="CSV/JSON/JSONL: build each item from named fields, e.g. 'Title: {title}\\n{body}' "
        "(default: the whole row or record)",
    )
    p.add_argument(
        "--fields",
        metavar="A,B",
        help="CSV/JSON/JSONL: send only these fields of each row or record",
    )
    p.add_argument(
        "--fresh",
        action="store_true",
        help="ask the model for every item, reusing no earlier answer (default: HERMES_BULK_REUSE)",
    )
    p.add_argument(
        "--batch",
        action="store_true",
        help="run through the provider's Batch API (about half the price, answers within its "
        "window) "
        "by a hermes-bulk worker",
    )
    p.add_argument(
        "--batch-deadline",
        type=_duration,
        metavar="DURATION",
        help="with --batch: items still in a batch this long (e.g. 6h, 90m) are cancelled there "
        "and run live",
    )
    p.add_argument(
        "--poll",
        type=_number(1, MAX_WAIT_S, above_minimum=False),
        metavar="SECONDS",
        help=f"with --batch: ask the provider how its batches are doing every SECONDS "
        f"({_range(1.0, MAX_WAIT_S)}; default batch_poll_seconds)",
    )
    if not for_slash:
        p.add_argument("--model", metavar="NAME", help="model name (default HERMES_BULK_MODEL)")
        p.add_argument(
            "--json",
            action="store_true",
            help='print {"job_id", "items", "skipped", "skipped_entries"}',
        )

    p = add_command("run", help="process the job's pending items")
    p.add_argument("job", metavar="JOB")
    _add_job_controls(p)
    p.add_argument(
        "--sample",
        type=_whole(1, MAX_SAMPLE),
        metavar="N",
        help="run only N pending items, spread over the job (the first, the last, evenly "
        f"between; {_range(1, MAX_SAMPLE)}), then pause it; resume runs the rest",
    )
    if not for_slash:
        p.add_argument(
            "--wait",
            action="store_true",
            help="also run workers here until the job ends, with progress",
        )
        p.add_argument(
            "-w",
            "--workers",
            type=_concurrency,
            metavar="N",
            help=f"threads with --wait, {_range(1, MAX_CONCURRENCY)} (default: the job's "
            "concurrency; "
            "more threads than it do not run more items: use --concurrency)",
        )
        p.add_argument(
            "--no-check",
            action="store_true",
            help="do not check the endpoint, key and model first (as doctor does) before running",
        )

    p = add_command("status", help="one job, or the most recent jobs")
    p.add_argument("job", nargs="?", metavar="JOB")
    p.add_argument(
        "--events",
        type=_events,
        default=0,
        metavar="N",
        help=f"also show the last N events ({_range(0, MAX_LISTED)})",
    )
    p.add_argument(
        "--failed", action="store_true", help="list the failed items by name, with their errors"
    )
    if not for_slash:
        p.add_argument("--json", action="store_true", help="machine-readable")
        p.add_argument("--watch", action="store_true", help="live view until the job ends")

    p = add_command("pause", help="stop new items from starting")
    p.add_argument("job", metavar="JOB")
    p = add_command("resume", help="continue a paused job")
    p.add_argument("job", metavar="JOB")
    p.add_argument(
        "--max-tokens",
        type=_max_tokens,
        metavar="N",
        help=f"a new token limit ({_range(1, MAX_TOKENS)})",
    )
    p.add_argument(
        "--max-cost",
        type=_usd,
        metavar="USD",
        help=f"a new limit in US dollars (up to {MAX_COST_USD:,})",
    )
    _add_job_controls(p)
    p = add_command("retry", help="return failed items to the queue and process them")
    p.add_argument("job", metavar="JOB")
    if not for_slash:
        for name in ("resume", "retry"):
            sub.choices[name].add_argument(
                "--wait", action="store_true", help="also run workers here until the job ends"
            )

    p = add_command("export", help="write all results to one file (no model calls)")
    p.add_argument("job", metavar="JOB")
    p.add_argument("--format", choices=("md", "csv", "jsonl"), default="md")
    p.add_argument(
        "--with-input",
        action="store_true",
        help="csv, jsonl: put each item's input beside its answer (a CSV's own columns, "
        'a JSON record as "input", a file\'s "path")',
    )
    p.add_argument(
        "--output",
        metavar="PATH",
        help="a regular file to write (default: results.FORMAT in the job's folder, named "
        "apart for --only and --with-input: results-failed-with-input.csv)"
        + ("" if for_slash else "; - for standard output"),
    )
    p.add_argument(
        "--only",
        choices=("failed", "completed"),
        help="only the items in this state (default: every item)",
    )
    p.add_argument(
        "--column",
        metavar="NAME",
        help="csv, jsonl: the answer's column or key (default result; --schema fields keep theirs)",
    )

    p = add_command(
        "show", help="one item: its state, the content as sent, the answer, every attempt"
    )
    p.add_argument("job", metavar="JOB")
    p.add_argument(
        "item",
        metavar="ITEM",
        help="the item's name as exports show it (2026/q1.txt, row:4) or its number",
    )
    if not for_slash:
        p.add_argument("--json", action="store_true", help="machine-readable")

    p = add_command("list", help="the most recent jobs")
    p.add_argument(
        "--limit",
        type=_listed,
        default=20,
        metavar="N",
        help=f"at most N jobs ({_range(1, MAX_LISTED)})",
    )
    if not for_slash:
        p.add_argument("--json", action="store_true")

    p = add_command("events", help="a job's history: skipped entries, failed attempts, waits")
    p.add_argument("job", metavar="JOB")
    p.add_argument(
        "--limit",
        type=_listed,
        default=50,
        metavar="N",
        help=f"the last N events ({_range(1, MAX_LISTED)})",
    )

    p = add_command(
        "doctor",
        help="check Hermes' model with one 1-token request (counted as bulk)"
        if for_slash
        else "check that the endpoint answers, the key is accepted and the model is known",
        description="One 1-token request through Hermes' model, as an item's goes; while the "
        "request budget holds bulk requests nothing is sent."
        if for_slash
        else "One line per check, from one cheap request (GET /models; a 1-token request "
        "only when the model is not listed there). Exit status 0 when usable, else 1.",
    )
    if not for_slash:
        p.add_argument(
            "--model", metavar="NAME", help="check this model (default HERMES_BULK_MODEL)"
        )

    p = add_command("delete", help="remove a job, its results and its files")
    p.add_argument("job", metavar="JOB")
    p.add_argument(
        "--abandon-batches",
        action="store_true",
        help="a --batch job: delete it even when its open batches cannot be cancelled at the "
        "provider "
        "(they run on there, and are billed)",
    )
    if not for_slash:
        p.add_argument(
            "-y",
            "--yes",
            action="store_true",
            help="do not ask first (it asks only when standard input is a terminal)",
        )

    if not for_slash:
        p = add_command(
            "worker",
            help="run a worker (a Huey consumer) for the configured backend",
            description="Processes triggers of jobs that were run. Flags follow huey_consumer.",
        )
        p.add_argument(
            "-w",
            "--workers",
            type=_concurrency,
            metavar="N",
            help=f"worker threads, {_range(1, MAX_CONCURRENCY)} (default max_concurrency)",
        )
        p.add_argument(
            "-d",
            "--delay",
            type=_seconds,
            metavar="S",
            help=f"initial queue polling delay, more than 0 up to {MAX_WAIT_S:g} (SQLite)",
        )
        p.add_argument(
            "-m",
            "--max-delay",
            type=_seconds,
            metavar="S",
            help=f"longest queue polling delay, more than 0 up to {MAX_WAIT_S:g} (SQLite)",
        )
        p.add_argument(
            "-b",
            "--backoff",
            type=_number(1, MAX_BACKOFF, above_minimum=False),
            metavar="F",
            help=f"polling backoff factor, {_range(1.0, MAX_BACKOFF)} (SQLite)",
        )
        p.add_argument(
            "-t",
            "--shutdown-timeout",
            type=_number(0, MAX_SHUTDOWN_S),
            metavar="S",
            help=f"bound the graceful shutdown, more than 0 up to {MAX_SHUTDOWN_S:g}",
        )
        p.add_argument(
            "-g",
            "--graceful-signal",
            choices=("INT", "TERM"),
            default="INT",
            help="the signal that lets running items finish (the other stops at once)",
        )
        p.add_argument(
            "--burst", action="store_true", help="exit once no running job has work left"
        )
        p.add_argument(
            "--resume-interrupted",
            action="store_true",
            default=None,
            help="at start, continue jobs that a graceful worker stop (SIGINT, SIGTERM, SIGHUP) "
            "cut "
            "off, as in a rolling restart; never jobs cut off by a crash "
            "(default HERMES_BULK_RESUME_INTERRUPTED, else off: they wait for run)",
        )
        p.add_argument(
            "--metrics-port",
            type=_whole(1, MAX_PORT),
            metavar="N",
            help=f"serve Prometheus metrics on this port ({_range(1, MAX_PORT)})",
        )
        p.add_argument(
            "--metrics-host",
            default="127.0.0.1",
            metavar="ADDR",
            help="address for --metrics-port (default 127.0.0.1; 0.0.0.0 for a fleet)",
        )
        p.add_argument("-l", "--logfile", metavar="FILE", help="log to this file")
        group = p.add_mutually_exclusive_group()
        group.add_argument("-v", "--verbose", action="store_true", help="debug logging")
        group.add_argument("-q", "--quiet", action="store_true", help="warnings only")

        add_command("workers", help="list live workers and the items they hold")
        p = add_command(
            "wait",
            help="block until a job ends (for scripts)",
            description="Blocks until the job ends, with a progress bar on a terminal, then "
            "prints its status. Runs no workers: something else processes the job.",
            epilog="exit status: 0 completed without failures, 1 completed with failed items or "
            "failed, 4 paused (by a user or at its token limit), 124 --timeout passed, "
            "2 bad usage, 3 backend unreachable",
        )
        p.add_argument("job", metavar="JOB")
        p.add_argument(
            "--timeout", type=_seconds, metavar="S", help="give up after S seconds (exit 124)"
        )
        add_command("path", help="print the data directory")
    _add_slash_wait(add_command, for_slash)
    if not for_slash:
        p = add_command(
            "dashboard",
            help="serve a live web dashboard of jobs and workers",
            description="Serves a web page of the jobs, one job and the workers, updated live, "
            "with "
            "pause, resume, retry and export. Prints its URL with an access token "
            "(HERMES_BULK_DASHBOARD_TOKEN, else a new one each start). Loopback only "
            "unless HERMES_BULK_DASHBOARD_TOKEN is set.",
        )
        p.add_argument(
            "--host",
            default="127.0.0.1",
            metavar="ADDR",
            help="address to listen on (default 127.0.0.1; another needs "
            "HERMES_BULK_DASHBOARD_TOKEN)",
        )
        p.add_argument(
            "--port",
            type=_whole(0, MAX_PORT),
            default=8765,
            metavar="N",
            help=f"port to listen on ({_range(0, MAX_PORT)}, default 8765; 0: a free one)",
        )

        p = add_command(
            "budget",
            help="the request budget that holds cron and bulk before the chat reserve",
            description="The cron-budget ledger (shared with Hermes' `hermes cron-budget`).",
        )
        if command in (None, "budget"):  # its help lists the budget's settings, which loads them
            from ..budget.grammar import add_budget_arguments

            add_budget_arguments(p)
    return parser


#: How a mistyped command looks: one bare lower-case word (an instruction is a sentence).
_COMMAND_WORD = re.compile(r"[a-z][a-z0-9_-]*")


def commands_text(parser: Parser) -> str:
    """Every command of a parser, as its usage and what it does: the command list of `/bulk help`,
    made from the parser itself so that it names every flag the commands take."""
    blocks = []
    for name, sub in parser.subcommands.items():
        first, *rest = (
            sub.format_usage().removeprefix("usage: ").replace(" [-h]", "").rstrip().splitlines()
        )
        blocks.append(
            "\n".join(
                [
                    first,
                    *(line[len("usage: ") :] for line in rest),
                    f"    {parser.command_help[name]}",
                ]
            )
        )
    return "\n".join(blocks)


def options_for(handler: Callable[..., object], args: argparse.Namespace) -> dict[str, Any]:
    """The parsed options a reply handler takes: its keyword parameters, by the grammar's names
    (`--max-tokens` is max_tokens). Options of one front end only (`--wait`) reach the handlers
    that have the parameter, or take them all (`**options`); a handler never sees a namespace."""
    wanted = inspect.signature(handler).parameters
    takes_all = any(p.kind is p.VAR_KEYWORD for p in wanted.values())
    return {name: value for name, value in vars(args).items() if takes_all or name in wanted}


def normalise(argv: list[str]) -> list[str]:
    """A first word that is not a command (or an option) is the instruction of `create`, and so
    is a first --instruction-file (`/bulk --instruction-file brief.txt --over data.csv`).

    Without --over the request cannot be a `create`, so a first word close to a command name
    (`stauts`), or one bare lower-case word (`frobnicate`), is an unknown command."""
    if (
        argv
        and argv[0] not in COMMANDS
        and (not argv[0].startswith("-") or argv[0].startswith("--instruction-file"))
    ):
        unknown_command(argv)
        return ["create", *argv]
    return argv


def unknown_command(argv: list[str]) -> None:
    """Raises UsageError when argv's first word is a mistyped command rather than an instruction."""
    word = argv[0]
    if any(a == "--over" or a.startswith(("--over=", "--instruction-file")) for a in argv):
        return
    close = difflib.get_close_matches(word.lower(), COMMANDS, n=1)
    if not close and not _COMMAND_WORD.fullmatch(word):
        return  # an instruction without --over: the parser asks for --over
    hint = f"did you mean {close[0]!r}?" if close else "an instruction needs --over PATH."
    raise UsageError(f"unknown command {word!r}; {hint}")


def split_slash_args(raw: str) -> list[str]:
    try:
        return normalise(shlex.split(raw))
    except ValueError as exc:
        raise UsageError(f"Cannot read the arguments ({exc}); close every quote.") from None
