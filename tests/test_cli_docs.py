"""docs/cli.md is every command's --help and `/bulk help`, so the reference cannot drift from
the parser; `/bulk help` is made from the slash grammar, and names every command and flag it has.

Regenerate it with: .venv/bin/python -m tests.test_cli_docs
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from hermes_bulk.frontends.parser import build_parser

DOC = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
HEADER = """# hermes-bulk command reference

Generated from the parser (`python -m tests.test_cli_docs`); a test fails when it drifts.
How the commands behave together: [commands](commands.md); the fleet: [operations](operations.md).
"""


def render() -> str:
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps help to the terminal width
    try:
        parser = build_parser()
        parts = [HEADER, "## hermes-bulk\n", "```\n" + parser.format_help().rstrip() + "\n```\n"]
        subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        for name, sub in subparsers.choices.items():
            parts += [f"## hermes-bulk {name}\n", "```\n" + sub.format_help().rstrip() + "\n```\n"]
        parts += [
            "## /bulk (in Hermes)\n",
            "`/bulk help`; `/bulk <command> --help` gives one command's.\n",
            "```\n" + slash_help() + "\n```\n",
        ]
        return "\n".join(parts)
    finally:
        if old is None:
            os.environ.pop("COLUMNS")
        else:
            os.environ["COLUMNS"] = old


def slash_help() -> str:
    from hermes_bulk.plugin.bulk import HELP

    return HELP


def test_the_bulk_help_names_every_command_and_flag_of_the_slash_grammar_and_no_other():
    help_text, parser = slash_help(), build_parser("/bulk", for_slash=True)
    flags: set[str] = set()
    for name, sub in parser.subcommands.items():
        assert f"/bulk {name} " in help_text or f"/bulk {name}\n" in help_text, name
        flags |= {
            opt for action in sub._actions for opt in action.option_strings if opt.startswith("--")
        }
    flags.discard("--help")
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", help_text)) - {"--help"}
    assert (sorted(flags - named), sorted(named - flags)) == ([], [])


def test_the_cli_reference_matches_the_parser():
    assert DOC.read_text() == render(), (
        "docs/cli.md is stale: run .venv/bin/python -m tests.test_cli_docs"
    )


if __name__ == "__main__":
    DOC.write_text(render())
    sys.stdout.write(f"wrote {DOC}\n")
