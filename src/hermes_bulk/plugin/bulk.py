"""`/bulk` in Hermes Agent: `register(ctx)` and the slash command, over the same jobs API as the
CLI.

What it wires into Hermes, and nothing else:
- `/bulk …` takes the grammar of `hermes-bulk` (frontends/grammar.py: one table of commands and
  options serves both) and answers as the CLI does (frontends/replies.py: one handler per command
  serves both), commands spelled `/bulk`;
- Hermes calls the handler on its event loop (in the gateway), so the handler is a coroutine:
  the command runs on a thread of its own, and the loop is free while it does;
- `/bulk run`, `resume` and `retry` start the embedded workers in this process
  (background.py) and answer at once; each item goes to Hermes' own model through ctx.llm
  (hermes.HermesLlmClient), never to an endpoint of Bulk's.
Jobs are decided in jobs/service.py; Hermes is imported only in hermes.py.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config.provider import ANTHROPIC
from ..config.settings import Settings, load_settings
from ..errors import HermesBulkError, InvalidTransition
from ..fleet.broker import open_backend
from ..frontends import logs, replies, views
from ..frontends.parser import (
    UsageError,
    build_parser,
    commands_text,
    options_for,
    split_slash_args,
)
from ..frontends.terminal import CHAT_WIDTH, fill, wrap
from ..jobs.service import Jobs
from ..runtime import cancel_batches
from ..store.protocol import PAUSE_USER, PAUSED, JobRecord
from ..words import count
from . import background, hermes, notices

log = logging.getLogger("hermes_bulk.plugin")

CMD = "/bulk"
REPLY_WAIT_S = 20.0  #: longer commands (a huge --over) answer later; Hermes gives a handler 30 s
_POLL_S = 0.02

DESCRIPTION = "Apply one instruction to many files, CSV rows or JSON records, in the background"
ARGS_HINT = '"<instruction>" --over <path> | run|status|pause|resume|retry|export <job_id>'

#: /bulk help's prose, one paragraph a line, broken once to the reply's width: text broken at one
#: width and wrapped again at another leaves a word or two alone on a line.
HELP_PROSE = (
    "Bulk: apply one instruction to many files, CSV rows or JSON records. Each item is its own "
    "model call, made in the background with Hermes' model; progress is kept outside the chat.",
    f'A first word that is not a command means create: {CMD} "<instruction>" --over <path>. '
    "create makes no model calls; items answered before are reused (--fresh asks again); "
    "--batch uses the provider's Batch API (about half the price), run by a hermes-bulk worker.",
)
HELP = "\n\n".join(
    [
        *(fill(paragraph, CHAT_WIDTH) for paragraph in HELP_PROSE),
        commands_text(build_parser(CMD, for_slash=True)),
        fill(
            f"A job id may be shortened to any unique prefix. Details of one command: {CMD} "
            "<command> --help",
            CHAT_WIDTH,
        ),
    ]
)

_ctx: Any = None  # the PluginContext Hermes registered us with: ctx.llm and, newer, ctx.get_config
_late_lock = threading.Lock()
# Answers that came after their reply, by profile home: they go out with the next /bulk of that
# profile (whoever may run /bulk there sees its jobs anyway; another profile's do not).
late_answers: dict[str, list[str]] = {}
# Jobs a /bulk command set running are kept per profile in notices.json (notices.py): when one
# ends (finished, or paused at its token limit) the user hears it once, from a message posted
# into the session that started it where this Hermes lets a plugin post there, else in the next
# /bulk reply of that profile; the file outlives a gateway restart.
NOTICE_POLL_S = 2.0  #: how often a job whose end is to be posted is looked at


_recovery: threading.Thread | None = None  # the recovery at start; commands wait for it
RECOVERY_WAIT_S = 10.0


def register(ctx: Any) -> None:
    """Hermes' plugin entry point."""
    global _ctx, _recovery
    _ctx = ctx
    # before any session exists our lines go to stderr: masked from here on
    logs.guard_host_logging()
    hermes.register_model_secrets()
    ctx.register_command("bulk", handle, description=DESCRIPTION, args_hint=ARGS_HINT)
    # On a thread: Hermes' start must not wait on Bulk's store (a Redis backend may be far).
    context = contextvars.copy_context()
    _recovery = threading.Thread(
        target=context.run, args=(_recover_at_start,), name="hermes-bulk-recovery", daemon=True
    )
    _recovery.start()


def _recover_at_start() -> None:
    try:
        background.recover_at_start(_settings())
    except Exception:  # Bulk still works: `/bulk run` recovers the job it continues
        log.warning("bulk: could not return interrupted items to the queue at start", exc_info=True)


# The handler ----------------------------------------------------------------------------------


class _Command:
    """One /bulk command on its thread; the handler waits for it, up to REPLY_WAIT_S."""

    def __init__(self, raw_args: str, profile: str) -> None:
        self.raw_args, self.profile = raw_args, profile
        self.answer: str | None = None
        self.items_found = 0
        self.abandoned = False  # the reply went out without the answer
        self.lock = threading.Lock()
        self.done = threading.Event()

    def start(self) -> None:
        # The profile of a multiplexed gateway is a context variable: carry it onto the thread.
        context = contextvars.copy_context()
        threading.Thread(
            target=context.run, args=(self._run,), name="hermes-bulk-command", daemon=True
        ).start()

    def _run(self) -> None:
        before = set(notices.watched(self.profile))  # not a job this very command starts
        sessions: list[_Session] = []
        text = answer(self.raw_args, on_progress=self._progress, sessions=sessions)
        # After the answer: a status that showed a job's end has told it already. With the
        # command's own session: a second backend in this process could disturb the workers' locks.
        news = end_notices(self.profile, sessions[0].jobs, before) if sessions and before else []
        if news:
            text = "\n".join(news) + "\n\n" + text
        with self.lock:
            self.answer = text
            if self.abandoned:
                with _late_lock:
                    late_answers.setdefault(self.profile, []).append(
                        f"Earlier {CMD} {self.raw_args}:\n{text}"
                    )
        self.done.set()

    def _progress(self, found: int) -> None:
        self.items_found = found

    def give_up(self) -> str:
        with self.lock:
            if self.answer is not None:
                return self.answer
            self.abandoned = True
        found = f" ({count(self.items_found, 'item')} found so far)" if self.items_found else ""
        return (
            f"Still working on it{found}. It goes on in the background; the answer comes with your "
            f"next {CMD} command."
        )


async def handle(raw_args: str) -> str:
    """The /bulk handler: returns to the event loop while the command runs on its thread."""
    profile = str(hermes.profile_home())
    command = _Command(raw_args or "", profile)
    command.start()
    deadline = time.monotonic() + REPLY_WAIT_S
    # Polling, not a future bound to this loop: Hermes' CLI runs the coroutine in a loop that is
    # closed as soon as it returns, and the thread may outlive it.
    while not command.done.is_set() and time.monotonic() < deadline:
        await asyncio.sleep(_POLL_S)
    text = (
        command.answer
        if command.done.is_set() and command.answer is not None
        else command.give_up()
    )
    with _late_lock:
        late = late_answers.pop(profile, [])
    return wrap("\n\n".join([*late, text]), CHAT_WIDTH)  # a chat has no width to ask (terminal.py)


def answer(
    raw_args: str,
    *,
    on_progress: Callable[[int], None] | None = None,
    sessions: list[_Session] | None = None,
) -> str:
    """One /bulk command, start to finish, as the text to show. Never raises, never a traceback."""
    first = raw_args.split(None, 1)[0] if raw_args.strip() else ""
    if first in ("", "help", "-h", "--help"):
        return HELP
    parser = build_parser(CMD, for_slash=True)
    try:
        argv = split_slash_args(raw_args)
        if "-h" in argv or "--help" in argv:
            return _command_help(parser, argv[0])
        args = parser.parse_args(argv)
        session = _Session(on_progress=on_progress)
        if sessions is not None:
            sessions.append(session)
        handler = HANDLERS[args.command]
        return handler(session.jobs, session, **options_for(handler, args)).text
    except UsageError as exc:
        if not exc.usage:  # a value the parser took but the command cannot use: the line says all
            return str(exc)
        return f"{exc}\n{exc.usage.strip()}\nSee: {CMD} help".replace("\n\n", "\n")
    except HermesBulkError as exc:
        return str(exc)
    except Exception as exc:  # a bug: keep the traceback for the log, give the user one line
        log.exception("bulk: %s %s failed", CMD, raw_args)
        return (
            f"Bulk hit an unexpected error ({type(exc).__name__}); the details are in the Hermes "
            f"log ({hermes.profile_home() / 'logs' / 'errors.log'}). Please report it."
        )


def watch(profile: str, job_id: str) -> None:
    session_key = hermes.session_key() if hermes.can_post_to_session(_ctx) else ""
    notices.watch(profile, job_id, session_key)
    if session_key:
        _ensure_poster()


def unwatch(profile: str, job_id: str) -> None:
    notices.unwatch(profile, job_id)


def end_notices(profile: str, jobs: Jobs, among: set[str]) -> list[str]:
    """One line for each job among those watched for this profile that has ended, each taken
    off the book as it is told; never raises."""
    news = []
    try:
        for job_id in sorted(set(notices.watched(profile)) & among):
            line = _ended(profile, jobs, job_id)
            if line:
                news.append(line)
    except Exception:  # the reply itself matters more than the news
        log.exception("bulk: checking for ended jobs failed")
    return news


def _ended(profile: str, jobs: Jobs, job_id: str) -> str | None:
    """The notice of a watched job that has ended, once (None while it runs, or if told already)."""
    try:
        st = jobs.status(job_id)
    except HermesBulkError:  # deleted meanwhile
        unwatch(profile, job_id)
        return None
    if not views.has_ended(st) or not notices.take(profile, job_id):
        return None
    if st.state == PAUSED and st.job.pause_reason == PAUSE_USER:
        return None  # the user paused it: not news to them
    return views.end_notice(st, CMD)


_poster: threading.Thread | None = None


def _ensure_poster() -> None:
    """Starts the thread that posts job ends into their sessions (a Hermes that allows it)."""
    global _poster
    with _late_lock:
        if _poster is not None and _poster.is_alive():
            return
        context = contextvars.copy_context()
        _poster = threading.Thread(
            target=context.run, args=(_post_ends,), name="hermes-bulk-notices", daemon=True
        )
        _poster.start()


def _post_ends() -> None:
    """While jobs to post about remain in this profile: each that ends gets one message in the
    session that started it; a message Hermes refuses stays for the next /bulk reply."""
    profile = str(hermes.profile_home())
    while True:
        keyed = {job: key for job, key in notices.watched(profile).items() if key}
        if not keyed:
            return
        try:
            session = _Session()
            for job_id, session_key in keyed.items():
                line = _ended(profile, session.jobs, job_id)
                if line and not hermes.post_to_session(_ctx, line, session_key):
                    notices.watch(profile, job_id, "")  # taken, not told: back, for the next reply
        except Exception:
            log.warning(
                "bulk: posting job ends failed; they come with the next %s reply",
                CMD,
                exc_info=True,
            )
        time.sleep(NOTICE_POLL_S)


def _command_help(parser, name: str) -> str:
    # argparse prints help to stdout, which is the JSON-RPC channel in Hermes' TUI gateway.
    sub = parser.subcommands.get(name)
    return sub.format_help() if sub is not None else HELP


class _Session(replies.Place):
    """What one command works with (settings for this profile, its backend, the jobs API), and
    how its answers differ from a shell's: Hermes' model and working directory, workers started
    in this process, and news of the jobs it set running."""

    cmd = CMD
    next_step_sep = "\n"
    processes_here = True
    export_summary = True
    #: /bulk wait answers well within the time the handler waits for a reply
    wait_limit_s = REPLY_WAIT_S - 5

    def __init__(self, *, on_progress: Callable[[int], None] | None = None) -> None:
        super().__init__(on_progress=on_progress)
        if _recovery is not None:  # what a command shows comes after the recovery at start
            _recovery.join(RECOVERY_WAIT_S)
        self.settings = _settings()
        self.backend = open_backend(self.settings)
        self.gate = background.request_gate(self.settings)
        self.jobs = Jobs(
            self.settings,
            self.backend,
            self.gate,
            cmd=CMD,
            cancel_batches=cancel_batches,
            setting_name=lambda field: f"plugins.entries.{hermes.PLUGIN_ID}.settings.{field}",
        )
        self.jobs.max_concurrency_for = self.max_concurrency_for
        self.profile = str(hermes.profile_home())

    def path(self, text: str) -> str:
        """Relative to Hermes' working directory (where the user's files are), not this
        process's."""
        path = Path(text).expanduser()
        return str(path if path.is_absolute() else hermes.working_directory() / path)

    def output_path(self, text: str | None) -> str | None:
        return self.path(text) if text else None  # an empty --output: the job's folder

    def create_options(self, *, model: str | None, batch: bool) -> dict[str, Any]:
        # each item goes to Hermes' own model (`--model` is not in /bulk's grammar)
        model = hermes.configured_model()
        if batch:  # a batch job: a hermes-bulk worker's endpoint (ctx.llm has no batch call)
            return {
                "model": model.model or None,
                "bind_endpoint": False,  # whichever worker's it is,
                "protocol": self.batch_protocol(model),  # as long as it speaks this protocol
            }
        return {
            "client": hermes.CLIENT,
            "provider": model.provider_key,
            "model": model.model or None,
        }

    def batch_protocol(self, model: hermes.HermesModel) -> str | None:
        """The API a `/bulk … --batch` job's workers speak: the one the plugin's settings choose
        (provider, or a base URL), else Claude's when Hermes' own model is Anthropic's (a
        Claude user's batch goes to Message Batches), else the default's."""
        if self.settings.provider or self.settings.base_url:
            return None
        return ANTHROPIC if model.provider == ANTHROPIC else None

    def tokens_source(self, job: JobRecord) -> str:
        return "Hermes" if job.spec.client == hermes.CLIENT else "the provider"

    def watch(self, job_id: str) -> None:
        watch(self.profile, job_id)

    def unwatch(self, job_id: str) -> None:
        unwatch(self.profile, job_id)

    def max_concurrency_for(self, job: JobRecord) -> int:
        """The cap in force for a job: the embedded worker's, which keeps the settings it started
        with, when one runs here and serves the job; else this command's settings (the next
        worker starts with them)."""
        runtime = background.running(self.backend.url)
        if runtime is not None and job.spec.client in runtime.clients:
            return runtime.settings.max_concurrency
        return self.settings.max_concurrency

    def start_workers(self) -> None:
        factory = hermes.client_factory(
            lambda: _ctx.llm,
            settings=self.settings,
            profile=hermes.profile_name(),
            home=hermes.profile_home(),
        )
        clients = {hermes.CLIENT: factory}
        background.ensure_running(self.settings, self.backend, clients=clients, gate=self.gate)

    def doctor(self, model: str | None, settings: Settings, gate: Any = None):
        """The model /bulk jobs call is Hermes' own (ctx.llm): one 1-token request through it, as an
        item's goes: through the request budget, charged as bulk (not sent while the budget
        holds bulk requests), taken back if it never reached the provider. Bulk has no endpoint
        or key of its own to check here."""
        from ..budget.gate import budget_hold
        from ..errors import ModelError
        from ..providers.doctor import FAIL, OK, SKIP, Report

        model = hermes.configured_model()
        named = (
            "/".join(part for part in (model.provider, model.model) if part) or "(none configured)"
        )
        report = Report(f"Hermes' model {named}")
        hold = budget_hold(self.gate, self.gate.doctor_call(model.model, *model.route()))
        if hold is not None:
            report.add("model", SKIP, f"not checked: nothing was sent; {hold.why}")
            report.held_until = hold.until
            return report
        client = hermes.HermesLlmClient(
            _ctx.llm,
            provider_key=model.provider_key,
            home=hermes.profile_home(),
            timeout_s=min(settings.request_timeout_seconds, 30.0),
        )
        try:
            client.complete([{"role": "user", "content": "Say OK."}], max_tokens=1)
        except ModelError as exc:
            if not exc.reached_provider:
                self.gate.not_sent()
            if exc.http_status != 200:  # 200: it answered, with nothing in one token
                report.add(
                    "model", FAIL, f"Hermes' model {named} did not answer a 1-token request: {exc}"
                )
                return report
        report.add("model", OK, f"Hermes' model {named} answered a 1-token request")
        return report

    def check_servable(self, job_ref: str) -> None:
        """Raises unless the workers in this process can run the job."""
        job = self.jobs.get(job_ref)
        if job.spec.client != hermes.CLIENT:
            raise InvalidTransition(
                f"Job {job.job_id} was created by hermes-bulk create and calls the endpoint "
                f"set in HERMES_BULK_*, not Hermes' model. Process it with: hermes-bulk run "
                f"{job.job_id} --wait"
            )
        created_in, here = hermes.profile_of(job.spec.provider_key), hermes.profile_name()
        if created_in != here:
            raise InvalidTransition(
                f"Job {job.job_id} was created in Hermes profile {created_in!r}; run it from "
                f"that profile (this is {here!r})."
            )


def _settings() -> Settings:
    """This profile's settings: config.yaml's plugins.entries.bulk.settings over the defaults."""
    return load_settings(
        plugin_settings={"home": str(hermes.data_dir()), **hermes.plugin_settings(_ctx)}
    )


#: The commands /bulk has, answered as frontends/replies.py answers them here (the Session says
#: how).
HANDLERS = replies.HANDLERS
