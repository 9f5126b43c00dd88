"""The synthetic final answer a held cron call returns instead of calling the provider.

Hermes validates the llm_execution result with the transport of the agent's API mode, then
normalises it, so each mode gets the shape its transport accepts (pinned against the real
transports in tests/budget/test_hermes_cron_budget.py):

    chat_completions (and any other mode)  openai ChatCompletion, validated by `.choices`
    codex_responses                        openai Responses `Response`, validated by `.output`
    anthropic_messages                     a Messages-shaped object: `.content` text blocks,
                                           stop_reason "end_turn"
    bedrock_converse                       the Converse answer normalised as Hermes' dispatch does

Usage is zero: nothing reached a provider.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from . import hermes_budget

HELD_MODEL = "cron-budget-held"


def held_response(api_mode: str, text: str) -> Any:
    if api_mode == "codex_responses":
        return _responses(text)
    if api_mode == "anthropic_messages":
        return _anthropic(text)
    if api_mode == "bedrock_converse":
        return hermes_budget.bedrock_response(text)
    return _chat_completion(text)


def _chat_completion(text: str) -> Any:
    from openai.types.chat import ChatCompletion

    return ChatCompletion.model_validate(
        {
            "id": "cron-budget-held",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": HELD_MODEL,
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": text},
                }
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }
    )


def _responses(text: str) -> Any:
    from openai.types.responses import Response

    return Response.model_validate(
        {
            "id": "resp_cron_budget_held",
            "object": "response",
            "created_at": time.time(),
            "model": HELD_MODEL,
            "status": "completed",
            "parallel_tool_calls": False,
            "tool_choice": "auto",
            "tools": [],
            "output": [
                {
                    "type": "message",
                    "id": "msg_cron_budget_held",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            ],
            "usage": {
                "input_tokens": 0,
                "output_tokens": 0,
                "total_tokens": 0,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        }
    )


def _anthropic(text: str) -> Any:
    # The anthropic SDK is optional in Hermes; its transport reads these attributes only.
    return SimpleNamespace(
        id="msg_cron_budget_held",
        type="message",
        role="assistant",
        model=HELD_MODEL,
        content=[SimpleNamespace(type="text", text=text)],
        stop_reason="end_turn",
        stop_sequence=None,
        usage=SimpleNamespace(
            input_tokens=0,
            output_tokens=0,
            cache_read_input_tokens=0,
            cache_creation_input_tokens=0,
        ),
    )
