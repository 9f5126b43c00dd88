"""The replies both front ends give take their options as keyword parameters named as the grammar's
flags (frontends/parser.py options_for picks them from a parse), create passing the rest on to the
job request (jobs/request.py): a flag /bulk accepts is never dropped on the way, and a handler
never asks for an option neither grammar has."""

from __future__ import annotations

import inspect

import pytest

from hermes_bulk.frontends import replies
from hermes_bulk.frontends.parser import build_parser, options_for
from hermes_bulk.jobs.request import JobRequest

#: The least each command parses with: its required positionals and flags.
MINIMAL = {
    "create": ["create", "Summarize", "--over", "items"],
    "show": ["show", "J", "I"],
    "status": ["status"],
    "list": ["list"],
    "doctor": ["doctor"],
}


def parsed(command: str, *, for_slash: bool) -> dict:
    argv = MINIMAL.get(command, [command, "J"])
    return vars(
        build_parser("/bulk" if for_slash else "hermes-bulk", for_slash=for_slash).parse_args(argv)
    )


def options(handler) -> dict[str, inspect.Parameter]:
    return {
        name: p
        for name, p in inspect.signature(handler).parameters.items()
        if p.kind is p.KEYWORD_ONLY
    }


def reaching(handler) -> set[str]:
    """What reaches a handler from a parse: its keyword parameters, and where it passes the rest
    on (`**options`: create) the job request's fields, named as the grammar's flags."""
    params = inspect.signature(handler).parameters.values()
    passes_on = any(p.kind is p.VAR_KEYWORD for p in params)
    return set(options(handler)) | (set(JobRequest.option_names()) if passes_on else set())


@pytest.mark.parametrize("command", sorted(replies.HANDLERS))
def test_every_option_a_handler_takes_is_a_flag_and_every_slash_flag_reaches_it(command):
    handler = replies.HANDLERS[command]
    slash, cli = parsed(command, for_slash=True), parsed(command, for_slash=False)
    for name, param in options(handler).items():
        assert name in slash or name in cli, f"{command}: no grammar has {name}"
        if param.default is param.empty:
            assert name in slash and name in cli, (
                f"{command}: {name} is required but not always parsed"
            )
    # Everything /bulk parses for the command reaches the handler, so no typed flag is ignored.
    assert sorted(set(slash) - {"command"} - reaching(handler)) == []


def test_options_for_passes_what_the_handler_takes_and_nothing_else():
    args = build_parser().parse_args(["run", "abc", "--rpm", "60", "--wait", "--no-check"])
    assert options_for(replies.run, args) == {
        "job": "abc",
        "concurrency": None,
        "rpm": 60,
        "tpm": None,
        "wait": True,
        "sample": None,
    }
