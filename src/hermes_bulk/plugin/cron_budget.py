"""The cron-budget plugin: register(ctx) wires Hermes onto hermes_bulk.budget, and decides nothing.

- llm_execution middleware: every main-loop provider attempt is admitted once, as chat, or as
  cron (platform "cron", job id from the session id "cron_<job id>_<YYYYmmdd_HHMMSS>"). A held
  cron call returns a synthetic final answer without calling the provider: the job's first held
  run in the window says why, later runs answer [SILENT] (cron then delivers nothing).
- auxiliary calls (titles, compression, a plugin's ctx.llm) are counted, never held, through
  pre_auxiliary_call where Hermes has it, else through the 0.19.0 response-validation wrapper.
  A ctx.llm call that /bulk already charged as bulk is not counted again.
- `/cron-budget` and `hermes cron-budget`: the same status and set as `hermes-bulk budget`.
Everything Hermes-specific sits in plugin/hermes_budget.py; the rules live in budget/.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
from typing import Any

log = logging.getLogger("hermes_bulk.plugin")

PLUGIN_ID = "cron-budget"
SILENT = "[SILENT]"
_CRON_SESSION = re.compile(r"^cron_(?P<job>[A-Za-z0-9-]+)_\d{8}_\d{6}$")

_budget = None
_budget_lock = threading.Lock()
_aux_via_hook = False
_registered = False


def counting() -> bool:
    """Whether this process counts requests (the plugin is registered): /bulk then charges its own
    requests as bulk from the first one, or the auxiliary-call observer would count them."""
    return _registered


def budget():
    """The one Budget of this process, in the root Hermes home (shared by every profile)."""
    global _budget
    with _budget_lock:
        if _budget is None:
            from ..budget.service import Budget
            from ..budget.settings import budget_dir
            from .hermes_budget import root_home

            _budget = Budget(budget_dir(root_home()))
        return _budget


def cron_job_id(session_id: str) -> str | None:
    m = _CRON_SESSION.match(session_id or "")
    return m.group("job") if m else None


def classify(context: dict[str, Any]):
    """The ledger record of one main-loop call, from the middleware's keyword arguments."""
    from ..budget.ledger import CallRecord
    from .hermes_budget import active_profile, cron_job_name

    session_id = str(context.get("session_id") or "")
    common = {
        "profile": active_profile(),
        "provider": str(context.get("provider") or ""),
        "model": str(context.get("model") or ""),
        "api_mode": str(context.get("api_mode") or ""),
    }
    job_id = cron_job_id(session_id)
    if context.get("platform") == "cron" or job_id:
        job_id = job_id or session_id
        return CallRecord(
            "cron", job_id=job_id, job_name=cron_job_name(job_id), run_id=session_id, **common
        )
    if context.get("task"):  # newer Hermes sends auxiliary calls through this middleware too
        return CallRecord("auxiliary", **common)
    return CallRecord("chat", **common)


def held_text(outcome) -> str:
    """What a held run answers: why, the first time in the window; [SILENT] after that."""
    if not outcome.first_held_run:
        return SILENT
    from ..budget.service import HELD_FOR_JOB_LIMIT
    from ..words import count

    s, w, a = outcome.settings, outcome.window, outcome.admission
    reopens = w.end_local.strftime("%Y-%m-%d %H:%M %Z")
    if outcome.held_because == HELD_FOR_JOB_LIMIT:
        why = (
            f"it has used {a.job_requests} of its job_limit of {count(s.job_limit, 'request')} "
            "in this window"
        )
    else:
        kept = f"{s.chat_reserve} {'is' if s.chat_reserve == 1 else 'are'} kept for chat"
        why = (
            f"this window has used {a.window_total} of its {count(s.daily_limit, 'request')}, "
            f"and cron and bulk jobs stop at {s.background_cap} ({kept})"
        )
    return (
        f"Held by cron-budget: this run was not sent to the model because {why}. "
        f"The job keeps its schedule and runs normally after the window resets at {reopens}; "
        "later runs until then stay silent. See: hermes cron-budget status"
    )


def llm_execution(request, next_call, **context):
    """Admit the call; hold an over-cap cron call, let everything else through. A call that
    never reached the provider (no connection was made) is taken back: a provider counts what
    it received."""
    held = call = outcome = None
    try:
        call = classify(context)
        if call.call_class == "auxiliary" and _aux_via_hook:
            call = None  # pre_auxiliary_call counts it
        else:
            outcome = budget().admit(call)
            if outcome.held:
                from .held_response import held_response

                held = held_response(call.api_mode, held_text(outcome))
    except Exception:  # a budget must never stop an agent
        log.exception("cron-budget: middleware failed; the call goes through")
    if held is not None:
        return held
    try:
        return next_call(request)
    except Exception as exc:
        if call is not None and outcome is not None and _never_sent(exc):
            budget().take_back(call, outcome)
        raise


def _never_sent(exc: BaseException) -> bool:
    try:
        from .hermes import never_sent

        return never_sent(exc)
    except Exception:  # whatever went wrong here, the provider's error is what the caller sees
        log.exception("cron-budget: telling whether a failed call was sent failed")
        return False


def _count_auxiliary(model: str, provider: str = "", api_mode: str = "") -> None:
    from ..budget.ledger import CallRecord
    from .hermes_budget import active_profile

    budget().admit(
        CallRecord(
            "auxiliary", profile=active_profile(), provider=provider, model=model, api_mode=api_mode
        )
    )


def on_pre_auxiliary_call(**kwargs) -> None:
    """Newer Hermes: one call per auxiliary provider attempt, retries included."""
    try:
        if not kwargs.get("aux_task") and _precharged():
            return
        _count_auxiliary(
            str(kwargs.get("model") or ""),
            str(kwargs.get("provider") or ""),
            str(kwargs.get("api_mode") or ""),
        )
    except Exception:
        log.exception("cron-budget: counting an auxiliary call failed")


def on_auxiliary_response(response, task) -> None:
    """Hermes 0.19.0: one call per successful auxiliary response (task None: a plugin's ctx.llm)."""
    if task is None and _precharged():
        return
    _count_auxiliary(str(getattr(response, "model", "") or ""))


def _precharged() -> bool:
    from ..budget.gate import take_precharged

    return take_precharged()


def slash_command(raw_args: str) -> str:
    from ..budget.commands import slash

    try:
        return slash(raw_args, budget())
    except Exception as exc:
        log.exception("cron-budget: /cron-budget failed")
        return f"/cron-budget: internal error ({type(exc).__name__}); see the Hermes log."


def cli_setup(parser) -> None:
    from ..budget.grammar import add_budget_arguments

    add_budget_arguments(parser)


def cli_run(args) -> None:
    """`hermes cron-budget …`: Hermes ignores the return value, so the exit status is ours to
    set."""
    from ..broken_pipe import stdout_gone
    from ..budget.commands import run_budget_command

    status, text = run_budget_command(args, budget(), prog="hermes cron-budget")
    try:
        print(text, file=sys.stdout if status == 0 else sys.stderr, flush=True)
    except BrokenPipeError:  # `hermes cron-budget status | head -5`: the reader has all it wants
        sys.exit(stdout_gone())
    sys.exit(status)


def register(ctx) -> None:
    global _aux_via_hook, _registered
    from ..frontends.logs import guard_host_logging
    from .hermes_budget import has_hook, observe_auxiliary_responses

    # our lines may quote a provider's error: masked whichever handler writes them
    guard_host_logging()
    ctx.register_middleware("llm_execution", llm_execution)
    _registered = True
    if has_hook("pre_auxiliary_call"):
        ctx.register_hook("pre_auxiliary_call", on_pre_auxiliary_call)
        _aux_via_hook = True
    elif not observe_auxiliary_responses(on_auxiliary_response):
        log.warning(
            "cron-budget: this Hermes offers no way to see auxiliary calls; they are not counted"
        )
    ctx.register_command(
        "cron-budget",
        slash_command,
        description="Request budget: the window, use by class and job, held runs",
        args_hint="[status | set KEY VALUE]",
    )
    ctx.register_cli_command(
        "cron-budget",
        "Request budget that holds cron jobs before the chat reserve",
        cli_setup,
        cli_run,
        description="Counts provider requests across profiles; holds cron at "
        "daily_limit - chat_reserve.",
    )
