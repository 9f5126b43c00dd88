"""Answers through Hermes' ctx.llm are held to the same rules as HTTP answers where Hermes passes
the facts on (DESIGN.md invariant 15): Hermes gives no finish_reason, so an answer of exactly the
output limit is truncated; an answer off the --schema is an invalid answer. Real hermes-agent
0.19.0 in this process, calling the loopback provider's hostile modes."""

from __future__ import annotations

import gc
import os
import warnings

import pytest

from hermes_bulk.errors import InvalidAnswer, TruncatedAnswer
from hermes_bulk.plugin import hermes

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

MESSAGES = [
    {"role": "system", "content": "You apply one instruction."},
    {
        "role": "user",
        "content": "Instruction:\nDo\n\n----- BEGIN ITEM ab12 -----\nalpha\n----- END ITEM ab12 "
        "-----",
    },
]
LABEL = {
    "type": "object",
    "properties": {"label": {"enum": ["good", "bad"]}},
    "required": ["label"],
}


@pytest.fixture
def profile(hermes_home, monkeypatch):
    for key in list(os.environ):
        if key.startswith(("HERMES_BULK_", "OPENAI_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("HERMES_HOME", str(hermes_home))
    yield hermes_home
    from agent.auxiliary_client import shutdown_cached_clients

    shutdown_cached_clients()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def test_an_answer_of_exactly_the_output_limit_is_truncated(profile, hermes_provider):
    # Hermes sends this provider no max_tokens: the fake then reports 100 tokens, no finish_reason.
    hermes_provider.configure(script=["length_silent"])
    client = hermes.HermesLlmClient(hermes.standalone_llm(), provider_key="k", timeout_s=10)
    with pytest.raises(TruncatedAnswer, match="output limit of 100 tokens") as caught:
        client.complete(MESSAGES, max_tokens=100)
    assert caught.value.billed and caught.value.usage.tokens_out == 100, "billed: charged"
    assert [r.fault for r in hermes_provider.requests] == ["length_silent"], (
        "one request, not retried"
    )
    hermes_provider.configure(script=["length_silent"])
    longer = client.complete(
        MESSAGES, max_tokens=60
    )  # more than the limit: it was not capped, not cut
    assert longer.usage.tokens_out == 100


def test_an_answer_off_the_schema_is_an_invalid_answer(profile, hermes_provider):
    hermes_provider.configure(script=["off_schema"])
    client = hermes.HermesLlmClient(hermes.standalone_llm(), provider_key="k", timeout_s=10)
    with pytest.raises(InvalidAnswer, match="does not match --schema"):
        client.complete(MESSAGES, max_tokens=100, json_schema=LABEL)
