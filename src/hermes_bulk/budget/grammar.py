"""The budget's command grammar: `status`, `set KEY VALUE`, `path` (for `hermes-bulk budget`,
`hermes cron-budget` and `/cron-budget`). Apart from commands.py so that building the
`hermes-bulk` parser loads none of the budget's service."""

from __future__ import annotations

import argparse

from .settings import describe


def settings_help() -> str:
    return "settings:\n" + "\n".join(
        f"  {k:<13} {meaning} (default {default})" for k, default, meaning in describe()
    )


def add_budget_arguments(parser: argparse.ArgumentParser, *, for_slash: bool = False) -> None:
    """Add `status` and `set KEY VALUE` to a parser (Hermes hands its CLI command one)."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
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
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("key", metavar="KEY")
    p.add_argument("value", metavar="VALUE")
    sub.add_parser("path", help="print where budget.json and the local ledger are")
