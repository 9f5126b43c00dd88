"""A reader that went away (`hermes-bulk list | head`): stop quietly, as `ls | head` does.

Python ignores SIGPIPE, so a write to a closed pipe raises BrokenPipeError, and the final flush
at exit would raise it again ("Exception ignored …"). Pointing stdout at /dev/null ends both.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys

#: 128 + SIGPIPE: what a shell reports for `ls` in `ls | head` when the pipe closed first.
EXIT_BROKEN_PIPE = 141


def is_broken_pipe(exc: BaseException) -> bool:
    return isinstance(exc, BrokenPipeError) or (
        isinstance(exc, OSError) and exc.errno == errno.EPIPE
    )


def stdout_gone() -> int:
    """Silence stdout for the rest of the process; the exit status to end with."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return EXIT_BROKEN_PIPE
