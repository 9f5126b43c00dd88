"""Bad input of every kind: one line on stderr, a non-zero exit, nothing lost or created."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest


@pytest.fixture
def existing_job(cli, tmp_path):
    """A job created before the bad input, which must come out unchanged."""
    src = tmp_path / "ok.txt"
    src.write_text("fine")
    job_id = cli.create("Do", src)
    return job_id, cli.json("status", job_id, "--json")


def assert_one_line_error(proc, code: int, *needles: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    for needle in needles:
        assert needle in lines[0], lines[0]


def assert_nothing_created(cli, home, existing_job) -> None:
    job_id, before = existing_job
    listed = cli.json("list", "--json")
    assert [j["job_id"] for j in listed] == [job_id]
    assert cli.json("status", job_id, "--json") == {**before, "live_workers": 0}
    with sqlite3.connect(home / "bulk.db") as db:
        assert db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 1, (
            "no half-created job is left"
        )
        assert db.execute("SELECT count(DISTINCT job_id) FROM items").fetchone()[0] == 1


def write(path: Path, data: str | bytes) -> Path:
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


@pytest.mark.parametrize(
    "name, make, needles",
    [
        ("malformed.csv", lambda p: write(p, 'a,b\n1,2\n3,"open\n'), ["malformed CSV at line 3"]),
        (
            "ragged.csv",
            lambda p: write(p, "a,b\n1,2\n1,2,3\n"),
            ["line 3", "3 fields", "header has 2"],
        ),
        ("latin1.csv", lambda p: write(p, b"a\ncaf\xe9\n"), ["line 2 is not UTF-8"]),
        ("bad.json", lambda p: write(p, '[{"a": 1},\n {"a": ]'), ["malformed JSON at line 2"]),
        ("object.json", lambda p: write(p, '{"a": 1}'), ["not an array"]),
        ("bad.jsonl", lambda p: write(p, '{"a": 1}\n{oops}\n'), ["line 2 is not valid JSON"]),
        ("binary.txt", lambda p: write(p, b"\x89PNG\r\n\x1a\n\x00\x00"), ["not UTF-8 text"]),
        (
            "huge.txt",
            lambda p: write(p, "x" * 5000),
            ["more than max_item_bytes", "HERMES_BULK_MAX_ITEM_BYTES"],
        ),
        ("empty.txt", lambda p: write(p, ""), ["empty"]),
        ("missing.txt", lambda p: p, ["no such file or directory"]),
        ("loop", lambda p: (p.symlink_to(p), p)[1], ["symbolic link loop"]),
        (
            "hollow",
            lambda p: (p.mkdir(), (p / ".only-hidden").write_text("x"), p)[2],
            ["no items to process", "hidden entry"],
        ),
    ],
)
def test_bad_sources(cli, home, tmp_path, existing_job, name, make, needles):
    path = make(tmp_path / name)
    proc = cli("create", "Do", "--over", str(path), check=False, HERMES_BULK_MAX_ITEM_BYTES="1000")
    assert_one_line_error(proc, 1, *needles)
    assert_nothing_created(cli, home, existing_job)


@pytest.mark.parametrize(
    "args, needles",
    [
        (
            ["create", "Do", "--over", "x", "--concurrency", "0"],
            ["--concurrency", "0 is out of range; use 1 to 1,024"],
        ),
        (
            ["create", "Do", "--over", "x", "--retries", "many"],
            ["--retries", "'many' is not a whole number"],
        ),
        (["create", "Do"], ["--over"]),
        (["create", "Do", "--over", "x", "--frobnicate"], ["Unrecognized arguments: --frobnicate"]),
        (["export", "abc", "--format", "xls"], ["--format", "invalid choice"]),
        (["status", "--events", "-3"], ["--events"]),
    ],
)
def test_bad_flags(cli, home, existing_job, args, needles):
    assert_one_line_error(cli(*args, check=False), 2, *needles)
    assert_nothing_created(cli, home, existing_job)


def test_concurrency_above_max_concurrency(cli, home, tmp_path, existing_job):
    proc = cli(
        "create", "Do", "--over", str(tmp_path / "ok.txt"), "--concurrency", "17", check=False
    )
    assert_one_line_error(proc, 2, "--concurrency 17 is more than max_concurrency (16)")
    assert_nothing_created(cli, home, existing_job)


@pytest.mark.parametrize(
    "variable, value, needles",
    [
        ("HERMES_BULK_MAX_CONCURRENCY", "lots", ["HERMES_BULK_MAX_CONCURRENCY", "valid integer"]),
        (
            "HERMES_BULK_MAX_RETRIES",
            "-1",
            ["HERMES_BULK_MAX_RETRIES", "greater than or equal to 0"],
        ),
        ("HERMES_BULK_BACKEND", "ftp://x", ["HERMES_BULK_BACKEND", "sqlite://"]),
        ("HERMES_BULK_BASE_URL", "localhost:8000", ["HERMES_BULK_BASE_URL", "http://"]),
        ("HERMES_BULK_LEASE_SECONDS", "0", ["HERMES_BULK_LEASE_SECONDS"]),
    ],
)
def test_bad_settings_name_the_setting(cli, home, existing_job, variable, value, needles):
    proc = cli("list", check=False, **{variable: value})
    assert_one_line_error(proc, 1, *needles)
    assert_nothing_created(cli, home, existing_job)


def test_a_bad_api_key_is_never_printed(cli, tmp_path):
    proc = cli(
        "list",
        check=False,
        HERMES_BULK_API_KEY="sk-supersecret-value",
        HERMES_BULK_MAX_CONCURRENCY="x",
    )
    assert "sk-supersecret" not in proc.stderr + proc.stdout


def test_unknown_jobs_and_wrong_states(cli, home, existing_job):
    job_id, _ = existing_job
    assert_one_line_error(cli("status", "ffffffffffff", check=False), 1, "No job 'ffffffffffff'")
    assert_one_line_error(cli("resume", job_id, check=False), 1, "is not paused")
    assert_one_line_error(cli("retry", job_id, check=False), 1, "has no failed items")
    cli("run", job_id, "--wait")
    assert_one_line_error(cli("run", job_id, check=False), 1, "has no pending items")
    assert cli.json("status", job_id[:6], "--json")["job_id"] == job_id, "a unique prefix is enough"


def test_a_model_must_be_configured(cli, tmp_path):
    src = tmp_path / "a.txt"
    src.write_text("x")
    env = cli.full_env()
    env.pop("HERMES_BULK_MODEL")
    proc = subprocess.run(
        [sys.executable, "-m", "hermes_bulk", "create", "Do", "--over", str(src)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert_one_line_error(proc, 1, "No model configured", "HERMES_BULK_MODEL")


def test_the_export_target_must_be_writable(cli, existing_job, tmp_path):
    job_id, _ = existing_job
    (tmp_path / "adir").mkdir()
    assert_one_line_error(
        cli("export", job_id, "--output", str(tmp_path / "adir"), check=False), 1, "is a directory"
    )


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root to drop to an unprivileged user (root reads every file)",
)
def test_an_unreadable_path_as_an_unprivileged_user(cli):
    """Root can read anything, so the CLI runs as nobody against a file nobody may read."""
    base = Path(tempfile.mkdtemp(prefix="hb-unreadable-"))
    try:
        base.chmod(0o755)
        secret = base / "secret.txt"
        secret.write_text("x")
        secret.chmod(0o000)
        inner = base / "dir"
        inner.mkdir()
        (inner / "locked.txt").write_text("y")
        (inner / "locked.txt").chmod(0o000)
        (inner / "open.txt").write_text("z")
        (inner / "open.txt").chmod(0o644)
        home = base / "home"
        home.mkdir()
        os.chown(home, 65534, 65534)
        env = cli.full_env(HERMES_BULK_HOME=str(home))
        run = [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            sys.executable,
            "-m",
            "hermes_bulk",
        ]
        proc = subprocess.run(
            [*run, "create", "Do", "--over", str(secret)], capture_output=True, text=True, env=env
        )
        assert_one_line_error(proc, 1, "permission denied")
        proc = subprocess.run(
            [*run, "create", "Do", "--over", str(inner), "--json"],
            capture_output=True,
            text=True,
            env=env,
        )
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["items"] == 1 and json.loads(proc.stdout)["skipped"] == 1
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_bug_before_the_settings_load_logs_under_hermes_bulk_home(monkeypatch, tmp_path, capsys):
    """errors.log went to the Hermes data folder when HERMES_BULK_HOME pointed elsewhere and the
    settings (which name the folder) were what failed: a bug planted there."""
    from hermes_bulk.frontends import cli as cli_module

    def broken(command):
        raise RuntimeError("planted")

    monkeypatch.setattr(cli_module, "load_settings_for", broken)
    monkeypatch.setenv("HERMES_BULK_HOME", str(tmp_path / "bulk"))
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "hermes"))
    assert cli_module.main(["list"]) == 1
    err = capsys.readouterr().err
    log = tmp_path / "bulk" / "logs" / "errors.log"
    assert f"the traceback is in {log}." in err, err
    assert "RuntimeError: planted" in log.read_text()
    assert not (tmp_path / "hermes").exists(), "nothing in the Hermes data folder"
    monkeypatch.delenv("HERMES_BULK_HOME")
    assert cli_module.main(["list"]) == 1  # the neighbour: the default under HERMES_HOME
    assert (tmp_path / "hermes" / "plugin-data" / "bulk" / "logs" / "errors.log").is_file()


def test_version_prints_the_installed_version(cli):
    import importlib.metadata

    proc = cli("--version")
    assert proc.stdout == f"hermes-bulk {importlib.metadata.version('hermes-bulk')}\n"
    assert proc.stderr == ""
