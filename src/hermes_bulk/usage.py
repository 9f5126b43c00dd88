"""An argparse parser that raises UsageError instead of exiting, for every grammar here.

A parse error becomes UsageError (the CLI prints it and exits 2; a slash command answers with it),
so the same grammar serves a terminal and a chat.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

from .errors import UsageError


class Parser(argparse.ArgumentParser):
    #: command name -> its parser, so a caller can show one command's help without printing it
    subcommands: dict[str, argparse.ArgumentParser]
    #: command name -> its one-line help, in the order the commands were added
    command_help: dict[str, str]

    def error(self, message: str) -> NoReturn:
        raise UsageError(message[:1].upper() + message[1:] + ".", self.format_usage())

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        # --help already printed; the CLI exits, /bulk answers with the help text instead.
        raise SystemExit(status)
