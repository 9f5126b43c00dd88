"""Run inside a fresh interpreter by test_hermes_cron_budget.py: real Hermes, real plugin loading.

Loads plugins with Hermes' own PluginManager (HERMES_HOME from the environment), then drives the
paths a CLI run cannot isolate: auxiliary calls through agent.auxiliary_client, a bulk-charged
ctx.llm call, and held cron calls of every API mode through Hermes' real middleware chain.
Prints one JSON object.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    from hermes_cli.middleware import run_llm_execution_middleware
    from hermes_cli.plugins import discover_plugins, get_plugin_manager

    discover_plugins()
    mgr = get_plugin_manager()
    loaded = mgr._plugins.get("cron-budget")  # Hermes' own record of what it loaded
    out: dict = {
        "enabled": bool(loaded and loaded.enabled),
        "middleware": len(mgr._middleware.get("llm_execution", [])),
        "slash": "cron-budget" in mgr._plugin_commands,
        "cli": "cron-budget" in mgr._cli_commands,
    }
    if not out["enabled"]:
        print(json.dumps(out))
        return
    import agent.auxiliary_client as aux

    from hermes_bulk.budget.gate import mark_precharged
    from hermes_bulk.plugin import cron_budget

    def classes():
        return cron_budget.budget().report().counts.by_class()

    before = classes()
    aux.call_llm(
        task="title_generation",
        messages=[{"role": "user", "content": "name this"}],
        max_tokens=16,
        timeout=20,
    )
    out["after_title"] = classes()["auxiliary"] - before["auxiliary"]
    mark_precharged()  # as BudgetGate does for a /bulk item before its ctx.llm call
    aux.call_llm(messages=[{"role": "user", "content": "bulk item"}], max_tokens=16, timeout=20)
    out["after_precharged_ctx_llm"] = classes()["auxiliary"] - before["auxiliary"]
    aux.call_llm(
        messages=[{"role": "user", "content": "another plugin"}], max_tokens=16, timeout=20
    )
    out["after_plain_ctx_llm"] = classes()["auxiliary"] - before["auxiliary"]

    job_id = sys.argv[1]
    provider_calls = []
    held = {}
    for mode in ("chat_completions", "codex_responses", "anthropic_messages", "bedrock_converse"):
        response = run_llm_execution_middleware(
            {"messages": [{"role": "user", "content": "x"}]},
            lambda req: provider_calls.append(req) or "PROVIDER",
            session_id=f"cron_{job_id}_20261130_120000",
            platform="cron",
            model="fake-model",
            provider="custom",
            base_url="http://127.0.0.1/v1",
            api_mode=mode,
            api_call_count=1,
            task_id="t",
            turn_id="u",
            api_request_id="r",
            middleware_trace=[],
        )
        held[mode] = type(response).__name__
    out["held_types"] = held
    out["provider_calls_while_held"] = len(provider_calls)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
