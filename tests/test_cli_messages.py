"""Small truths at the terminal, each through a real `hermes-bulk` process:
counts of one, the JSONL and CSV error texts, binary files, reads that make no database, and the
owner-only mode of an export the user asked for."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import kill_worker_holding_an_item
from tests.test_cli_errors import assert_one_line_error

PNG = (
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"
    b"\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89"
)


def create(cli, over: Path, *flags: str, **env: str):
    return cli("create", "Summarize", "--over", str(over), *flags, check=False, **env)


# Counts of one ---------------------------------------------------------------------------------


def test_one_entry_left_out_is_one_entry(cli, tmp_path):
    hollow = tmp_path / "hollow"
    hollow.mkdir()
    (hollow / ".only-hidden").write_text("x")
    proc = create(cli, hollow)
    assert_one_line_error(proc, 1, "no items to process (1 entry left out: hidden entry)")

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("text")
    (src / "logo.png").write_bytes(PNG)
    created = create(cli, src)
    assert created.returncode == 0, created.stderr
    assert "with 1 item." in created.stdout
    assert "Left out 1 entry (binary file (contains NUL bytes): 1);" in created.stdout


def test_one_rate_limit_is_one_time_in_a_row(cli, tmp_path, fake_provider):
    one = tmp_path / "one.txt"
    one.write_text("the only item")
    job = cli.create("Summarize", one, "--retries", "0")
    fake_provider.configure(script=["429"])
    assert cli("run", job, "--wait", check=False).returncode == 1
    (row,) = [
        json.loads(line)
        for line in cli("export", job, "--format", "jsonl", "--output", "-").stdout.splitlines()
    ]
    assert row["error"] == (
        "RateLimitError (HTTP 429): rate limited (HTTP 429) 1 time in a row; run retry later "
        "or lower --concurrency"
    )


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_one_interrupted_item_is_one_item(cli, tmp_path, fake_provider, request, backend):
    extra = (
        {"HERMES_BULK_BACKEND": request.getfixturevalue("redis_url")} if backend == "redis" else {}
    )
    one = tmp_path / "one.txt"
    one.write_text("the only item")
    job = json.loads(cli("create", "Summarize", "--over", str(one), "--json", **extra).stdout)[
        "job_id"
    ]
    cli("run", job, **extra)
    kill_worker_holding_an_item(cli, fake_provider, **extra)
    cli("run", job, **extra)  # returns the dead worker's item to the queue
    events = cli("events", job, **extra).stdout
    assert "recovered: 1 interrupted item returned to the queue" in events, events


# Source errors ---------------------------------------------------------------------------------


def test_a_jsonl_error_says_at_once(cli, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n{"text": "unterminated\n')
    proc = create(cli, bad)
    assert_one_line_error(
        proc, 1, f"{bad}: line 2 is not valid JSON (Unterminated string starting at column 10)."
    )
    assert "at at" not in proc.stderr


def test_a_binary_file_gets_binary_advice_and_other_text_gets_iconv(cli, tmp_path):
    image = tmp_path / "logo.png"
    image.write_bytes(PNG)
    proc = create(cli, image)
    assert_one_line_error(
        proc, 1, f"{image}: a binary file (it contains NUL bytes), not UTF-8 text; give a text file"
    )
    assert "iconv" not in proc.stderr
    as_jsonl = tmp_path / "logo.jsonl"  # the same bytes under a record reader's name
    as_jsonl.write_bytes(PNG)
    assert_one_line_error(create(cli, as_jsonl), 1, "a binary file (it contains NUL bytes)")

    latin = tmp_path / "notes.txt"
    latin.write_bytes("café crème".encode("latin-1"))
    proc = create(cli, latin)
    assert_one_line_error(
        proc, 1, f"{latin}: not UTF-8 text; convert it (for example with iconv -t UTF-8)."
    )
    utf16 = tmp_path / "wide.txt"  # NUL bytes, but text: a byte order mark says so
    utf16.write_bytes("wide text".encode("utf-16"))
    assert_one_line_error(
        create(cli, utf16), 1, "not UTF-8 text; convert it (for example with iconv"
    )


def test_an_unterminated_csv_quote_is_reported_where_it_opened(cli, tmp_path):
    rows = ["name,comment", "a,fine", 'b,"never closed', *(f"r{i},more text" for i in range(7))]
    assert len(rows) == 10
    bad = tmp_path / "open.csv"
    bad.write_text("\n".join(rows) + "\n")
    proc = create(cli, bad)
    assert_one_line_error(
        proc,
        1,
        f"{bad}: malformed CSV at line 3: a quoted field opened on that line is never closed",
    )
    assert "line 10" not in proc.stderr

    # A quoted field that spans lines and closes, then one that opens on line 5 and does not.
    spans = tmp_path / "spans.csv"
    spans.write_text('name,comment\na,"one\ntwo"\nb,"say ""hi""\nc,x\n')
    assert_one_line_error(create(cli, spans), 1, "malformed CSV at line 4:")


# Reads make no database ------------------------------------------------------------------------


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


def test_reads_on_a_fresh_machine_say_no_jobs_and_leave_nothing(cli, home, tmp_path):
    assert not home.exists()
    for args in (["list"], ["status"]):
        proc = cli(*args)
        assert (
            proc.stdout.strip()
            == 'No jobs yet. Create one with: hermes-bulk create "<instruction>" --over PATH'
        )
    assert cli.json("list", "--json") == []
    assert cli("workers").stdout.strip() == "No live workers. Start one with: hermes-bulk worker"
    for args in (["budget"], ["path"]):
        cli(*args)
    for args in (
        ["status", "abc"],
        ["events", "abc"],
        ["export", "abc"],
        ["run", "abc"],
        ["delete", "abc"],
    ):
        assert_one_line_error(cli(*args, check=False), 1, "There are no jobs yet. Create one with:")
    assert not home.exists(), tree(home)
    assert tree(Path(cli.env["HOME"])) == []


def test_reads_on_a_mistyped_sqlite_path_say_there_is_no_database_and_make_none(
    cli, home, tmp_path
):
    typo = tmp_path / "typo" / "dir" / "bulk.db"
    backend = f"sqlite:///{typo}"
    for args in (
        ["list"],
        ["status"],
        ["status", "abc"],
        ["events", "abc"],
        ["export", "abc"],
        ["export", "abc", "--output", str(tmp_path / "x.md")],
        ["list", "--json"],
    ):
        proc = cli(*args, check=False, HERMES_BULK_BACKEND=backend)
        assert_one_line_error(proc, 1)
        assert proc.stderr.strip() == (
            f"hermes-bulk: There is no hermes-bulk database at {typo}; check "
            "HERMES_BULK_BACKEND, or create a job there first: hermes-bulk create "
            '"<instruction>" --over PATH'
        ), args
        assert proc.stdout == ""
    assert not (tmp_path / "typo").exists()
    assert not home.exists() and not (tmp_path / "x.md").exists()

    one = tmp_path / "one.txt"
    one.write_text("item")
    job = json.loads(
        cli("create", "Do", "--over", str(one), "--json", HERMES_BULK_BACKEND=backend).stdout
    )["job_id"]
    assert typo.is_file() and stat.S_IMODE(typo.stat().st_mode) == 0o600, (
        "create still makes it, owner-only"
    )
    assert cli.json("status", job, "--json", HERMES_BULK_BACKEND=backend)["total"] == 1


# Export modes ----------------------------------------------------------------------------------


def run_with_umask(cli, *args: str, umask: int = 0o022) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "hermes_bulk", *args],
        capture_output=True,
        text=True,
        env=cli.full_env(),
        umask=umask,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_export_is_owner_only_whatever_the_umask_and_a_replaced_one_keeps_its_mode(
    cli, home, tmp_path
):
    one = tmp_path / "one.txt"
    one.write_text("item")
    job = cli.create("Do", one)
    cli("run", job, "--wait")
    out = tmp_path / "out"
    out.mkdir()

    asked = out / "results.csv"
    assert run_with_umask(
        cli, "export", job, "--format", "csv", "--output", str(asked)
    ).stdout.strip() == str(asked)
    assert mode(asked) == 0o600, "answers and contents: owner-only, as every file hermes-bulk makes"
    assert (
        mode(
            Path(
                run_with_umask(
                    cli, "export", job, "--output", str(out / "r.md"), umask=0
                ).stdout.strip()
            )
        )
        == 0o600
    )

    asked.chmod(
        0o644
    )  # a file the user widened to share keeps its mode when the export replaces it
    run_with_umask(cli, "export", job, "--format", "csv", "--output", str(asked))
    assert mode(asked) == 0o644

    default = Path(run_with_umask(cli, "export", job, "--format", "jsonl").stdout.strip())
    assert default.parent == home / "jobs" / job and mode(default) == 0o600
    inside = home / "jobs" / job / "mine.md"  # --output under the data directory: still owner-only
    run_with_umask(cli, "export", job, "--output", str(inside))
    assert mode(inside) == 0o600
    wide = [
        (str(p), oct(mode(p)))
        for p in [home, *home.rglob("*")]
        if not p.is_symlink() and mode(p) & 0o077
    ]
    assert wide == [], "everything under the data directory is owner-only"


def test_a_command_log_is_made_owner_only_with_its_first_line(cli, home, tmp_path, fake_provider):
    item = tmp_path / "item.txt"
    item.write_text("FAIL-401 this item")
    fake_provider.configure(
        item_faults={"FAIL-401": "400"}
    )  # a 401 would pause the job (runtime/breaker.py)
    job = cli.create("Do", item)
    assert not (home / "logs").exists(), "nothing logged yet: no log"
    proc = subprocess.run(
        [sys.executable, "-m", "hermes_bulk", "run", job, "--wait"],
        capture_output=True,
        text=True,
        env=cli.full_env(),
        umask=0o022,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    log = home / "logs" / "hermes-bulk.log"
    assert "HTTP 400" in log.read_text(), "the provider's answer is logged"
    assert mode(log) == 0o600 and mode(log.parent) == 0o700
