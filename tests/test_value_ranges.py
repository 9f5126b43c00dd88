"""Every number has a range, and every value outside it is one line, never an internal error.

`--max-tokens 10**30` once crashed create and resume, `worker -w 1000000000` grew memory and
started nothing, `--rpm 10**30` was stored, and Redis URLs with a broken host, a bad
ssl_cert_reqs or a database that is not a number ended in a traceback or were taken silently.
Each bad value goes through a real `hermes-bulk` process.
"""

from __future__ import annotations

import pytest

from hermes_bulk.config.fields import check_batch_window

from .test_cli_errors import assert_nothing_created, existing_job  # noqa: F401 - a fixture

BIG = str(10**30)


def assert_one_clean_line(proc, code: int, *needles: str) -> None:
    text = proc.stderr + proc.stdout
    assert proc.returncode == code, (proc.returncode, text)
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in text and "internal error" not in text, text
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


#: (arguments after the job id or instruction is filled in, words the one line must have)
BAD_FLAGS = [
    (
        ["create", "Do", "--over", "{src}", "--max-tokens", BIG],
        ["--max-tokens", "out of range", "1 to 1,000,000,000,000"],
    ),
    (["create", "Do", "--over", "{src}", "--max-tokens", "0"], ["--max-tokens", "out of range"]),
    (
        ["create", "Do", "--over", "{src}", "--concurrency", str(10**9)],
        ["--concurrency", "1 to 1,024"],
    ),
    (
        ["create", "Do", "--over", "{src}", "--concurrency", "17"],
        ["--concurrency 17 is more than max_concurrency (16)"],
    ),
    (["create", "Do", "--over", "{src}", "--retries", BIG], ["--retries", "0 to 20"]),
    (["create", "Do", "--over", "{src}", "--retries", "21"], ["--retries", "0 to 20"]),
    (["create", "Do", "--over", "{src}", "--rpm", BIG], ["--rpm", "1 to 1,000,000"]),
    (["create", "Do", "--over", "{src}", "--tpm", BIG], ["--tpm", "1 to 1,000,000,000"]),
    (["resume", "{job}", "--max-tokens", BIG], ["--max-tokens", "out of range"]),
    (["run", "{job}", "--wait", "-w", str(10**9)], ["--workers", "1 to 1,024"]),
    (["status", "{job}", "--events", BIG], ["--events", "0 to 10,000"]),
    (["events", "{job}", "--limit", "0"], ["--limit", "1 to 10,000"]),
    (["list", "--limit", BIG], ["--limit", "1 to 10,000"]),
    (["worker", "--metrics-port", "99999"], ["--metrics-port", "1 to 65,535"]),
    (["worker", "--metrics-port", "0"], ["--metrics-port", "1 to 65,535"]),
    (["worker", "-w", "1000000000"], ["--workers", "1 to 1,024"]),
    (["worker", "-d", "nan"], ["--delay", "out of range"]),
    (["worker", "-m", "inf"], ["--max-delay", "out of range"]),
    (["worker", "-b", "0.5"], ["--backoff", "from 1 up to 10"]),
    (["worker", "-t", "1e30"], ["--shutdown-timeout", "out of range"]),
]


@pytest.mark.parametrize(
    "args, needles", BAD_FLAGS, ids=lambda v: " ".join(v)[:60] if isinstance(v, list) else None
)
def test_a_number_out_of_range_is_one_line_and_exit_2(
    cli,
    home,
    tmp_path,
    existing_job,
    args,
    needles,
):
    job_id, _ = existing_job
    argv = [a.format(src=tmp_path / "ok.txt", job=job_id) for a in args]
    assert_one_clean_line(cli(*argv, check=False, timeout=30), 2, *needles)
    assert_nothing_created(cli, home, existing_job)


BAD_SETTINGS = [
    ("HERMES_BULK_BACKEND", "redis://[::1", ["HERMES_BULK_BACKEND", "not a valid URL"]),
    (
        "HERMES_BULK_BACKEND",
        "redis://127.0.0.1:99999/0",
        ["HERMES_BULK_BACKEND", "port", "1 to 65535"],
    ),
    (
        "HERMES_BULK_BACKEND",
        "redis://127.0.0.1:{port}/abc",
        ["HERMES_BULK_BACKEND", "'abc' is not a number"],
    ),
    (
        "HERMES_BULK_BACKEND",
        "redis://127.0.0.1:{port}/0?ssl_cert_reqs=bogus",
        ["ssl_cert_reqs needs TLS"],
    ),
    (
        "HERMES_BULK_BACKEND",
        "rediss://127.0.0.1:{port}/0?ssl_cert_reqs=bogus",
        ["ssl_cert_reqs='bogus'", "required"],
    ),
    (
        "HERMES_BULK_BACKEND",
        "redis://127.0.0.1:{port}/0?bogus_option=1",
        ["not one Redis connections take"],
    ),
    ("HERMES_BULK_BACKEND", "redis://:", ["HERMES_BULK_BACKEND", "port", "1 to 65535"]),
    ("HERMES_BULK_BACKEND", "redis://", ["HERMES_BULK_BACKEND", "names no Redis host"]),
    ("HERMES_BULK_BACKEND", "redis://:pw@/0", ["HERMES_BULK_BACKEND", "names no Redis host"]),
    ("HERMES_BULK_BACKEND", "redis://127.0.0.1:/0", ["HERMES_BULK_BACKEND", "port", "1 to 65535"]),
    (
        "HERMES_BULK_BATCH_WINDOW",
        "99999999d",
        ["HERMES_BULK_BATCH_WINDOW", "whole hours from 1h to 168h"],
    ),
    ("HERMES_BULK_BATCH_WINDOW", "90m", ["HERMES_BULK_BATCH_WINDOW", "whole hours"]),
    ("HERMES_BULK_MAX_ITEM_BYTES", BIG, ["HERMES_BULK_MAX_ITEM_BYTES", "less than or equal to"]),
    ("HERMES_BULK_RPM", BIG, ["HERMES_BULK_RPM", "less than or equal to 1000000"]),
    ("HERMES_BULK_TPM", BIG, ["HERMES_BULK_TPM", "less than or equal to"]),
    (
        "HERMES_BULK_MAX_OUTPUT_TOKENS",
        BIG,
        ["HERMES_BULK_MAX_OUTPUT_TOKENS", "less than or equal to"],
    ),
    (
        "HERMES_BULK_OUTPUT_TOKENS_ESTIMATE",
        BIG,
        ["HERMES_BULK_OUTPUT_TOKENS_ESTIMATE", "less than or equal to"],
    ),
    (
        "HERMES_BULK_MAX_CONCURRENCY",
        str(10**9),
        ["HERMES_BULK_MAX_CONCURRENCY", "less than or equal to 1024"],
    ),
    ("HERMES_BULK_LEASE_SECONDS", "nan", ["HERMES_BULK_LEASE_SECONDS"]),
]


@pytest.mark.parametrize(
    "variable, value, needles", BAD_SETTINGS, ids=lambda v: v[:50] if isinstance(v, str) else None
)
def test_a_setting_out_of_range_is_one_config_line(cli, redis_server, variable, value, needles):
    value = value.format(port=redis_server.port) if "{port}" in value else value
    for argv in (["list"], ["worker", "--burst"]):
        assert_one_clean_line(cli(*argv, check=False, timeout=30, **{variable: value}), 1, *needles)


def test_a_redis_database_past_the_servers_count_says_so(cli, redis_server):
    proc = cli("list", check=False, HERMES_BULK_BACKEND=f"redis://127.0.0.1:{redis_server.port}/99")
    assert_one_clean_line(proc, 1, "database 99 is out of range")
    assert "Cannot reach" not in proc.stderr


@pytest.mark.parametrize(
    "given, sent", [("24h", "24h"), ("2d", "48h"), ("3600", "1h"), (" 7d ", "168h")]
)
def test_the_batch_window_is_sent_in_the_hours_providers_read(given, sent):
    assert check_batch_window(given) == sent
