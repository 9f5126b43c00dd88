"""Where logs go, and the redaction every log line passes through.

Provider error text is logged (job records keep only the error type and HTTP status), but it
can echo credentials, so secrets are masked (`redact.py`: the configured ones by value, others
by shape) before any handler writes a line. Commands log to `<data dir>/logs/hermes-bulk.log`,
never to the terminal they print results on, and only once there is a line to write (a read
writes nothing); `hermes-bulk worker` logs to stderr (or -l FILE), as a consumer does. Every log
file is owner-only, also one that existed before.

Inside Hermes the plugin logs through Hermes' handlers, which Hermes adds only once a session
starts (before that, Python's last-resort handler writes to stderr): `guard_host_logging` masks
our records as they are made, whichever handler ends up writing them, and puts the filter on
the handlers the host has.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import sys
import traceback
from pathlib import Path

from ..errors import InputError
from ..files import check_write_target, os_reason, private_dir
from ..redact import redact
from .terminal import terminal_width, wrap

#: Loggers whose records are ours (huey logs our task failures, with their tracebacks).
OWN_LOGGERS = ("hermes_bulk", "huey")


def redact_record(record: logging.LogRecord) -> None:
    """Mask secrets in a record's message, exception and stack text, in place (idempotent)."""
    if getattr(record, "_hermes_bulk_redacted", False):
        return
    try:
        message = record.getMessage()
    except Exception:  # a bad format string: the handler reports it, with the raw parts masked
        record.msg, record.args = (
            redact(str(record.msg)),
            tuple(redact(str(a)) for a in record.args or ()),
        )
        return
    cleaned = redact(message)
    if cleaned != message:
        record.msg, record.args = cleaned, None
    if record.exc_info and not record.exc_text:
        record.exc_text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
    if record.exc_text:
        record.exc_text = redact(record.exc_text)
    if record.stack_info:
        record.stack_info = redact(record.stack_info)
    record._hermes_bulk_redacted = True


class RedactingFilter(logging.Filter):
    """Masks secrets in the final message (arguments included), the traceback and the stack."""

    def filter(self, record: logging.LogRecord) -> bool:
        redact_record(record)
        return True


class OutageFilter(logging.Filter):
    """A backend outage in one line every few seconds, not a traceback per thread per poll.

    Huey logs every failed dequeue with its traceback; while Redis restarts that is dozens of
    tracebacks a second that hide the one line that matters.
    """

    EVERY_S = 5.0

    def __init__(self) -> None:
        super().__init__()
        self._last = 0.0

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None or not _is_outage(exc):
            return True
        if record.created - self._last < self.EVERY_S:
            return False
        self._last = record.created
        record.msg, record.args, record.exc_info, record.exc_text = (
            "%s: the backend is unreachable (%s); retrying",
            (record.getMessage(), type(exc).__name__),
            None,
            None,
        )
        return True


def _is_outage(exc: BaseException) -> bool:
    outage = {"ConnectionError", "TimeoutError", "BackendUnavailable", "OSError"}
    while exc is not None:  # by class name: this module must not import redis
        if outage & {cls.__name__ for cls in type(exc).__mro__}:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


FORMAT = "[%(asctime)s] %(levelname)s %(name)s: %(message)s"


def _install(handler: logging.Handler, level: int) -> None:
    # Hermes' code in a worker serving Hermes jobs logs through the root logger
    _filter_host_handlers()
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.addFilter(OutageFilter())
    handler.addFilter(RedactingFilter())
    root = logging.getLogger("hermes_bulk")
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False
    huey_log = logging.getLogger("huey")
    for old in list(huey_log.handlers):
        huey_log.removeHandler(old)
    huey_log.addHandler(handler)
    huey_log.setLevel(max(level, logging.WARNING) if level > logging.DEBUG else level)
    huey_log.propagate = False


def open_private_log(path: Path | str, *, flag: str = "-l") -> Path:
    """Create a log file owner-only, or make an existing one so; a character device (/dev/null,
    a terminal) is written as it is. A link, FIFO, directory or missing folder is one line
    (InputError): the checks are export's, and O_NOFOLLOW | O_NONBLOCK keep what is swapped in
    after them from being written through or waited on."""
    path = Path(path)
    check_write_target(path, what="the log", flag=flag, devices=True)
    flags = (
        os.O_CREAT
        | os.O_APPEND
        | os.O_WRONLY
        | os.O_NOFOLLOW
        | os.O_NONBLOCK
        | getattr(os, "O_CLOEXEC", 0)
    )
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        raise InputError(
            f"Cannot write the log to {path}: {os_reason(exc)}; choose another {flag}."
        ) from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISREG(mode):
            os.fchmod(fd, 0o600)
        elif not stat.S_ISCHR(mode):
            raise InputError(
                f"Cannot write the log to {path}: not a regular file; choose another {flag}."
            )
    finally:
        os.close(fd)
    return path


class _PrivateLogFile(logging.FileHandler):
    """A log file opened, and made owner-only, when its first record comes: a command that logs
    nothing (every read) leaves nothing behind in the data directory (DESIGN.md invariant 13)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, encoding="utf-8", delay=True)

    def _open(self):
        private_dir(Path(self.baseFilename).parent)
        open_private_log(self.baseFilename)
        return super()._open()

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        """A log line that cannot be written (a full disk) is said once in one line, not as
        logging's traceback per record over the command's own output."""
        if not self._said_unwritable:
            self._said_unwritable = True
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(
                    f"hermes-bulk: cannot write the log {self.baseFilename}; "
                    "later lines are lost until it can be written.\n"
                )

    _said_unwritable = False


def log_to_file(home: Path, level: int = logging.INFO) -> Path:
    """Commands: a private log file in the data directory, made when there is something to log."""
    path = home / "logs" / "hermes-bulk.log"
    _install(_PrivateLogFile(path), level)
    return path


def log_to_stream(level: int = logging.INFO, logfile: str | None = None) -> None:
    """The worker: stderr (or a file), like huey_consumer."""
    handler = (
        logging.FileHandler(open_private_log(logfile), encoding="utf-8")
        if logfile
        else logging.StreamHandler()
    )
    _install(handler, level)
    if not logfile and (
        width := terminal_width(sys.stderr)
    ):  # a person watching: lines fit the terminal
        handler.setFormatter(_Wrapped(FORMAT, width))


class _Wrapped(logging.Formatter):
    """Log lines broken at spaces to the terminal's width (no word, so no number, is cut)."""

    def __init__(self, fmt: str, width: int) -> None:
        super().__init__(fmt)
        self.width = width

    def format(self, record: logging.LogRecord) -> str:
        return wrap(super().format(record), self.width)


def append_private(path: Path, text: str) -> None:
    """Add text, masked, to an owner-only file (the traceback log)."""
    private_dir(path.parent)
    with open(open_private_log(path), "a", encoding="utf-8") as f:
        f.write(redact(text))


def guard_host_logging() -> None:
    """Inside a host process (Hermes): mask our records at birth, and filter the host's handlers.

    The record factory covers handlers the host adds later (Hermes adds its files when a
    session starts); the handler filters cover the host's own records on the handlers it has
    now and on the last-resort stderr handler. Idempotent.
    """
    factory = logging.getLogRecordFactory()
    if not getattr(factory, "_hermes_bulk_redacts", False):

        def redacting_factory(*args, **kwargs):
            record = factory(*args, **kwargs)
            if record.name.startswith(OWN_LOGGERS):
                redact_record(record)
            return record

        redacting_factory._hermes_bulk_redacts = True  # type: ignore[attr-defined]
        logging.setLogRecordFactory(redacting_factory)
    _filter_host_handlers()


def _filter_host_handlers() -> None:
    """The filter on the root logger's handlers and on the last-resort (stderr) handler."""
    for handler in [*logging.getLogger().handlers, logging.lastResort]:
        if handler is not None and not any(isinstance(f, RedactingFilter) for f in handler.filters):
            with contextlib.suppress(Exception):
                handler.addFilter(RedactingFilter())
