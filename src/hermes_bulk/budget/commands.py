"""`status` and `set`: what `hermes cron-budget`, `hermes-bulk budget` and `/cron-budget` do (their
grammar: grammar.py).

The handler returns (exit status, text) and prints nothing, so the Hermes CLI command, the
standalone CLI and the slash command (whose reply is the text) all say the same thing.
"""

from __future__ import annotations

import argparse
import json
import shlex

from ..errors import HermesBulkError, UsageError
from ..usage import Parser
from ..words import count
from .grammar import add_budget_arguments
from .report import as_dict, fitted, status_text
from .service import Budget
from .settings import BudgetSettings

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


def run_budget_command(args: argparse.Namespace, budget: Budget, *, prog: str) -> tuple[int, str]:
    """Run a parsed command; (exit status, text to show). Errors are one line."""
    command = getattr(args, "budget_command", None) or "status"
    try:
        if command == "set":
            before = budget.settings_in_force()[0]  # a broken budget.json is what `set` repairs
            settings = budget.settings_file.set(args.key, args.value)
            notes = _moved_window_note(budget, before, settings)
            if args.key == "ledger":
                notes += _reachability_note(budget, settings)
            # "key = value" stays one line, to be read and copied whole; the notes are broken
            return EXIT_OK, f"{args.key} = {settings.shown(args.key)}" + fitted(notes)
        if command == "path":
            return EXIT_OK, str(budget.directory)
        report = budget.report()
        if getattr(args, "json", False):
            return EXIT_OK, json.dumps(as_dict(report))
        return EXIT_OK, status_text(report)
    except HermesBulkError as exc:
        return EXIT_ERROR, fitted(f"{prog}: {exc}")


def _moved_window_note(budget: Budget, before: BudgetSettings, after: BudgetSettings) -> str:
    """Counts belong to a window; a new reset or zone starts a different one, so say what
    happens."""
    old, new = budget.window(before), budget.window(after)
    if old.start_s == new.start_s:
        return ""
    try:
        used = budget.ledger(before).counts(old).total
    except HermesBulkError:
        return ""
    if not used:
        return ""
    return (
        f"\nThe current window now starts at {new.start_local:%Y-%m-%d %H:%M %Z}: the "
        f"{count(used, 'request')} counted so far stay with the old window, and counting starts "
        "afresh. Lower daily_limit for today if the provider's own window did not reset."
    )


def _reachability_note(budget: Budget, settings: BudgetSettings) -> str:
    """A new ledger is saved even when it cannot be reached now; say so, since calls then go
    uncounted."""
    try:
        budget.ledger(settings)
    except HermesBulkError as exc:
        return (
            f"\nWarning: the ledger cannot be used now ({exc}). Until it can, calls go through "
            "uncounted and status warns."
        )
    return ""


def slash(raw_args: str, budget: Budget) -> str:
    """`/cron-budget [status | set KEY VALUE | path | help]`: the reply text."""
    parser = Parser(prog="/cron-budget", add_help=False)
    add_budget_arguments(parser, for_slash=True)
    try:
        words = shlex.split(raw_args or "")
    except ValueError as exc:
        return f"/cron-budget: cannot read the arguments ({exc}); close every quote."
    if words[:1] in (["help"], ["-h"], ["--help"]):
        return parser.format_help()
    try:
        args = parser.parse_args(words)
    except UsageError as exc:
        return fitted(f"/cron-budget: {exc} Usage: /cron-budget [status | set KEY VALUE | path]")
    except SystemExit:
        return parser.format_help()
    return run_budget_command(args, budget, prog="/cron-budget")[1]
