"""docs/cli.md is every command's --help, so the reference cannot drift from the parser.

Regenerate it with: .venv/bin/python -m tests.test_cli_docs
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from hermes_bulk.frontends.parser import build_parser

DOC = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
HEADER = """# hermes-bulk command reference

Generated from the parser (`python -m tests.test_cli_docs`); a test fails when it drifts.
Narrative docs: [README.md](../README.md), [operations.md](operations.md).
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
        return "\n".join(parts)
    finally:
        if old is None:
            os.environ.pop("COLUMNS")
        else:
            os.environ["COLUMNS"] = old


def test_the_cli_reference_matches_the_parser():
    assert DOC.read_text() == render(), "docs/cli.md is stale: run .venv/bin/python -m tests.test_cli_docs"


if __name__ == "__main__":
    DOC.write_text(render())
    sys.stdout.write(f"wrote {DOC}\n")
