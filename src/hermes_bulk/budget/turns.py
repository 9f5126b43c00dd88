"""Writer turns across processes: a lock file waited on in the kernel, with a timeout.

SQLite's own busy handler sleeps between retries (1 ms growing to 100 ms), so when many
processes admit at once a writer can lose every retry to the others and wait past any timeout,
and admissions that could each take 50 µs take tens of milliseconds. A blocking `flock` is woken
the moment the lock is free instead. `flock` itself has no timeout, so one thread per process
does the blocking and callers wait on it with one: writers in a process queue in order, and a
caller that gives up leaves its turn to be skipped. A process that dies releases its lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import queue
import threading
from collections.abc import Iterator
from pathlib import Path


class TurnTimeout(Exception):
    """The lock was not free within the timeout."""


class _Ticket:
    __slots__ = ("granted", "done", "lock", "abandoned")

    def __init__(self) -> None:
        self.granted = threading.Event()
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.abandoned = False


class FileTurns:
    """Exclusive turns on one lock file, shared by every thread and process that opens it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._setup_lock = threading.Lock()
        self._pid = -1
        self._fd = -1
        self._requests: queue.SimpleQueue[_Ticket] = queue.SimpleQueue()

    @contextlib.contextmanager
    def turn(self, timeout_s: float) -> Iterator[None]:
        ticket = _Ticket()
        self._ensure_server().put(ticket)
        if not ticket.granted.wait(timeout_s):
            with ticket.lock:
                if not ticket.granted.is_set():
                    ticket.abandoned = True
                    raise TurnTimeout(f"{self.path} stayed locked for {timeout_s:g} s")
        try:
            yield
        finally:
            ticket.done.set()

    def _ensure_server(self) -> queue.SimpleQueue[_Ticket]:
        with self._setup_lock:
            if self._pid != os.getpid():
                # After a fork the inherited descriptor shares the parent's lock: open our own.
                self._fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600)
                self._requests = queue.SimpleQueue()
                self._pid = os.getpid()
                threading.Thread(
                    target=self._serve,
                    args=(self._fd, self._requests),
                    name="cron-budget-turns",
                    daemon=True,
                ).start()
            return self._requests

    @staticmethod
    def _serve(fd: int, requests: queue.SimpleQueue[_Ticket]) -> None:
        while True:
            ticket = requests.get()
            if ticket.abandoned:
                continue
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                with ticket.lock:
                    if ticket.abandoned:
                        continue
                    ticket.granted.set()
                ticket.done.wait()
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
