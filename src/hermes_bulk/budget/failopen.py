"""The fail-open note: when accounting failed in this window, so `status` can say so.

A budget must never be the reason an agent stops: when the ledger cannot answer in time
(SQLite locked, Redis down), the call goes through uncounted and is noted here, in
`failopen.json` beside budget.json (every profile and process sees it). `status` shows the
note while its window lasts; the next window starts clean. Writing the note never raises.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..files import private_dir, write_private

FAILOPEN_FILE = "failopen.json"


@dataclass(frozen=True, slots=True)
class FailOpenNote:
    window_start_s: int
    calls: int  # calls that went through uncounted in the window
    first_at: float
    last_at: float
    reason: str  # our own one-line message, never provider text


class FailOpenNotes:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / FAILOPEN_FILE

    def note(self, window_start_s: int, reason: str) -> None:
        """Count one call that went through uncounted in the window starting at window_start_s."""
        with contextlib.suppress(OSError):
            private_dir(self.directory)
            fd = os.open(self.directory / (FAILOPEN_FILE + ".lock"), os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                now = time.time()
                current = self.read(window_start_s)
                calls, first = (current.calls, current.first_at) if current else (0, now)
                write_private(
                    self.path,
                    json.dumps(
                        {
                            "window_start_s": window_start_s,
                            "calls": calls + 1,
                            "first_at": first,
                            "last_at": now,
                            "reason": reason[:300],
                        }
                    )
                    + "\n",
                )
            finally:
                os.close(fd)

    def read_since(self, window_start_s: int) -> FailOpenNote | None:
        """The note, if a call failed open since the window began, whichever window it was noted
        under (with a broken budget.json a failure is noted under the default settings' window)."""
        note = self._load()
        return (
            note
            if note and (note.window_start_s == window_start_s or note.last_at >= window_start_s)
            else None
        )

    def read(self, window_start_s: int) -> FailOpenNote | None:
        """The note for this window, or None (no failure in it, or the note is of an older
        window)."""
        note = self._load()
        return note if note and note.window_start_s == window_start_s else None

    def _load(self) -> FailOpenNote | None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            return FailOpenNote(
                int(data["window_start_s"]),
                int(data["calls"]),
                float(data["first_at"]),
                float(data["last_at"]),
                str(data["reason"]),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None
