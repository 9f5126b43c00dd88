"""The model clients close every connection they opened: a worker that stops, or a client that
is closed, leaves no socket for the collector to find. (The suite does not fail on a loopback
socket collected unclosed, pyproject.toml says why; here it does, for our clients.)"""

from __future__ import annotations

import gc
import threading
import warnings

import pytest

from hermes_bulk.jobs.prompt import build_messages
from hermes_bulk.providers.anthropic import AnthropicModelClient
from hermes_bulk.providers.client import HttpModelClient


@pytest.mark.parametrize("kind", [HttpModelClient, AnthropicModelClient])
def test_a_closed_client_leaves_no_socket_open(fake_provider, kind):
    messages = build_messages("Say it", "line:1", "row", "b2:" + "0" * 32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        client = kind(base_url=fake_provider.base_url, api_key="k", model="m", timeout_s=10)
        threads = [
            threading.Thread(target=client.complete, args=(messages,), kwargs={"max_tokens": 20})
            for _ in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert len(fake_provider.requests) == 4
        client.close()
        del client, threads
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
