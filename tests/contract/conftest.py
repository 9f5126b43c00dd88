"""What the Redis contract tests share: a raw client on the test server, and a URL's key prefix."""

from __future__ import annotations

import pytest
import redis


@pytest.fixture
def raw(redis_server) -> redis.Redis:
    """A plain client on the tests' redis-server, to look at keys behind the store's back."""
    client = redis.Redis(port=redis_server.port, decode_responses=True)
    yield client
    client.close()


def prefix_of(url: str) -> str:
    """The key prefix a test's redis_url gives its store."""
    return url.rsplit("prefix=", 1)[1]
