"""Pins each Hermes API that plugin/hermes.py and plugin/hermes_config.py wrap, against the
installed hermes-agent 0.19.0.

These run in this process with HERMES_HOME pointing at a temporary profile whose model is the
loopback provider; ctx.llm is Hermes' own PluginLlm, making real calls. If a Hermes upgrade
changes one of these behaviours, the test named after it fails.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import warnings
from types import SimpleNamespace

import pytest

from hermes_bulk.config.settings import load_settings
from hermes_bulk.errors import (
    ClientUnavailable,
    PermanentModelError,
    RateLimited,
    TransientModelError,
)
from hermes_bulk.plugin import background, hermes
from hermes_bulk.runtime import client_kinds
from hermes_bulk.store.protocol import JobRecord, JobSpec

from .conftest import clean_env, config_set

# Hermes' model client, run in this process, leaves sockets for the garbage collector to close.
pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")


@pytest.fixture
def profile(hermes_home, monkeypatch):
    for key in list(os.environ):
        if key.startswith(("HERMES_BULK_", "OPENAI_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("HERMES_HOME", str(hermes_home))
    yield hermes_home
    from agent.auxiliary_client import shutdown_cached_clients

    # Hermes keeps a client per provider for the process; not across tests
    shutdown_cached_clients()
    with warnings.catch_warnings():  # and drops some after errors without closing them
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def a_job(provider_key: str) -> JobRecord:
    spec = JobSpec(
        job_id="j1",
        instruction="Do",
        source="/x",
        source_kind="file",
        concurrency=1,
        retries=0,
        client=hermes.CLIENT,
        provider_key=provider_key,
    )
    return JobRecord(
        spec=spec,
        created_at=0.0,
        state="running",
        pause_reason=None,
        total=1,
        pending=1,
        running=0,
        completed=0,
        failed=0,
        tokens_in=0,
        tokens_out=0,
        tokens_charged=0,
        tokens_reserved=0,
        estimated_tokens=1,
        skipped=0,
        last_claim_at=None,
        run_at=None,
    )


MESSAGES = [
    {"role": "system", "content": "You apply one instruction."},
    {
        "role": "user",
        "content": "Instruction:\nDo\n\n----- BEGIN ITEM ab12 -----\nalpha\n----- END ITEM ab12 "
        "-----",
    },
]


def test_homes_and_profile(profile):
    assert hermes.profile_home() == profile
    assert hermes.data_dir() == profile / "plugin-data" / "bulk"
    assert (
        hermes.profile_name() == "default"
    )  # a HERMES_HOME outside ~/.hermes is a root, as in Docker


def test_settings_come_from_config_yaml_or_ctx_get_config(profile):
    assert hermes.plugin_settings() == {}
    config_set(profile, "plugins.entries.bulk.settings.max_retries", "5")
    config_set(profile, "plugins.entries.bulk.settings.backend", "sqlite:////tmp/x.db")
    assert hermes.plugin_settings() == {"max_retries": 5, "backend": "sqlite:////tmp/x.db"}
    assert load_settings(plugin_settings=hermes.plugin_settings()).max_retries == 5

    newer = SimpleNamespace(
        get_config=lambda key, default=None: {"max_concurrency": 7}.get(key, default)
    )
    assert hermes.plugin_settings(newer) == {"max_concurrency": 7}, (
        "ctx.get_config wins where Hermes has it"
    )


def test_the_configured_model_and_its_provider_key(profile, monkeypatch, tmp_path):
    model = hermes.configured_model()
    assert (model.profile, model.provider, model.model) == ("default", "custom", "fake-model")
    assert model.provider_key == "hermes:default:custom:fake-model"
    assert "sk-" not in model.provider_key
    assert hermes.profile_of(model.provider_key) == "default" and hermes.profile_of("p:abc") is None

    work = tmp_path / "root" / "profiles" / "work"  # <root>/profiles/<name>: a named profile
    work.mkdir(parents=True)
    monkeypatch.setenv("HERMES_HOME", str(work))
    assert hermes.profile_name() == "work"


@pytest.mark.parametrize(
    ("provider", "base_url", "configured", "mode"),
    [
        ("anthropic", "", "", "anthropic_messages"),  # Claude: Hermes' chat rows read so
        ("claude", "", "", "anthropic_messages"),  # an alias of it
        ("custom", "http://127.0.0.1:9/anthropic", "", "anthropic_messages"),  # the URL says so
        ("custom", "http://127.0.0.1:9/v1", "", "chat_completions"),
        ("custom", "http://127.0.0.1:9/v1", "codex_responses", "codex_responses"),  # configured
        ("custom", "http://127.0.0.1:9/v1", "no-such-mode", "chat_completions"),
        ("openai-codex", "", "", "codex_responses"),
        ("openrouter", "", "", "chat_completions"),
        ("bedrock", "", "", "bedrock_converse"),
    ],
)
def test_the_api_mode_a_request_is_recorded_with_is_the_one_hermes_speaks(
    provider, base_url, configured, mode
):
    """Issue 46, 14: read from Hermes' own tables (hermes_cli.providers), which an upgrade that
    renames them breaks here; "unknown" never, while they are there."""
    assert hermes.api_mode(provider, base_url, configured) == mode


def test_a_job_made_in_hermes_records_its_provider_and_the_api_mode_in_force(profile):
    job = a_job("hermes:default:custom:fake-model")
    assert hermes.request_route(job) == ("custom", "chat_completions")
    config_set(profile, "model.base_url", "http://127.0.0.1:9/anthropic")
    assert hermes.request_route(job) == ("custom", "anthropic_messages")
    # made for another provider than the one configured now: that provider's own transport
    assert hermes.request_route(a_job("hermes:default:anthropic:claude-x")) == (
        "anthropic",
        "anthropic_messages",
    )


def test_in_profile_carries_the_profile_onto_another_thread(profile, tmp_path):
    other = tmp_path / "other-profile"
    seen = []

    def worker():
        with hermes.in_profile(other):
            seen.append(hermes.profile_home())
        seen.append(hermes.profile_home())

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == [other, profile]


def test_ctx_llm_answers_with_provider_model_and_usage(profile, hermes_provider):
    client = hermes.HermesLlmClient(hermes.standalone_llm(), provider_key="k", timeout_s=10)
    completion = client.complete(MESSAGES, max_tokens=100)
    assert completion.text.startswith("ANSWER[") and completion.text.endswith("] alpha")
    assert (completion.provider, completion.model) == ("custom", "fake-model")
    assert completion.usage.tokens_in and completion.usage.tokens_out


def test_a_schema_goes_through_complete_structured(profile, hermes_provider):
    client = hermes.HermesLlmClient(hermes.standalone_llm(), provider_key="k", timeout_s=10)
    schema = {
        "type": "object",
        "properties": {"summary": {"type": "string"}, "length": {"type": "integer"}},
    }
    completion = client.complete(MESSAGES, max_tokens=100, json_schema=schema)
    data = json.loads(completion.text)
    assert set(data) == {"summary", "length"} and data["summary"].startswith("summary:")


@pytest.mark.parametrize(
    ("script", "expected", "status"),
    [
        (["429:3", "429:3"], RateLimited, 429),  # Hermes retries a 429 once; the second reaches us
        (["500", "500", "500"], TransientModelError, 500),
        (["400"], PermanentModelError, 400),
        (["empty"], TransientModelError, 200),
    ],
    ids=["429", "500", "400", "empty"],
)
def test_ctx_llm_errors_map_onto_bulks_error_classes(
    profile, hermes_provider, script, expected, status
):
    hermes_provider.configure(script=list(script))
    client = hermes.HermesLlmClient(hermes.standalone_llm(), provider_key="k", timeout_s=10)
    with pytest.raises(expected) as caught:
        client.complete(MESSAGES, max_tokens=100)
    assert caught.value.http_status == status
    assert "sk-LEAKED" not in str(caught.value), "provider text stays out of Bulk's errors"
    if expected is RateLimited:
        assert caught.value.retry_after_s == 3.0, "Retry-After from the response headers"


def test_a_timeout_is_transient(profile, hermes_provider):
    hermes_provider.configure(script=["timeout"] * 6, hang_s=1.0)
    client = hermes.HermesLlmClient(hermes.standalone_llm(), provider_key="k", timeout_s=0.3)
    with pytest.raises(TransientModelError, match="timed out"):
        client.complete(MESSAGES, max_tokens=100)


NO_PROVIDER = """
from hermes_bulk.errors import ModelError
from hermes_bulk.plugin import hermes
try:
    hermes.HermesLlmClient(hermes.standalone_llm(), provider_key="k", timeout_s=5).complete(
        [{"role": "user", "content": "x"}], max_tokens=10)
except ModelError as exc:
    print(type(exc).__name__, exc)
"""


def test_no_model_provider_is_a_permanent_error(tmp_path, hermes_provider):
    # In a process of its own: Hermes caches the clients it resolved, per process.
    empty = tmp_path / "empty-profile"
    empty.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", NO_PROVIDER],
        env=clean_env(empty),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout.startswith(
        "PermanentModelError Hermes could not call a model: check the model setup "
        "in Hermes (hermes model)"
    ), proc.stdout + proc.stderr
    assert hermes_provider.requests == []


def test_a_fleet_worker_loads_the_profiles_env_and_serves_only_its_profile(profile, monkeypatch):
    (profile / ".env").write_text("HERMES_BULK_TEST_MARKER=from-profile\n")
    monkeypatch.setenv("HERMES_BULK_TEST_MARKER", "before")  # so monkeypatch restores it afterwards
    clients, note = hermes.worker_clients(load_settings())
    assert set(clients) == {"hermes"} and "serves jobs created in Hermes profile 'default'" in note
    assert os.environ["HERMES_BULK_TEST_MARKER"] == "before", (
        "nothing of Hermes is loaded until a job needs it"
    )

    factory = clients["hermes"]
    client = factory(a_job("hermes:default:custom:fake-model"))
    assert isinstance(client, hermes.HermesLlmClient) and client.home == profile
    assert os.environ["HERMES_BULK_TEST_MARKER"] == "from-profile", (
        "the profile's .env, as Hermes' cron loads it"
    )
    with pytest.raises(ClientUnavailable, match="profile 'work'"):
        factory(a_job("hermes:work:custom:fake-model"))


def test_the_worker_finds_the_hermes_kind_by_entry_point_with_the_plugins_gate(
    profile, tmp_path, monkeypatch
):
    monkeypatch.setattr(background, "_gates", {})
    settings = load_settings()
    served = client_kinds.served(settings)
    assert (
        set(served.clients) == {"hermes"}
        and "serves jobs created in Hermes profile 'default'" in served.note
    )
    assert served.request_gate is background.request_gate(settings), (
        "charged to the budget as this profile"
    )

    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "no-hermes-here"))
    served = client_kinds.served(load_settings())
    assert served.clients == {} and "no Hermes configuration at" in served.note
    assert served.request_gate is None, (
        "serving no Hermes jobs, the worker keeps the machine's gate"
    )


def test_a_worker_without_hermes_serves_no_hermes_jobs(profile, tmp_path, monkeypatch):
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "no-hermes-here"))
    clients, note = hermes.worker_clients(load_settings())
    assert clients == {} and "no Hermes configuration at" in note
    assert not (tmp_path / "no-hermes-here").exists(), "looking does not create a Hermes home"

    monkeypatch.setenv("HERMES_HOME", str(profile))
    real_find_spec = hermes.importlib.util.find_spec
    monkeypatch.setattr(
        hermes.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "agent" else real_find_spec(name, *a),
    )
    clients, note = hermes.worker_clients(load_settings())
    assert clients == {} and "hermes-agent is not installed" in note
