"""Every command's output fits an 80-column terminal without losing a number: each command runs
under a real pseudo-terminal 80 columns wide (as a person's), and every line it draws is checked
for its width and for the figures it must carry. Also: `status` names reused answers and the
tokens they saved (text and --json)."""

from __future__ import annotations

import fcntl
import os
import re
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

WIDTH = 80
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
#: Where a terminal starts drawing afresh: a new line, a carriage return, a cursor move up.
REDRAW = re.compile(r"\r\n|\n|\r|\x1b\[\d*[AF]")


def on_terminal(cli, *args: str, timeout: float = 60) -> tuple[int, list[str]]:
    """`hermes-bulk args` with stdout and stderr on a pty 80 columns wide: (exit status, the
    lines as a terminal shows them, escape sequences removed)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, WIDTH, 0, 0))
    env = cli.full_env(TERM="xterm-256color")
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "hermes_bulk", *args],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        env=env,
        close_fds=True,
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # the other side closed: the command ended
            break
        if not data:
            break
        chunks.append(data)
        if time.monotonic() > deadline:
            proc.kill()
            break
    os.close(master)
    rc = proc.wait(timeout)
    text = b"".join(chunks).decode("utf-8", "replace")
    lines = [ANSI.sub("", line) for line in REDRAW.split(text)]
    return rc, lines


def fits(lines: list[str], what: str) -> None:
    # A single word longer than a line (a path, a URL) stays whole, to be copied.
    wide = [line for line in lines if len(line) > WIDTH and " " in line.strip()]
    assert not wide, f"{what}: {len(wide)} lines over {WIDTH} columns:\n" + "\n".join(wide)


def _folder(root: Path, n: int) -> Path:
    root.mkdir()
    for i in range(n):
        (root / f"report-{i:03}.txt").write_text(f"report number {i}\n")
    return root


def test_every_command_fits_80_columns_and_keeps_its_numbers(cli, tmp_path, fake_provider):
    fake_provider.configure(item_faults={"report number 3\n": "400"})
    folder = _folder(tmp_path / "reports", 12)
    instruction = "Summarize this quarterly report in three bullet points for the board " * 2

    cli.env["HERMES_BULK_PRICE"] = "3,15"  # the cost lines, with their price, are the widest
    rc, lines = on_terminal(cli, "create", instruction, "--over", str(folder), "--dry-run")
    fits(lines, "create --dry-run")
    shown = " ".join(" ".join(lines).split())
    assert re.search(r"At most [\d,]+ tokens \(each item once: its input bytes", shown), shown
    assert re.search(r"Estimated cost: about \$[\d.]+, at most \$[\d.]+ at \$3", shown), shown
    rc, lines = on_terminal(cli, "create", instruction, "--over", str(folder), "--retries", "0")
    fits(lines, "create")
    job = re.search(r"Created job (\w+)", "\n".join(lines))[1]

    rc, lines = on_terminal(cli, "run", job, "--wait", timeout=120)
    fits(lines, "run --wait")
    shown = "\n".join(lines)
    # the total, then each time before its own word (the elapsed time stood before "left")
    assert re.search(r"\b12/12\s+(-|\d):[-\d]{2}:[-\d]{2} left\s+\d:\d\d:\d\d elapsed", shown), (
        shown
    )
    assert re.search(r"completed with errors: 1 failed, 0 running, [\d,]+ tokens", shown), shown

    for args in (
        ["status", job],
        ["status", job, "--failed"],
        ["status", job, "--events", "20"],
        ["list"],
        ["events", job],
        ["show", job, "report-000.txt"],
        ["workers"],
        ["path"],
        ["retry", job],
        ["pause", job],
        ["resume", job],
        ["export", job, "--output", str(tmp_path / "out.md")],
        ["wait", job, "--timeout", "1"],
        ["worker", "--burst"],
        ["budget", "status"],
        ["stauts", job],
        ["--help"],
        *[[c, "--help"] for c in ("create", "run", "status", "export", "worker", "budget")],
    ):
        rc, lines = on_terminal(cli, *args)
        fits(lines, " ".join(args))

    rc, lines = on_terminal(cli, "list")
    listed = "\n".join(lines)
    # the state whole, over lines of its cell; the instruction, not the state, is cut
    assert re.search(r"completed(\s.*\n.*)?\swith(\s.*\n.*)?\serrors", listed), listed
    assert listed.count("…") == 1 and re.search(r"│ Summarize\S* *…? *│", listed), listed
    # done/total, failed, cost, and the instruction (it was left out at 80 columns)
    assert re.search(rf"{job} .* 11/12 .* 1 .* \$[\d.]+ .* Summarize", listed), listed

    rc, lines = on_terminal(cli, "status", job)
    status = "\n".join(lines)
    assert re.search(r"Items: \d+/12 completed, \d+ failed", status), status
    rc, lines = on_terminal(cli, "budget", "status")
    assert re.search(r"daily_limit=\d+, chat_reserve=\d+", " ".join(" ".join(lines).split())), lines
    rc, lines = on_terminal(cli, "delete", job, "--yes")
    fits(lines, "delete")
