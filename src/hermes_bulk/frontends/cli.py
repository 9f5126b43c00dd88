"""`hermes-bulk`: the command line over the jobs API. One handler per command.

The answers of the commands `/bulk` shares are frontends/replies.py's; this module adds what belongs
to a terminal: progress bars, tables, `--json`, standard output, exit codes, and the commands only a
shell has (worker, workers, wait, path, budget).

Errors hermes-bulk understands print one line and exit non-zero; anything unexpected prints one
line that points at a log file holding the traceback. Never a traceback on the terminal.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import sys
import time
import traceback
from argparse import Namespace
from pathlib import Path
from typing import TYPE_CHECKING

from ..broken_pipe import is_broken_pipe, stdout_gone
from ..config import quick as quick_settings
from ..config.fields import register_settings_secrets
from ..errors import BackendUnavailable, ConfigError, HermesBulkError, InvalidTransition
from ..full_disk import disk_full_at
from ..jobs import prices
from ..jobs.service import Jobs, state_label
from ..providers.pacing import RequestGate
from ..runtime import cancel_batches
from ..store.records import PAUSE_SAMPLE
from ..words import count
from . import logs, replies, views
from .parser import UsageError, build_parser, normalise, options_for
from .terminal import WrappedStdout, print_table, say, terminal_width

if TYPE_CHECKING:
    from ..config.settings import Settings
    from ..jobs.service import JobStatus
    from ..store.protocol import JobRecord

# What only some commands use (views, the worker runtime, huey, the budget, metrics) is imported
# in their handlers: `path`, `list` and `status` start without it.

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_BACKEND, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
#: `wait`, or `run`/`resume`/`retry --wait`: the job paused (its token limit, or a user)
EXIT_PAUSED = 4
EXIT_TIMEOUT = 124  #: `wait`: its --timeout passed (as timeout(1) exits)

#: Commands that read the settings without loading pydantic when the environment leaves no doubt
#: (quick_settings): reads a user types often, which should answer at once (docs/benchmarks.md,
#: row 7).
QUICK_COMMANDS = frozenset({"path", "list", "status", "events", "show"})


def main(argv: list[str] | None = None) -> int:
    try:
        argv = normalise(list(sys.argv[1:] if argv is None else argv))
    except UsageError as exc:  # a mistyped command word
        say(f"hermes-bulk: {exc}")
        return EXIT_USAGE
    # Help too is wrapped to the terminal: argparse prints it.
    if (width := terminal_width(sys.stdout)) and "--json" not in argv:
        sys.stdout = WrappedStdout(sys.stdout, width)  # type: ignore[assignment]
    parser = build_parser(command=argv[0] if argv else None)
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        say(
            f"hermes-bulk: {exc} See: hermes-bulk "
            f"{argv[0] if argv and argv[0] in HANDLERS else ''} --help".replace("  ", " ")
        )
        return EXIT_USAGE
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    if not args.command:
        parser.print_help()
        return EXIT_USAGE
    settings: Settings | None = None
    try:
        settings = load_settings_for(args.command)
        if args.command != "worker":
            logs.log_to_file(settings.home)
        status = HANDLERS[args.command](args, settings) or EXIT_OK
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's flush at exit
        return status
    except BackendUnavailable as exc:
        say(f"hermes-bulk: {exc}")
        return EXIT_BACKEND
    except UsageError as exc:  # a value that parsed but cannot be used (an empty job id, a limit)
        say(f"hermes-bulk: {exc}")
        return EXIT_USAGE
    except HermesBulkError as exc:
        say(f"hermes-bulk: {exc}")
        return EXIT_ERROR
    except KeyboardInterrupt:
        say("hermes-bulk: interrupted.")
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug: keep the traceback out of the terminal, but keep it
        if is_broken_pipe(exc):  # `hermes-bulk status … | head`: the reader has what it wanted
            return stdout_gone()
        if (full := disk_full_at(exc, settings.home if settings else None)) is not None:
            say(
                f"hermes-bulk: the disk is full at {full}: free some space there (or choose "
                "another place), then run the command again."
            )
            return EXIT_ERROR
        log_path = _save_traceback(settings)
        saved = (
            f"the traceback is in {log_path}" if log_path else "the traceback could not be saved"
        )
        say(f"hermes-bulk: internal error ({type(exc).__name__}); {saved}. Please report it.")
        return EXIT_ERROR


#: The commands that may send requests to the endpoint: an unusable proxy stops them at once.
PROXY_CHECKED = frozenset({"create", "run", "worker"})


def _refuse_unusable_proxy(settings: Settings) -> None:
    """A SOCKS proxy in the environment (ALL_PROXY=socks5://…) is one line and exit 1, before
    anything runs: no item is sent to fail for a setting (docs/decisions.md, "Proxies")."""
    from ..providers.transport import proxy_refusal

    refusal = proxy_refusal(settings.endpoint.base_url)
    if refusal is not None:
        raise ConfigError(refusal)


def load_settings_for(command: str) -> Settings:
    """The settings, read quickly for a read command whose environment leaves no doubt, else by
    pydantic-settings, which also words the error of a bad value."""
    if command in QUICK_COMMANDS and (quick := quick_settings.read(os.environ)) is not None:
        register_settings_secrets(quick)
        return quick  # type: ignore[return-value]  # the same attributes, read without pydantic
    from ..config.settings import load_settings

    settings = load_settings()
    if command in PROXY_CHECKED:
        _refuse_unusable_proxy(settings)
    return settings


def _home_from_environment() -> Path:
    """The data directory the settings would name, read without them (they may be what
    failed): HERMES_BULK_HOME, else the default under HERMES_HOME or ~/.hermes."""
    from ..config.fields import default_home

    named = os.environ.get("HERMES_BULK_HOME", "").strip()
    return Path(named).expanduser() if named else default_home()


def _save_traceback(settings: Settings | None) -> Path | None:
    """Where the traceback was appended, or None when it could not be (a full disk, a bad
    folder)."""
    path = (settings.home if settings else _home_from_environment()) / "logs" / "errors.log"
    # The command line and the traceback can hold a key or a URL's password: appended masked.
    try:
        logs.append_private(
            path,
            f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(sys.argv)}\n"
            f"{traceback.format_exc()}\n",
        )
    except (OSError, HermesBulkError):
        return None
    return path


# Handlers -----------------------------------------------------------------------------------


def _jobs(settings: Settings, backend=None) -> Jobs:
    """The jobs API, with the cron budget's gate when a budget is configured on this machine."""
    return Jobs(settings, backend, request_gate=_GateWhenAsked(), cancel_batches=cancel_batches)


class _GateWhenAsked:
    """The request gate, looked up (budget settings, ledger) the first time a command asks it:
    `list` and `status` of jobs that are not running never do (docs/benchmarks.md, row 7)."""

    def admit(self, job) -> float:
        return request_gate().admit(job)

    def held_until(self, job) -> float | None:
        return request_gate().held_until(job)

    def not_sent(self, job) -> None:
        request_gate().not_sent(job)

    def __getattr__(self, name: str):  # the rest of the gate (doctor's charge), looked up as well
        return getattr(request_gate(), name)


@functools.cache
def request_gate() -> RequestGate:
    """This machine's request gate, found once per process (from HERMES_HOME as it is then)."""
    from ..budget.gate import gate_from_environment

    return gate_from_environment()


SHELL = replies.Place()  #: `hermes-bulk` in a shell


def cmd_create(args: Namespace, settings: Settings) -> int:
    progress = (
        (lambda n: say(f"\rdiscovered {count(n, 'item')}…", end=""))
        if not args.json and sys.stderr.isatty()
        else None
    )
    reply = replies.create(
        _jobs(settings), replies.Place(on_progress=progress), **options_for(replies.create, args)
    )
    if progress:
        say("")
    from ..jobs.creating import Plan  # loaded by create anyway

    if args.json and isinstance(reply.data, Plan):
        plan = reply.data
        print(
            json.dumps(
                {
                    "dry_run": True,
                    "items": plan.items,
                    "skipped": plan.skipped,
                    "estimated_tokens": plan.estimated_tokens,
                    "output_allowance": plan.output_allowance,
                    "first_item": plan.first_item,
                    "request": plan.request,
                    "reused": plan.reused,
                    "repeats": plan.repeats,
                    "to_run": plan.to_run,
                    "allowance_from": plan.allowance_from,
                    "estimated_cost_usd": plan.estimated_cost_usd,
                    "worst_case_tokens": plan.worst_tokens,
                    "worst_case_cost_usd": plan.worst_case_cost_usd,
                    "price": plan.price.as_dict() if plan.price else None,
                    "price_unknown": plan.price_unknown,
                }
            )
        )
    elif args.json:
        created = reply.data
        print(
            json.dumps(
                {
                    "job_id": created.job.job_id,
                    "items": created.job.total,
                    "skipped": created.job.skipped,
                    "reused": created.job.reused,
                    "estimated_cost_usd": prices.job_cost(created.job).estimated,
                    "skipped_entries": [
                        {"name": s.name, "reason": s.reason} for s in created.skipped
                    ],
                }
            )
        )
    else:
        print(reply.text)
    return EXIT_OK


def cmd_run(args: Namespace, settings: Settings) -> int:
    jobs = _jobs(settings)
    job = jobs.get(args.job)  # the prefix is resolved once; the rest names this job by its id
    if not args.no_check:
        _check_endpoint_first(jobs, job)
    reply = replies.run(jobs, SHELL, **{**options_for(replies.run, args), "job": job.job_id})
    if not args.wait:
        print(reply.text)
        return EXIT_OK
    job = reply.data
    return _wait_here(
        jobs,
        settings,
        job.job_id,
        args.workers or min(job.spec.concurrency, settings.max_concurrency),
    )


def _check_endpoint_first(jobs: Jobs, job: JobRecord) -> None:
    """Before a job of HERMES_BULK_*'s endpoint is run: doctor's checks, with the job's model. An
    endpoint that is down, a refused key or an unknown model would only pause the job
    (runtime/breaker.py): say so now, and run nothing."""
    if job.spec.client != "http" or job.finished:
        return  # another kind calls its own model (Hermes'); a finished job has nothing to run
    report = SHELL.doctor(job.spec.model, jobs.settings, jobs.request_gate)
    if not report.usable:
        raise InvalidTransition(
            f"Job {job.job_id} was not run: its endpoint cannot serve it now:\n{report.text()}\n"
            f"Correct that (hermes-bulk doctor checks it again), then run it again; or run it "
            f"anyway with --no-check."
        )


def _wait_here(jobs: Jobs, settings: Settings, job_id: str, threads: int) -> int:
    """Run workers in this process until the job stops processing, with a progress bar."""
    from . import waiting  # the terminal's wait: not loaded by list or path

    st = waiting.run_here(jobs, settings, job_id, threads, request_gate())
    if st is None:
        say(f"Continue with: hermes-bulk run {job_id} --wait")
        return EXIT_INTERRUPTED
    print(views.status_text(jobs.status(job_id)))
    return _ended_status(st)


def _ended_status(st: JobStatus) -> int:
    """The exit status of a job that stopped processing."""
    if st.state == "paused" and st.job.pause_reason != PAUSE_SAMPLE:
        return EXIT_PAUSED  # at its token limit, or by a pause from elsewhere: not done
    if st.state == "paused":
        return EXIT_OK  # run --sample: it did what was asked
    return EXIT_OK if st.state == "completed" else EXIT_ERROR


def _print_jobs(reply: replies.Reply, as_json: bool) -> None:
    if as_json:
        print(json.dumps([s.as_dict() for s in reply.data]))
    elif reply.data:
        print_table(views.jobs_table(reply.data))
    else:
        print(reply.text)


def cmd_status(args: Namespace, settings: Settings) -> int:
    jobs = _jobs(settings)
    if args.job is None and not args.watch:
        _print_jobs(replies.jobs_list(jobs, SHELL, limit=10), args.json)
        return EXIT_OK
    if args.watch:
        job_id = jobs.resolve(args.job)
        with contextlib.suppress(KeyboardInterrupt):
            from . import waiting  # the terminal's wait: not loaded by list or path

            waiting.follow(
                jobs, job_id, until=lambda s: s.state in views.FINAL_STATES, quiet=args.json
            )
        args.job = job_id
    reply = replies.status(jobs, SHELL, **options_for(replies.status, args))
    if args.failed and args.json:
        print(
            json.dumps(
                [
                    {
                        "item": i.name,
                        "number": i.index + 1,
                        "error_type": i.error_type,
                        "http_status": i.http_status,
                        "message": i.error_message,
                    }
                    for i in reply.data
                ]
            )
        )
        return EXIT_OK
    print(json.dumps(reply.data.as_dict()) if args.json else reply.text)
    return EXIT_OK


def cmd_show(args: Namespace, settings: Settings) -> int:
    reply = replies.show(_jobs(settings), SHELL, job=args.job, item=args.item)
    print(json.dumps(reply.data.as_dict(), ensure_ascii=False) if args.json else reply.text)
    return EXIT_OK


def cmd_pause(args: Namespace, settings: Settings) -> int:
    print(replies.pause(_jobs(settings), SHELL, job=args.job).text)
    return EXIT_OK


def cmd_resume(args: Namespace, settings: Settings) -> int:
    return _reply_then_wait(replies.resume, args, settings)


def cmd_retry(args: Namespace, settings: Settings) -> int:
    return _reply_then_wait(replies.retry, args, settings)


def _reply_then_wait(handler: replies.Handler, args: Namespace, settings: Settings) -> int:
    """resume and retry: the reply, then with --wait workers here until the job ends."""
    jobs = _jobs(settings)
    reply = handler(jobs, SHELL, **options_for(handler, args))
    print(reply.text)
    if not args.wait:
        return EXIT_OK
    threads = min(reply.data.spec.concurrency, settings.max_concurrency)
    return _wait_here(jobs, settings, reply.data.job_id, threads)


def cmd_export(args: Namespace, settings: Settings) -> int:
    if args.output == "-":  # the terminal's own: /bulk has no standard output to write to
        _jobs(settings).export_to_stream(
            args.job,
            sys.stdout,
            fmt=args.format,
            with_input=args.with_input,
            only=args.only,
            column=args.column,
        )
    else:
        print(replies.export(_jobs(settings), SHELL, **options_for(replies.export, args)).text)
    return EXIT_OK


def cmd_list(args: Namespace, settings: Settings) -> int:
    _print_jobs(replies.jobs_list(_jobs(settings), SHELL, limit=args.limit), args.json)
    return EXIT_OK


def cmd_events(args: Namespace, settings: Settings) -> int:
    print(replies.events(_jobs(settings), SHELL, job=args.job, limit=args.limit).text)
    return EXIT_OK


def cmd_delete(args: Namespace, settings: Settings) -> int:
    jobs = _jobs(settings)
    if not args.yes and sys.stdin.isatty():  # a person at a terminal; scripts (no terminal) proceed
        job = jobs.get(args.job)
        say(
            f"Delete job {job.job_id} ({count(job.total, 'item')}, its results and folder)? [y/N] ",
            end="",
        )
        if sys.stdin.readline().strip().lower() not in ("y", "yes"):
            say(f"Kept job {job.job_id}.")
            return EXIT_OK
        args.job = job.job_id
    print(replies.delete(jobs, SHELL, job=args.job, abandon_batches=args.abandon_batches).text)
    return EXIT_OK


def cmd_workers(args: Namespace, settings: Settings) -> int:
    from ..fleet.broker import open_backend
    from ..fleet.liveness import heartbeat_interval
    from ..jobs.service import missing_database

    # A worker makes the database when it starts, so none there means none alive (and a look
    # at the fleet must not leave an empty database behind).
    store = None if missing_database(settings) else open_backend(settings).store
    workers = store.live_workers() if store else []
    if not workers:
        print("No live workers. Start one with: hermes-bulk worker")
    else:
        print_table(
            views.workers_table(
                workers, store.now(), heartbeat_s=heartbeat_interval(settings.lease_seconds)
            )
        )
    return EXIT_OK


def cmd_wait(args: Namespace, settings: Settings) -> int:
    """Block until the job ends; the exit status says how (for scripts)."""
    jobs = _jobs(settings)
    job_id = jobs.resolve(args.job)
    from . import waiting  # the terminal's wait: not loaded by list or path

    st = waiting.follow(jobs, job_id, until=views.has_ended, timeout_s=args.timeout)
    if not views.has_ended(st):
        say(
            f"hermes-bulk: job {job_id} has not ended after {args.timeout:g} s "
            f"(it is {state_label(st.state)})."
        )
        return EXIT_TIMEOUT
    print(views.status_text(st))
    return _ended_status(st)


def cmd_doctor(args: Namespace, settings: Settings) -> int:
    """The endpoint, key and model checked with one cheap request; exit 0 when usable, else 1."""
    report = SHELL.doctor(args.model, settings, request_gate())
    replies.store_check(report, settings)
    reply = replies.doctor_reply(report)
    print(reply.text)
    checked = reply.data.held_until is None  # else the budget held the check: not known usable
    return EXIT_OK if reply.data.usable and checked else EXIT_ERROR


def cmd_path(args: Namespace, settings: Settings) -> int:
    print(settings.home)
    return EXIT_OK


def cmd_dashboard(args: Namespace, settings: Settings) -> int:
    from .dashboard.serve import serve

    jobs = _jobs(settings)
    jobs.list(1)  # a named database that is not there is one line now, not an error on every page
    token = settings.dashboard_token.get_secret_value() if settings.dashboard_token else None
    serve(jobs, host=args.host, port=args.port, token=token)
    return EXIT_OK


def cmd_budget(args: Namespace, settings: Settings) -> int:
    from ..budget.commands import run_budget_command
    from ..budget.service import Budget
    from ..budget.settings import budget_dir

    budget = Budget(budget_dir())
    try:
        status, text = run_budget_command(args, budget, prog="hermes-bulk budget")
    finally:
        budget.close()
    print(text, file=sys.stdout if status == EXIT_OK else sys.stderr)
    return status


def cmd_worker(args: Namespace, settings: Settings) -> int:
    from ..runtime.process import run_worker

    _configure_logging(args)
    run_worker(
        settings,
        request_gate=request_gate(),
        threads=args.workers,
        delay=args.delay,
        max_delay=args.max_delay,
        backoff=args.backoff,
        shutdown_timeout=args.shutdown_timeout,
        graceful_signal=args.graceful_signal,
        burst=args.burst,
        resume_interrupted=args.resume_interrupted,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
    )
    return EXIT_OK


def _configure_logging(args: Namespace) -> None:
    logs.log_to_stream(
        logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO,
        args.logfile,
    )


HANDLERS = {
    "create": cmd_create,
    "run": cmd_run,
    "status": cmd_status,
    "pause": cmd_pause,
    "resume": cmd_resume,
    "retry": cmd_retry,
    "export": cmd_export,
    "list": cmd_list,
    "events": cmd_events,
    "delete": cmd_delete,
    "show": cmd_show,
    "worker": cmd_worker,
    "workers": cmd_workers,
    "path": cmd_path,
    "budget": cmd_budget,
    "wait": cmd_wait,
    "dashboard": cmd_dashboard,
    "doctor": cmd_doctor,
}

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
