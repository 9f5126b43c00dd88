"""The cron-budget plugin in real hermes-agent 0.19.0, against the loopback provider.

One root Hermes home (with a `work` profile) is set up per module through Hermes' own CLI;
each test then drives real `hermes` processes and counts what reached the provider.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hermes_bulk.budget.ledger import CallRecord
from hermes_bulk.budget.service import Budget
from hermes_bulk.budget.settings import budget_dir
from hermes_bulk.testing.fake_provider import FakeProvider

pytestmark = pytest.mark.slow  # real Hermes processes: chat, cron runs, profiles
hermes_cli = pytest.importorskip(
    "hermes_cli", reason="hermes-agent is not installed (scripts/test installs it)"
)

ROOT = Path(__file__).resolve().parents[2]
HERMES = Path(sys.executable).parent / "hermes"
SILENT = "[SILENT]"


class HermesHome:
    """A root Hermes home the tests own, and `hermes` run against it."""

    def __init__(self, base: Path, provider: FakeProvider) -> None:
        self.root = base / "root"
        self.user_home = base / "user"
        self.provider = provider
        self.root.mkdir()
        self.user_home.mkdir()

    def env(self, **extra: str) -> dict[str, str]:
        keep = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("HERMES_", "OPENAI_", "ANTHROPIC_", "OPENROUTER_"))
        }
        return {**keep, "HOME": str(self.user_home), "HERMES_HOME": str(self.root), **extra}

    def __call__(self, *args: str, check: bool = True, timeout: float = 120, **extra: str):
        proc = subprocess.run(
            [str(HERMES), *args],
            capture_output=True,
            text=True,
            env=self.env(**extra),
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            cwd=self.user_home,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"hermes {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def python(self, *args: str, stdin: str | None = None, **extra: str):
        return subprocess.run(
            [sys.executable, *args],
            capture_output=True,
            text=True,
            input=stdin,
            env=self.env(**extra),
            timeout=120,
            cwd=ROOT,
        )

    def budget(self) -> Budget:
        return Budget(budget_dir(self.root))

    def provider_requests(self) -> int:
        return len(self.provider.requests)

    def fill_window(self, to_total: int) -> None:
        """Chat requests into the ledger until the window's counted total is to_total."""
        b = self.budget()
        try:
            while b.report().counts.total < to_total:
                b.admit(CallRecord("chat", profile="filler", model="fake-model"))
        finally:
            b.close()


@pytest.fixture(scope="module")
def hermes(tmp_path_factory):
    provider = FakeProvider().start()
    home = HermesHome(tmp_path_factory.mktemp("hermes"), provider)
    for key, value in (
        ("model.provider", "custom"),
        ("model.base_url", provider.base_url),
        ("model.default", "fake-model"),
        ("model.api_key", "sk-local-fake"),
    ):
        home("config", "set", key, value, "--force")
    home("plugins", "enable", "cron-budget", "--no-allow-tool-override")
    b = home.budget()
    b.settings_file.set("chat_reserve", "2")
    b.settings_file.set("daily_limit", "3")  # cron stops once 1 request of the window is used
    b.close()
    yield home
    provider.stop()


def test_the_held_answer_of_each_api_mode_passes_its_real_transport():
    from agent.transports import get_transport
    from agent.usage_pricing import normalize_usage

    from hermes_bulk.plugin.held_response import held_response

    for mode in ("chat_completions", "codex_responses", "anthropic_messages", "bedrock_converse"):
        response = held_response(mode, "held: why")
        transport = get_transport(mode)
        assert transport.validate_response(response), mode
        normalized = transport.normalize_response(response)
        assert (normalized.content, normalized.finish_reason, normalized.tool_calls) == (
            "held: why",
            "stop",
            None,
        ), mode
        if mode == "anthropic_messages":  # the agent loop maps Anthropic's stop reason itself
            assert transport.map_finish_reason(response.stop_reason) == "stop"
        usage = normalize_usage(response.usage, provider="custom", api_mode=mode)
        assert (usage.input_tokens, usage.output_tokens) == (0, 0), mode


def test_cron_over_the_cap_never_reaches_the_provider_explains_once_and_chat_still_goes(
    hermes,
):
    hermes("cron-budget", "set", "mode", "enforce")
    refused = hermes("cron-budget", "set", "timezone", "Mars/Base", check=False)
    assert refused.returncode == 1
    assert " ".join(refused.stderr.split()).endswith(
        "timezone 'Mars/Base' is not an IANA zone name; use one like "
        "Europe/Berlin, America/New_York or UTC."
    )

    sent = hermes.provider_requests()
    chat = hermes("chat", "-Q", "-q", "hi")
    assert "ANSWER[" in chat.stdout
    assert (
        hermes.provider_requests() > sent
    )  # the chat turn reached the provider and used the cron share

    created = hermes(
        "cron", "create", "every 1h", "Reply pong", "--name", "digest", "--deliver", "local"
    )
    job_id = next(
        line.split(": ", 1)[1].strip()
        for line in created.stdout.splitlines()
        if line.startswith("Created job: ")
    )
    sent = hermes.provider_requests()
    for _ in range(2):
        assert "succeeded" in hermes("cron", "run", job_id).stdout
    assert hermes.provider_requests() == sent  # held runs make no provider request
    outputs = sorted((hermes.root / "cron" / "output" / job_id).glob("*.md"))
    assert len(outputs) == 2
    first, second = (p.read_text().rstrip().splitlines()[-1] for p in outputs)
    used = hermes.budget().report().counts.total  # the chat turn's requests (held runs count none)
    assert first.startswith(
        f"Held by cron-budget: this run was not sent to the model because this window has "
        f"used {used} of its 3 requests, and cron and bulk jobs stop at 1 (2 are kept for chat)."
    )
    assert second == SILENT

    # Past the whole daily limit, chat in another profile still reaches the provider.
    hermes("profile", "create", "work", "--clone")
    hermes.fill_window(5)
    sent = hermes.provider_requests()
    assert "ANSWER[" in hermes("-p", "work", "chat", "-Q", "-q", "hello from work").stdout
    assert hermes.provider_requests() > sent

    status = hermes("cron-budget", "status").stdout
    assert "Cron budget: enforce mode" in status
    assert "By profile: default 1, filler" in status and "work 1" in status
    row = next(line for line in status.splitlines() if line.startswith(job_id))
    assert row.split()[1:] == [
        "digest",
        "cron",
        "0",
        "2",
        "0",
    ]  # 0 requests, 2 held runs, 0 would-block
    report = json.loads(hermes("cron-budget", "status", "--json").stdout)
    assert report["held"] == 2 and report["by_class"]["cron"] == 0
    assert report["by_profile"]["work"] == 1

    # /cron-budget, dispatched the way Hermes' TUI does it (JSON-RPC over stdio).
    request = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "command.dispatch",
            "params": {"name": "cron-budget", "arg": "status"},
        }
    )
    proc = hermes.python("-m", "tui_gateway.entry", stdin=request + "\n")
    reply = next(json.loads(line) for line in proc.stdout.splitlines() if '"id": 1' in line)
    assert reply["result"]["type"] == "plugin"
    assert (
        "Cron budget: enforce mode" in reply["result"]["output"]
        and job_id in reply["result"]["output"]
    )


def test_auxiliary_calls_count_a_bulk_charged_ctx_llm_call_does_not_every_api_mode_is_held(
    hermes,
):
    b = hermes.budget()
    b.settings_file.set("mode", "enforce")
    b.close()
    hermes.fill_window(1)  # the cron share is used up
    sent = hermes.provider_requests()
    proc = hermes.python(str(Path(__file__).with_name("_hermes_inprocess.py")), "aaaaaaaaaaaa")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (out["enabled"], out["middleware"], out["slash"], out["cli"]) == (True, 1, True, True)
    assert out["after_title"] == 1  # title generation, through the 0.19.0 validation wrapper
    assert out["after_precharged_ctx_llm"] == 1  # charged as bulk already: not counted twice
    assert out["after_plain_ctx_llm"] == 2  # another plugin's ctx.llm counts as auxiliary
    assert out["held_types"] == {
        "chat_completions": "ChatCompletion",
        "codex_responses": "Response",
        "anthropic_messages": "SimpleNamespace",
        "bedrock_converse": "SimpleNamespace",
    }
    assert out["provider_calls_while_held"] == 0
    assert hermes.provider_requests() == sent + 3  # the three auxiliary calls, nothing held


def test_the_plugin_is_discovered_through_its_entry_point_and_stays_off_until_enabled(tmp_path):
    home = HermesHome(tmp_path, provider=None)  # no provider: nothing is called
    proc = home.python(str(Path(__file__).with_name("_hermes_inprocess.py")), "x")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {
        "enabled": False,
        "middleware": 0,
        "slash": False,
        "cli": False,
    }
    assert not (home.root / "plugin-data" / "cron-budget").exists()


def test_the_root_home_outside_hermes_is_the_one_hermes_uses(tmp_path, monkeypatch):
    from hermes_constants import get_default_hermes_root

    from hermes_bulk.budget.settings import root_home

    for hermes_home in (
        tmp_path / "opt",
        tmp_path / "opt" / "profiles" / "work",
        tmp_path / ".hermes" / "profiles" / "w",
    ):
        monkeypatch.setenv("HERMES_HOME", str(hermes_home))
        assert root_home() == Path(get_default_hermes_root())
