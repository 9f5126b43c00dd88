"""How a command of `hermes-bulk` and `/bulk` and each of its options are declared (grammar.py
holds the table of them), and what argparse is given for each.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: Which front ends offer a command or an option.
CLI, SLASH, BOTH = "cli", "slash", "both"


@dataclass(frozen=True)
class Wording:
    """Text that differs between the front ends; None where a front end shows none."""

    cli: str | None
    slash: str | None


Text = str | Wording | None


def said(text: Text, for_slash: bool) -> str | None:
    """The text one front end shows."""
    if isinstance(text, Wording):
        return text.slash if for_slash else text.cli
    return text


def offered(where: str, for_slash: bool) -> bool:
    return where == BOTH or where == (SLASH if for_slash else CLI)


class _NoDefault:
    def __repr__(self) -> str:
        return "NO_DEFAULT"


#: An option declared without a default: argparse's own (None; False for store_true).
NO_DEFAULT: Any = _NoDefault()


@dataclass(frozen=True)
class Option:
    """One option or positional argument of a command, with argparse's meaning for each field."""

    #: as typed, space-separated ("--rpm", "-w --workers"), or a positional's name ("job")
    flags: str
    help: Text = None
    metavar: str | None = None
    type: Callable[[str], Any] | None = None
    default: Any = NO_DEFAULT
    action: str | None = None
    nargs: str | None = None
    choices: tuple[str, ...] | None = None
    required: bool = False
    dest: str | None = None
    where: str = BOTH
    #: options that share this name exclude each other (-v, -q)
    exclusive: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.flags.split())

    @property
    def key(self) -> str:
        """The name of the parsed value: `dest`, else the first long flag's (--max-tokens is
        max_tokens), else the positional's name."""
        if self.dest:
            return self.dest
        names = self.names
        long = next((name for name in names if name.startswith("--")), names[0])
        return long.lstrip("-").replace("-", "_")

    def arguments(self, for_slash: bool) -> dict[str, Any]:
        """add_argument's keywords, only those declared (a store_true takes no type or metavar)."""
        declared = {
            "help": said(self.help, for_slash),
            "metavar": self.metavar,
            "type": self.type,
            "action": self.action,
            "nargs": self.nargs,
            "choices": self.choices,
            "dest": self.dest,
        }
        kwargs = {name: value for name, value in declared.items() if value is not None}
        if self.default is not NO_DEFAULT:
            kwargs["default"] = self.default
        if self.required:
            kwargs["required"] = True
        return kwargs


@dataclass(frozen=True)
class Command:
    name: str
    help: Text
    options: tuple[Option, ...] = ()
    where: str = BOTH
    description: Text = None
    epilog: Text = None
    #: a grammar of its own, added only when this command is typed or help lists every command
    #: (the budget's: its help lists the budget's settings, which loads them)
    grammar: Callable[[argparse.ArgumentParser], None] | None = None
