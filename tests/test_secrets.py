"""Secrets stay out of everything hermes-bulk logs, stores and shows (DESIGN invariant 12).

A provider that echoes the key it was sent (in any shape, or none) in an error body, and an
endpoint URL with a password or an `api-key=` query: real `hermes-bulk` processes run the job
against the fake provider, then every byte hermes-bulk left behind is searched for the secret:
the log files, the terminal, the store (an SQL dump of every table; every Redis key and value),
results.jsonl and the other exports.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hermes_bulk import redact
from hermes_bulk.frontends import logs

KEYS = {
    "openai": "sk-proj-Xb7Qm2Lk9Vt4Rw8Zp3Nc6Hy1Jd5Fg0",
    "groq": "gsk_8Hq2mZr5TtW9xLb3Vn7Kc4Pd6Yf1Js0Ga2Re5Uo8Ih3Wk",
    "google": "AIzaSyD4-x9Kq7LmZp2Vt8Rw3Nc6Hy1Jd5Fg0Qe",
    "xai": "xai-Lk9Vt4Rw8Zp3Nc6Hy1Jd5Fg0Xb7Qm2Qe4Ws",
    "huggingface": "hf_Qm2Lk9Vt4Rw8Zp3Nc6Hy1Jd5Fg0Xb7Ab",
    "hex40": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b",
    "words": "correct-horse-battery-staple",
}


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _items(tmp_path: Path) -> Path:
    src = tmp_path / "items.jsonl"
    src.write_text('{"x": "fine"}\n{"x": "LEAK-401"}\n{"x": "LEAK-400"}\n{"x": "also fine"}\n')
    return src


def _everything_under(root: Path) -> str:
    """Every file's bytes (decoded leniently) and an SQL dump of every SQLite database."""
    text = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        text.append(path.read_bytes().decode("utf-8", "replace"))
        if path.suffix == ".db":
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
                text.extend(db.iterdump())
    return "\n".join(text)


def _redis_everything(url: str) -> str:
    import redis

    r = redis.Redis.from_url(url.split("?", 1)[0])
    read = {
        "string": r.get,
        "hash": r.hgetall,
        "list": lambda k: r.lrange(k, 0, -1),
        "set": r.smembers,
        "zset": lambda k: r.zrange(k, 0, -1, withscores=True),
        "stream": r.xrange,
    }
    out = []
    for key in r.scan_iter(count=1000):
        kind = r.type(key).decode()
        out.append(f"{key!r} {kind} {read[kind](key)!r}")
    r.close()
    return "\n".join(out)


def _worker_burst(cli, log: Path, **env: str) -> str:
    worker = subprocess.run(
        [sys.executable, "-m", "hermes_bulk", "worker", "-l", str(log), "--burst", "-w", "2"],
        env=cli.full_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert worker.returncode == 0, worker.stderr
    return worker.stdout + worker.stderr


ALL_READS = (
    ("status",),
    ("list",),
    ("events", "--limit", "1000"),
    ("export", "--format", "csv"),
    ("export", "--format", "md"),
)


def _run_a_leaky_job(
    cli, tmp_path, fake_provider, key: str, *, runner: str, reads=(), **extra_env: str
):
    """A job whose failing items' error bodies quote the key; returns (job id, what the terminal
    got)."""
    # 422, not 401: a refused key pauses the whole job (runtime/breaker.py); here items fail one by
    # one.
    fake_provider.configure(
        item_faults={"LEAK-401": "422", "LEAK-400": "400"},
        echo_credentials=True,
        error_echo=f"your key {key} is not valid (as sent: {_b64(key)}, {_b64('apikey:' + key)})",
    )
    env = {"HERMES_BULK_API_KEY": key, **extra_env}
    job_id = json.loads(
        cli("create", "Do", "--over", str(_items(tmp_path)), "--json", **env).stdout
    )["job_id"]
    if runner == "run --wait":
        proc = cli("run", job_id, "--wait", check=False, **env)
        terminal = proc.stdout + proc.stderr
    else:
        terminal = cli("run", job_id, **env).stdout + _worker_burst(
            cli, tmp_path / "worker.log", **env
        )
    for command, *flags in (*reads, ("export", "--format", "jsonl")):
        terminal += cli(command, *([] if command == "list" else [job_id]), *flags, **env).stdout
    status = cli("status", job_id, "--json", **env).stdout
    assert (json.loads(status)["completed"], json.loads(status)["failed"]) == (2, 2), status
    return job_id, terminal + status


RUNS = [(shape, ("worker -l FILE", "run --wait")[i % 2]) for i, shape in enumerate(KEYS)] + [
    ("words", "run --wait")
]


@pytest.mark.parametrize("shape, runner", RUNS)
def test_a_key_the_provider_echoes_is_nowhere_hermes_bulk_writes(
    cli, tmp_path, home, fake_provider, shape, runner
):
    """Each shape once (one runner or the other); the arbitrary one with both, and every read
    command."""
    key = KEYS[shape]
    reads = ALL_READS if shape == "words" else ()
    _, terminal = _run_a_leaky_job(cli, tmp_path, fake_provider, key, runner=runner, reads=reads)
    log_file = (
        tmp_path / "worker.log" if runner == "worker -l FILE" else home / "logs" / "hermes-bulk.log"
    )
    logged = log_file.read_text()
    assert "HTTP 422" in logged and "is not valid" in logged, (
        "the provider's text is logged (masked)"
    )
    assert "your key *** is not valid" in logged, "masked by value, not only by shape"
    everything = terminal + logged + _everything_under(home)
    assert key not in everything
    assert _b64(key) not in everything and _b64("apikey:" + key) not in everything
    assert (home / "jobs").is_dir() and list((home / "jobs").rglob("results.jsonl")), (
        "the exports were searched"
    )


def test_on_redis_the_key_and_the_redis_password_are_in_no_key_value_or_log(
    cli, tmp_path, home, fake_provider, redis_server
):
    from .conftest import RedisServer

    (tmp_path / "redis-guarded").mkdir()
    guarded = RedisServer(tmp_path / "redis-guarded", password="redis-pass-4c8e1b").start()
    try:
        url = guarded.url + "?prefix=secrets"
        key = KEYS["words"]
        _, terminal = _run_a_leaky_job(
            cli,
            tmp_path,
            fake_provider,
            key,
            runner="worker -l FILE",
            reads=ALL_READS,
            HERMES_BULK_BACKEND=url,
        )
        logged = (tmp_path / "worker.log").read_text()
        assert "redis://:***@" in logged, "the worker names its backend, masked"
        stored = _redis_everything(url)
        assert "LEAK-401" in stored, "the store was read"
        everything = terminal + logged + _everything_under(home) + stored
        assert key not in everything and "redis-pass-4c8e1b" not in everything
    finally:
        guarded.kill()


@pytest.mark.parametrize("precreated", [False, True])
def test_log_files_are_owner_only_even_when_they_existed(
    cli, tmp_path, home, fake_provider, precreated
):
    worker_log, command_log = tmp_path / "worker.log", home / "logs" / "hermes-bulk.log"
    if precreated:
        command_log.parent.mkdir(parents=True)
        for path in (worker_log, command_log):
            path.write_text("earlier lines\n")
            path.chmod(0o644)
    src = tmp_path / "items.jsonl"
    src.write_text('"PERMANENT-400"\n')
    fake_provider.configure(item_faults={"PERMANENT-400": "400"})
    cli("run", cli.create("Do", src), "--wait", check=False)  # the provider's answer is logged
    assert "HTTP 400" in command_log.read_text()
    _worker_burst(cli, worker_log)
    for path in (worker_log, command_log):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert ("earlier lines" in path.read_text()) == precreated, (
            "a log is appended to, not replaced"
        )


def test_worker_logging_to_a_device_leaves_the_device_alone(tmp_path):
    before = stat.S_IMODE(os.stat("/dev/null").st_mode)
    logs.open_private_log("/dev/null")
    assert stat.S_IMODE(os.stat("/dev/null").st_mode) == before


def test_credentials_in_the_endpoint_url_are_not_stored_or_shown(
    cli, tmp_path, home, fake_provider
):
    host = fake_provider.base_url.split("://", 1)[1]
    base_url = f"http://bulkuser:url-pw-71d3e9@{host}?api-key=QKEY-5a0f2c9e&api-version=2024-06-01"
    src = tmp_path / "items.jsonl"
    src.write_text('{"x": "one"}\n{"x": "two"}\n')
    env = {"HERMES_BULK_BASE_URL": base_url}
    job_id = json.loads(cli("create", "Do", "--over", str(src), "--json", **env).stdout)["job_id"]
    proc = cli("run", job_id, "--wait", **env)
    status = cli.json("status", job_id, "--json", **env)
    assert (status["state"], status["completed"]) == ("completed", 2), status
    terminal = proc.stdout + proc.stderr + json.dumps(status)
    for command, *flags in (*ALL_READS, ("export", "--format", "jsonl")):
        terminal += cli(command, *([] if command == "list" else [job_id]), *flags, **env).stdout
    rows = [
        json.loads(line)
        for line in (home / "jobs").rglob("results.jsonl").__next__().read_text().splitlines()
    ]
    assert {r["provider"] for r in rows} == {
        f"http://bulkuser:***@{host}?api-key=***&api-version=2024-06-01"
    }, "the endpoint is kept, its credentials are not"
    everything = terminal + _everything_under(home)
    assert "url-pw-71d3e9" not in everything and "QKEY-5a0f2c9e" not in everything


# The masking itself -------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", list(KEYS))
def test_a_registered_key_is_masked_whole_whatever_its_shape(shape):
    redact.register_secret(KEYS[shape])
    assert redact.redact(f"error: {KEYS[shape]} invalid") == "error: *** invalid"


@pytest.mark.parametrize(
    "text, secret",
    [
        ("Authorization: Bearer abc.def-ghi_jkl", "abc.def-ghi_jkl"),
        ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA=="),
        ("key gsk_" + "a1B2" * 10, "a1B2" * 10),
        ("key AIza" + "Sy" * 18, "Sy" * 18),
        ("key xai-" + "Zz9" * 10, "Zz9" * 10),
        ("key hf_" + "Qq8" * 10, "Qq8" * 10),
        ("digest " + "0123456789abcdef" * 3, "0123456789abcdef" * 3),
        ("https://x/v1?access_token=opaque-77&b=1", "opaque-77"),
        ("https://x/v1?key=AbC123xyz789&b=1", "AbC123xyz789"),
        ('{"api_key": "unshaped-4242"}', "unshaped-4242"),
    ],
)
def test_secrets_nobody_registered_are_masked_by_shape(text, secret):
    assert secret not in redact.redact(text)


def test_model_names_are_not_masked():
    for name in ("xai-grok-2", "hf_hub", "gsk_", "fake-model", "gpt-4o-mini"):
        assert redact.redact(f"model {name}") == f"model {name}"


@pytest.mark.parametrize(
    "url, shown",
    [
        ("http://u:pw-1@h/v1", "http://u:***@h/v1"),
        ("https://TOKEN-1@h/v1", "https://***@h/v1"),
        ("http://h/v1?API-Key=x1&api-version=3", "http://h/v1?API-Key=***&api-version=3"),
        (
            "http://h/v1?key=a&token=b&sig=c&signature=d&password=e&secret=f&code=g&access_token=h&api_key=i",
            "http://h/v1?key=***&token=***&sig=***&signature=***&password=***&secret=***&code=***&access_token=***"
            "&api_key=***",
        ),
        (  # a key under a name of its own: any name that says key, token, secret, sig, auth
            "http://h/v1?subscription-key=a&x-goog-api-key=b&sv_sig=c&authz=d&api-version=3",
            "http://h/v1?subscription-key=***&x-goog-api-key=***&sv_sig=***&authz=***"
            "&api-version=3",
        ),
        ("redis://:pw@cache:6379/0", "redis://:***@cache:6379/0"),
        ("redis://cache:6379/0?prefix=p", "redis://cache:6379/0?prefix=p"),
        ("/var/lib/ledger.db", "/var/lib/ledger.db"),
        # A URL with nothing to hide is shown as it was written: sqlite:/// keeps its slashes.
        ("sqlite:////var/lib/bulk.db", "sqlite:////var/lib/bulk.db"),
        ("sqlite:///data/bulk.db", "sqlite:///data/bulk.db"),
        ("sqlite:///data/bulk.db?token=t1", "sqlite:///data/bulk.db?token=***"),
    ],
)
def test_public_url_masks_userinfo_and_secret_query_values(url, shown):
    assert redact.public_url(url) == shown


def test_a_backend_or_ledger_url_is_shown_without_its_password_even_when_it_cannot_be_parsed():
    url = "rediss://default:pa%40ss@h:6380/1?password=other"
    assert redact.public_url(url) == "rediss://default:***@h:6380/1?password=***"
    # A port that is not a number: where the password ends cannot be told, so only the scheme shows.
    assert redact.public_url("redis://:hunter2-unregistered@h:63x79/0") == "redis://…"
    assert redact.public_url("/var/lib/ledger.db") == "/var/lib/ledger.db"


def test_records_of_our_loggers_are_masked_whichever_handler_writes_them(tmp_path):
    """Inside Hermes: a handler added after the plugin registered (Hermes' session files) and the
    last-resort stderr handler (before any session) get masked records."""
    redact.register_secret("plain-value-secret-91")
    factory, last_resort_filters = logging.getLogRecordFactory(), list(logging.lastResort.filters)
    logs.guard_host_logging()
    late = logging.FileHandler(tmp_path / "host.log")  # the host's, added later, no filter of ours
    logger = logging.getLogger("hermes_bulk.plugin.test_secrets")
    logger.addHandler(late)
    try:
        try:
            raise RuntimeError("provider said: plain-value-secret-91 is wrong")
        except RuntimeError:
            logger.exception("call failed: %s", "plain-value-secret-91")
        assert any(isinstance(f, logs.RedactingFilter) for f in logging.lastResort.filters)
    finally:
        logger.removeHandler(late)
        late.close()
        logging.setLogRecordFactory(factory)
        logging.lastResort.filters[:] = last_resort_filters
    written = (tmp_path / "host.log").read_text()
    assert "call failed: ***" in written and "provider said: *** is wrong" in written
    assert "plain-value-secret-91" not in written


@pytest.mark.parametrize(
    "name, value, shown",
    [
        (
            "HERMES_BULK_BASE_URL",
            "ftp://u:topsecret1@h/v1?key=k-topsecret2",
            "ftp://u:***@h/v1?key=***",
        ),
        ("HERMES_BULK_BACKEND", "mysql://u:topsecret1@h/db", "mysql://u:***@h/db"),
    ],
)
def test_a_rejected_url_is_quoted_without_its_credentials(env, monkeypatch, name, value, shown):
    from hermes_bulk.config.settings import load_settings
    from hermes_bulk.errors import ConfigError

    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert f"(got {shown!r})" in str(caught.value) and "topsecret" not in str(caught.value)


def test_words_that_merely_follow_key_are_not_masked():
    for text in ("rate-limit key: p:0a1b", "sort key=name", "HTTP 401 from http://h/v1"):
        assert redact.redact(text) == text


def test_an_endpoint_stored_with_credentials_before_is_exported_without_them(cli, tmp_path, home):
    """A bulk.db written by an earlier version holds the endpoint as configured."""
    src = tmp_path / "items.jsonl"
    src.write_text('{"x": "one"}\n')
    job_id = cli.create("Do", src)
    cli("run", job_id, "--wait")
    with sqlite3.connect(home / "bulk.db") as db:
        assert (
            db.execute(
                "UPDATE items SET provider = 'http://u:old-pw-3e1@h/v1?token=old-tok-9'"
            ).rowcount
            == 1
        )
    path = Path(cli("export", job_id, "--format", "jsonl").stdout.strip())
    assert json.loads(path.read_text())["provider"] == "http://u:***@h/v1?token=***"


def test_other_code_logging_through_the_root_logger_in_a_worker_is_masked(env, tmp_path):
    """`hermes-bulk worker` serving Hermes jobs runs Hermes' code, which logs to the root logger:
    with no handler there, Python's last-resort handler writes it to stderr."""
    script = (
        "from hermes_bulk.config import settings as config; from hermes_bulk.frontends import "
        "logs; import logging; config.load_settings(); logs.log_to_stream(logfile=None); "
        "logging.getLogger('agent.auxiliary_client').warning('provider said %s', "
        "'my-plain-key-0042')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HERMES_BULK_API_KEY": "my-plain-key-0042"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "provider said ***" in proc.stderr and "my-plain-key-0042" not in proc.stderr
