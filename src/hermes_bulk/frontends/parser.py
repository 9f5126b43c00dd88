"""The command grammar, shared by `hermes-bulk …` and `/bulk …` (one parser serves both), made
from the table of commands and options in grammar.py.

A first word that is not a command means `create`, so `/bulk "Summarize" --over ./reports`
and `hermes-bulk create "Summarize" --over ./reports` are the same request. Parse errors
raise UsageError (never exit), so the slash command can answer with the message.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import inspect
import re
import shlex
from collections.abc import Callable
from typing import Any

from ..errors import UsageError
from ..usage import Parser
from .grammar import COMMANDS, EPILOG, GRAMMAR, PROG_DESCRIPTION
from .options import Command, offered, said
from .terminal import CHAT_WIDTH

#: How help is laid out in a chat (/bulk): lines of CHAT_WIDTH.
CHAT_FORMATTER = functools.partial(argparse.HelpFormatter, width=CHAT_WIDTH)


def build_parser(
    prog: str = "hermes-bulk", *, for_slash: bool = False, command: str | None = None
) -> Parser:
    """The parser of every command one front end has; given `command` (the first word typed), a
    command's own grammar (the budget's) is added only when it is that command."""
    parser = Parser(
        prog=prog,
        description=PROG_DESCRIPTION,
        epilog=None if for_slash else EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if not for_slash:  # a chat has no use for it
        from importlib.metadata import version  # the installed distribution's, as pip says it

        parser.add_argument(
            "--version", action="version", version=f"hermes-bulk {version('hermes-bulk')}"
        )
    # In a chat the help has the chat's width, not that of the terminal the gateway started in.
    parser_class = (
        functools.partial(Parser, formatter_class=CHAT_FORMATTER) if for_slash else Parser
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=parser_class)
    parser.subcommands = sub.choices
    parser.command_help = {}
    for entry in GRAMMAR:
        if offered(entry.where, for_slash):
            help_text = said(entry.help, for_slash)
            parser.command_help[entry.name] = help_text
            p = sub.add_parser(
                entry.name,
                help=help_text,
                description=said(entry.description, for_slash),
                epilog=said(entry.epilog, for_slash),
            )
            add_options(p, entry, for_slash)
            if entry.grammar is not None and command in (None, entry.name):
                entry.grammar(p)
    return parser


def add_options(parser: argparse.ArgumentParser, entry: Command, for_slash: bool) -> None:
    """A command's options, in the order declared, as one front end offers them."""
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for option in entry.options:
        if not offered(option.where, for_slash):
            continue
        target: Any = parser
        if option.exclusive:
            if option.exclusive not in groups:
                groups[option.exclusive] = parser.add_mutually_exclusive_group()
            target = groups[option.exclusive]
        target.add_argument(*option.names, **option.arguments(for_slash))


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
