"""Every Hermes API the cron-budget plugin uses, each behind one small function.

Hermes is imported inside the functions (plugins are validated in a bare interpreter, and
hermes-bulk runs without Hermes). Private APIs are marked; tests/budget/test_hermes_cron_budget.py
pins the behaviour each one relies on, against the installed hermes-agent.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("hermes_bulk.plugin")

_aux_wrapped = False


def root_home() -> Path:
    """The root Hermes home: one for every profile (hermes_constants.get_default_hermes_root)."""
    from hermes_constants import get_default_hermes_root

    return Path(get_default_hermes_root())


def active_profile() -> str:
    """The profile this process runs as ("default" when Hermes cannot say)."""
    try:
        from hermes_cli.profiles import get_active_profile_name

        return get_active_profile_name() or "default"
    except Exception:
        return "default"


@functools.lru_cache(maxsize=256)
def cron_job_name(job_id: str) -> str:
    """A cron job's name from the cron store, read once per process ("" when unknown)."""
    try:
        from cron.jobs import get_job

        job = get_job(job_id)
    except Exception:
        return ""
    return str((job or {}).get("name") or "")


def has_hook(name: str) -> bool:
    """Whether this Hermes fires a lifecycle hook (pre_auxiliary_call exists only after 0.19.0)."""
    try:
        from hermes_cli.plugins import VALID_HOOKS
    except Exception:
        return False
    return name in VALID_HOOKS


def observe_auxiliary_responses(observer: Callable[[Any, str | None], None]) -> bool:
    """Hermes 0.19.0 fallback for pre_auxiliary_call: see each successful auxiliary response.

    Private API: agent.auxiliary_client._validate_llm_response(response, task, ...) is called
    once per successful non-streamed auxiliary call (task None for a plugin's ctx.llm).
    Wrapped once per process; the observer never affects the call. False when it is missing.
    """
    global _aux_wrapped
    if _aux_wrapped:
        return True
    try:
        import agent.auxiliary_client as aux
    except Exception:
        return False
    original = getattr(aux, "_validate_llm_response", None)
    if original is None or not callable(original):
        return False

    @functools.wraps(original)
    def validate_and_count(response, task=None, *args, **kwargs):
        result = original(response, task, *args, **kwargs)
        try:
            observer(response, task)
        except Exception:  # an observer must never change an auxiliary call's result
            log.exception("cron-budget: counting an auxiliary call failed")
        return result

    aux._validate_llm_response = validate_and_count
    _aux_wrapped = True
    return True


def bedrock_response(text: str) -> Any:
    """A Bedrock Converse answer as Hermes' dispatch hands it on: normalised to the OpenAI shape."""
    from agent.bedrock_adapter import normalize_converse_response

    return normalize_converse_response(
        {
            "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
            "stopReason": "end_turn",
            "usage": {"inputTokens": 0, "outputTokens": 0},
        }
    )
