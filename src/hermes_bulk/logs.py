"""Where logs go, and the redaction every log line passes through.

Provider error text is logged (job records keep only the error type and HTTP status), but it
can echo credentials, so secret-looking tokens are masked before any handler writes them.
Commands log to `<data dir>/logs/hermes-bulk.log`, never to the terminal they print results
on; `hermes-bulk worker` logs to stderr (or -l FILE), as a consumer does.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from .files import private_dir

_SECRET = re.compile(
    r"(?i)(\b(?:sk|rk|pk|key|token|ghp|gho|xox[abp])[-_][A-Za-z0-9_\-]{6,}"
    r"|bearer\s+[A-Za-z0-9._\-]{8,}"
    r"|(?:api[_-]?key|password|secret|token)[\"']?\s*[:=]\s*[\"']?[^\s\"',}]{4,})"
)


def redact(text: str) -> str:
    return _SECRET.sub(lambda m: m.group(0)[:3] + "***", text)


class RedactingFilter(logging.Filter):
    """Masks secret-looking tokens in the final message (arguments included)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
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
            "%s: the backend is unreachable (%s); retrying", (record.getMessage(), type(exc).__name__), None, None)
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


def log_to_file(home: Path, level: int = logging.INFO) -> Path:
    """Commands: a private log file in the data directory."""
    path = home / "logs" / "hermes-bulk.log"
    private_dir(path.parent)
    os.close(os.open(path, os.O_CREAT | os.O_APPEND | os.O_WRONLY, 0o600))
    _install(logging.FileHandler(path, encoding="utf-8"), level)
    return path


def log_to_stream(level: int = logging.INFO, logfile: str | None = None) -> None:
    """The worker: stderr (or a file), like huey_consumer."""
    _install(logging.FileHandler(logfile, encoding="utf-8") if logfile else logging.StreamHandler(), level)
