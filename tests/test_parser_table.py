"""The parser of each front end is its grammar table and nothing else: the commands it offers in
the table's order, each with the options the table offers it, each parsed under the option's key
(the name replies and a job request take it by)."""

from __future__ import annotations

import argparse

import pytest

from hermes_bulk.frontends.grammar import COMMANDS, GRAMMAR
from hermes_bulk.frontends.options import BOTH, CLI, SLASH, Option, Wording, offered
from hermes_bulk.frontends.parser import build_parser


def parsed_keys(sub: argparse.ArgumentParser) -> list[str]:
    return [
        a.dest
        for a in sub._actions
        if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
    ]


@pytest.mark.parametrize("for_slash", [False, True], ids=["cli", "slash"])
def test_each_front_end_offers_the_tables_commands_and_options_under_their_keys(for_slash):
    parser = build_parser("/bulk" if for_slash else "hermes-bulk", for_slash=for_slash)
    commands = [c for c in GRAMMAR if offered(c.where, for_slash)]
    assert list(parser.subcommands) == [c.name for c in commands]
    for command in commands:
        keys = [o.key for o in command.options if offered(o.where, for_slash)]
        assert parsed_keys(parser.subcommands[command.name]) == keys, command.name
        assert len(set(keys)) == len(keys), f"{command.name}: two options parse to one name"


def test_every_command_word_of_either_front_end_is_a_command_and_no_other():
    # A first word outside COMMANDS is an instruction of create (parser.normalise).
    words = set(build_parser().subcommands) | set(build_parser("/bulk", for_slash=True).subcommands)
    assert sorted(COMMANDS) == sorted(words)
    assert all(c.where in (CLI, SLASH, BOTH) for c in GRAMMAR)


def test_an_option_is_declared_once_and_worded_per_front_end_where_it_differs():
    output = Option(
        "--output", metavar="PATH", help=Wording(cli="a file; - for stdout", slash="a file")
    )
    assert output.arguments(for_slash=False) == {"help": "a file; - for stdout", "metavar": "PATH"}
    assert output.arguments(for_slash=True) == {"help": "a file", "metavar": "PATH"}
    # Only what is declared reaches argparse: a store_true takes no type, and a declared None
    # default (a flag that may be left to a setting) is kept.
    assert Option("--burst", action="store_true").arguments(False) == {"action": "store_true"}
    assert Option("--x", action="store_true", default=None).arguments(False)["default"] is None
    assert (Option("-w --workers").key, Option("-o", dest="option").key) == ("workers", "option")
