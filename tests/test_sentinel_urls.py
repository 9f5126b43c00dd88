"""redis+sentinel:// URLs, WAIT options, and which Redis errors a failover waits out: pure rules,
no server (the processes are in tests/fleet/test_sentinel_failover.py)."""

from __future__ import annotations

import pytest
import redis
from redis.sentinel import MasterNotFoundError

from hermes_bulk.config.backend_url import parse_backend_url, parse_ledger_url
from hermes_bulk.errors import ConfigError
from hermes_bulk.redact import public_url
from hermes_bulk.store.redis.failover import (
    Demoted,
    TooFewReplicas,
    did_not_run,
    is_read,
    never_sent,
    read_rides,
    reason,
)


@pytest.mark.parametrize(
    "url, sentinels, service, database",
    [
        (
            "redis+sentinel://s1,s2,s3/service/0",
            (("s1", 26379), ("s2", 26379), ("s3", 26379)),
            "service",
            "0",
        ),
        ("redis+sentinel://h:1/svc", (("h", 1),), "svc", ""),
        ("redis+sentinel://h:65535/svc/15", (("h", 65535),), "svc", "15"),
        ("redis+sentinel://[::1]:26380,[::1]/svc/2", (("::1", 26380), ("::1", 26379)), "svc", "2"),
        ("rediss+sentinel://:pw@a:1,b:2/my%20svc/1", (("a", 1), ("b", 2)), "my svc", "1"),
    ],
)
def test_a_sentinel_url_names_its_sentinels_service_and_database(url, sentinels, service, database):
    parsed = parse_backend_url(url)
    assert (parsed.sentinels, parsed.service, parsed.database) == (sentinels, service, database)
    host, port = sentinels[0]
    assert (parsed.host, parsed.port) == (host, port)
    assert parsed.client_url.startswith("rediss://" if url.startswith("rediss") else "redis://")
    assert parsed.client_url.endswith(f"/{database}")


def test_the_primarys_password_goes_to_redis_and_the_sentinels_own_stays_apart():
    parsed = parse_backend_url(
        "redis+sentinel://:primary-pw@a:1,b:2/svc/0"
        "?sentinel_password=sentinel-pw&sentinel_username=watcher&prefix=p&socket_keepalive=true"
    )
    assert parsed.client_url == "redis://:primary-pw@a:1/0?socket_keepalive=true"
    assert (parsed.sentinel_username, parsed.sentinel_password) == ("watcher", "sentinel-pw")
    assert parsed.prefix == "p"
    assert "sentinel-pw" not in repr(parsed) and "primary-pw" not in parsed.where
    assert parsed.where == "svc (Sentinels a:1,b:2)"


def test_a_plain_url_is_not_a_sentinel_one():
    parsed = parse_backend_url("redis://:pw@h:6380/1")
    assert (parsed.sentinels, parsed.service, parsed.where) == ((), "", "h:6380")


def test_the_ledger_takes_a_sentinel_url_too():
    parsed = parse_ledger_url("redis+sentinel://a,b/svc?prefix=budget")
    assert parsed.service == "svc" and parsed.prefix == "budget"


@pytest.mark.parametrize(
    "url, needle",
    [
        ("redis+sentinel://s1", "name the Sentinel service"),
        ("redis+sentinel://s1/", "name the Sentinel service"),
        ("redis+sentinel://s1/a/0/extra", "name the Sentinel service"),
        ("redis+sentinel://s1/svc/x", "the database 'x' is not a number"),
        ("redis+sentinel://s1/svc?db=x", "the database 'x' is not a number"),
        ("redis+sentinel://s1:0/svc", "the Sentinel port must be"),
        ("redis+sentinel://s1:65536/svc", "the Sentinel port must be"),
        ("redis+sentinel://s1:p/svc", "the Sentinel port must be"),
        ("redis+sentinel://s1,,s2/svc", "a Sentinel host is missing"),
        ("redis+sentinel://:26379/svc", "a Sentinel host is missing"),
        ("redis+sentinel://s1/svc?ssl_ca_certs=/ca", "needs TLS; use rediss+sentinel://"),
        ("redis://h/0?sentinel_password=x", "need a redis+sentinel:// URL"),
        ("redis+sentinel://s1/svc?prefix=a*b", "prefix='a*b'"),
    ],
)
def test_a_broken_sentinel_url_is_one_line_saying_what_to_fix(url, needle):
    with pytest.raises(ConfigError) as info:
        parse_backend_url(url)
    assert needle in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "query, replicas, timeout_ms",
    [
        ("", None, 1000),
        ("wait_replicas=0", 0, 1000),
        ("wait_replicas=16&wait_timeout_ms=1", 16, 1),
        ("wait_timeout_ms=60000", None, 60000),
    ],
)
def test_wait_options_at_their_limits(query, replicas, timeout_ms):
    for base in ("redis://h/0", "redis+sentinel://s/svc/0"):
        parsed = parse_backend_url(f"{base}?{query}")
        assert (parsed.wait_replicas, parsed.wait_timeout_ms) == (replicas, timeout_ms)
        assert "wait_" not in parsed.client_url


@pytest.mark.parametrize(
    "query", ["wait_replicas=17", "wait_replicas=-1", "wait_timeout_ms=0", "wait_timeout_ms=60001"]
)
def test_wait_options_one_past_their_limits_are_refused(query):
    with pytest.raises(ConfigError, match=query.split("=")[0]):
        parse_backend_url(f"redis+sentinel://s/svc/0?{query}")


def test_a_sentinel_url_is_shown_with_its_hosts_and_no_password():
    shown = public_url("rediss+sentinel://u:pw@a:1,[::1]:2/svc/0?sentinel_password=spw")
    assert shown == "rediss+sentinel://u:***@a:1,[::1]:2/svc/0?sentinel_password=***"


# Which errors a failover waits out --------------------------------------------------------------

REFUSED = redis.ConnectionError("Error 111 connecting to 127.0.0.1:6380. Connection refused.")
CLOSED = redis.ConnectionError("Connection closed by server.")
READ_TIMEOUT = redis.TimeoutError("Timeout reading from socket")


@pytest.mark.parametrize(
    "exc, through_sentinel, plain",
    [
        (Demoted("the server is a replica now (READONLY)"), True, True),
        (redis.BusyLoadingError("Redis is loading the dataset in memory"), True, True),
        (TooFewReplicas("too few replicas in sync (NOREPLICAS)"), True, True),
        (redis.ResponseError("NOREPLICAS Not enough good replicas to write."), False, False),
        (MasterNotFoundError("No master found for 'svc'"), True, False),
        (REFUSED, True, False),
        (redis.TimeoutError("Timeout connecting to server"), True, False),
        # A reply lost in flight: the command may have run; the caller decides.
        (CLOSED, False, False),
        (READ_TIMEOUT, False, False),
        (
            redis.ConnectionError("Error 104 while writing to socket. Connection reset."),
            False,
            False,
        ),
    ],
)
def test_only_a_command_that_surely_did_not_run_is_sent_again(exc, through_sentinel, plain):
    assert did_not_run(exc, sentinel=True) is through_sentinel
    assert did_not_run(exc, sentinel=False) is plain


@pytest.mark.parametrize(
    "exc, through_sentinel, plain",
    [
        (CLOSED, True, True),  # a reply lost in flight: a read changed nothing
        (READ_TIMEOUT, True, True),
        (Demoted("the server is a replica now (READONLY)"), True, True),
        (REFUSED, True, False),  # on a plain URL, a Redis down: said at once
        (redis.ResponseError("WRONGTYPE Operation against a key"), False, False),
    ],
)
def test_a_read_is_sent_again_after_its_reply_was_lost_too(exc, through_sentinel, plain):
    assert read_rides(exc, sentinel=True) is through_sentinel
    assert read_rides(exc, sentinel=False) is plain


@pytest.mark.parametrize(
    "args, read",
    [
        (("HGETALL", "k"), True),
        ((b"hmget", "k", "f"), True),
        (("ZREVRANGE", "k", 0, 1), True),
        (("PING",), True),
        (("EVALSHA", "sha", 1, "k"), False),  # a script may write: never taken for a read
        (("BRPOP", "q", 1), False),  # a pop is a write
        (("LPUSH", "q", "x"), False),
        (("ZRANGESTORE", "d", "k", 0, 1), False),
        ((), False),
    ],
)
def test_only_commands_that_read_are_reads(args, read):
    assert is_read(args) is read


def test_never_sent_is_connecting_or_no_primary_only():
    assert never_sent(REFUSED) and never_sent(MasterNotFoundError("x"))
    assert not never_sent(CLOSED) and not never_sent(READ_TIMEOUT)
    assert not never_sent(redis.ResponseError("ERR connecting to nothing"))


def test_a_wait_is_logged_with_a_few_words_of_why_not_redis_pys_repr_of_every_sentinel():
    """redis-py's "No master found" holds the repr of each Sentinel client and its error: a
    kilobyte a Sentinel in the worker's log, had it been logged as it is."""
    clients = "<redis.client.Redis(<ConnectionPool(<Connection(username=<REDACTED>,pas***)>)>)>"
    assert reason(MasterNotFoundError(f"No master found for 'svc' : {clients * 3}")) == (
        "the Sentinels name no primary"
    )
    assert reason(REFUSED) == "Error 111 connecting to 127.0.0.1:6380. Connection refused"
    assert reason(redis.ConnectionError("x" * 500 + "\nmore")) == "x" * 120
    assert reason(redis.ConnectionError()) == "ConnectionError"
