"""The budget's command grammar: `status`, `set KEY VALUE`, `path` (for `hermes-bulk budget`,
`hermes cron-budget` and `/cron-budget`). Apart from commands.py so that building the
`hermes-bulk` parser loads none of the budget's service."""

from __future__ import annotations

import argparse
import functools
import textwrap

from .settings import describe

#: The widest line of the settings' help (a /cron-budget reply too: budget/report.WIDTH).
HELP_WIDTH = 72


def settings_help() -> str:
    """Each setting, its meaning and its default, the meaning broken to HELP_WIDTH under itself."""
    return "settings:\n" + "\n".join(
        textwrap.fill(
            f"{meaning} (default {default})",
            HELP_WIDTH,
            initial_indent=f"  {k:<13} ",
            subsequent_indent=" " * 16,
            break_long_words=False,
            break_on_hyphens=False,
        )
        for k, default, meaning in describe()
    )


def add_budget_arguments(parser: argparse.ArgumentParser, *, for_slash: bool = False) -> None:
    """Add `status` and `set KEY VALUE` to a parser (Hermes hands its CLI command one)."""
    parser.formatter_class = functools.partial(
        argparse.RawDescriptionHelpFormatter, width=HELP_WIDTH
    )
    parser.epilog = settings_help()
    sub = parser.add_subparsers(dest="budget_command", metavar="COMMAND")
    p = sub.add_parser(
        "status", help="the window, requests by class, each job's requests, held runs"
    )
    if not for_slash:
        p.add_argument("--json", action="store_true", help="machine-readable")
    p = sub.add_parser(
        "set",
        help="change one setting (validated)",
        epilog=settings_help(),
        formatter_class=functools.partial(argparse.RawDescriptionHelpFormatter, width=HELP_WIDTH),
    )
    p.add_argument("key", metavar="KEY")
    p.add_argument("value", metavar="VALUE")
    sub.add_parser("path", help="print where budget.json and the local ledger are")
