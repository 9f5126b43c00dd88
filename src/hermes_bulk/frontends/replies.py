"""What each command answers, once for `hermes-bulk` and `/bulk`: one handler per command.

A handler takes the jobs API, the Place the command was typed in and the command's options as
keyword parameters (named as the grammar's flags: `--max-tokens` is max_tokens;
frontends/parser.py's options_for picks them from a parse), does the command, and returns its Reply:
the text to show and the record behind it (for `--json` and for what the CLI goes on to do, such as
`--wait`). Where the two places answer differently, the Place says how, so no answer is written
twice. What belongs to a terminal (progress bars, tables, exit codes, `--json`, standard output)
stays in cli.py; what belongs to Hermes (threads, late answers, its model and working directory) in
plugin/bulk.py."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.provider import ANTHROPIC
from ..durations import zoned_clock
from ..errors import HermesBulkError, UsageError
from ..jobs import hints
from ..jobs.service import Jobs, JobStatus, state_label
from ..store.protocol import PAUSED, JobRecord
from ..words import count
from . import views
from .flag_files import read_instruction, read_schema, read_system

if TYPE_CHECKING:
    from ..config.settings import Settings
    from ..providers.doctor import Report


@dataclass(frozen=True)
class Reply:
    text: str
    data: Any = None  #: the Created, JobRecord, JobStatus or list of JobStatus the text shows


class Place:
    """Where commands are typed; this base is a shell (`hermes-bulk`). Subclasses override."""

    cmd: str = hints.CLI
    #: Between an answer and its next step: one line in a terminal, a line of its own in a chat.
    next_step_sep: str = " "
    #: run, resume and retry start workers in this process and answer at once (/bulk); in a
    #: shell workers elsewhere (or `--wait`) pick the job up.
    processes_here: bool = False
    #: The export answer says what the file holds (/bulk); a shell prints the path alone, for
    #: scripts.
    export_summary: bool = False
    #: `wait` gives up after this many seconds at most (a chat reply has a limit); None: never
    wait_limit_s: float | None = None

    def __init__(self, *, on_progress: Callable[[int], None] | None = None) -> None:
        self.on_progress = on_progress  #: told the items found so far, while creating

    def path(self, text: str) -> str:
        """A path the user typed, as the jobs API takes it (a shell's: as typed)."""
        return text

    def output_path(self, text: str | None) -> str | None:
        """export's --output; an empty one is the jobs API's to refuse."""
        return text

    def create_options(self, *, model: str | None, batch: bool) -> dict[str, Any]:
        """Who calls the model for a job created here: HERMES_BULK_*'s endpoint, by default."""
        return {"model": model}

    def tokens_source(self, job: JobRecord) -> str:
        return "the provider"

    def check_servable(self, job_ref: str) -> None:
        """Before run, resume or retry: raises when this place cannot process the job."""

    def start_workers(self) -> None:
        """With processes_here: start (or keep) the workers of this process."""

    def watch(self, job_id: str) -> None:
        """A job this place set running: its end may be news to tell later."""

    def unwatch(self, job_id: str) -> None:
        """The user has seen the job end, or stopped it: its end is no news."""

    def doctor(self, model: str | None, settings: Settings, gate: Any = None) -> Report:
        """The checks of the model its jobs call: here the endpoint, key and model in
        HERMES_BULK_*. The one model request a check may make is a bulk request: it passes the
        request budget's gate (budget.gate.BudgetGate) as a job's would."""
        from ..budget.gate import budget_hold, protocol_route
        from ..providers import doctor

        own = settings.endpoint
        model = model or settings.model

        def admit():
            if gate is None:
                return None
            return budget_hold(gate, gate.doctor_call(model or "", *protocol_route(own.protocol)))

        return doctor.check_endpoint(
            own.base_url,
            own.api_key,
            model,
            protocol=own.protocol,
            timeout_s=min(settings.request_timeout_seconds, doctor.CHECK_TIMEOUT_S),
            admit=admit,
        )


def create(
    jobs: Jobs,
    place: Place,
    *,
    over: str,
    instruction: str | None = None,
    instruction_file: str | None = None,
    schema: str | None = None,
    system: str | None = None,
    model: str | None = None,
    batch: bool = False,
    dry_run: bool = False,
    full: bool = False,
    **options: Any,
) -> Reply:
    """The job request (jobs/request.py) made from the command's options, and the job made of it
    (with dry_run its Plan; full: the whole first request shown). The options named here are
    files and paths read where the command was typed, and who answers (the place's
    create_options); the rest go to the request as they are, by their names."""
    from ..jobs.request import JobRequest  # pydantic: `list` and `status` start without it

    if instruction is not None and instruction_file:
        raise UsageError("Give the instruction or --instruction-file, not both.")
    if instruction_file:
        instruction = read_instruction(Path(place.path(instruction_file)))
    elif instruction is None:
        raise UsageError(
            f"Give an instruction: {hints.create(place.cmd)}, or --instruction-file PATH."
        )
    request = JobRequest.from_options(
        {
            **options,
            "instruction": instruction,
            "over": place.path(over),
            "schema": read_schema(Path(place.path(schema))) if schema else None,
            "system": read_system(Path(place.path(system))) if system else None,
            "batch": batch,
            **place.create_options(model=model, batch=batch),
        }
    )
    created = jobs.create(request, on_progress=place.on_progress, dry_run=dry_run)
    from ..jobs.creating import Plan  # loaded by create anyway

    if isinstance(created, Plan):
        return Reply(views.plan_text(created, full=full), created)
    text = views.created_text(created, f"{place.cmd} run")
    if created.job.spec.mode == "batch" and not created.job.finished:  # reuse answered all
        text += "\n" + _batch_note(jobs, created.job)
    return Reply(text, created)


#: What a batch job is, said where it is created or run.
BATCH_API = "the provider's Batch API (about half the price; answers within the batch window)"


def _batch_note(jobs: Jobs, job: JobRecord) -> str:
    """Who runs a batch job: a hermes-bulk worker with its own endpoint (Hermes' model has no batch
    call), one that serves the job (fleet/endpoints: its kind, endpoint and protocol); how many
    such workers are live now, and where to start one when none is."""
    live = len(jobs.liveness.capable_workers(job))
    return (
        f"It runs through {BATCH_API}, submitted by a hermes-bulk worker with its own endpoint; "
        f"Hermes' model has no batch call. {_batch_workers(live, job)}"
    )


def _batch_workers(live: int, job: JobRecord) -> str:
    if live:
        return f"{count(live, 'live worker')} serve{'s' if live == 1 else ''} it."
    where = (
        "HERMES_BULK_PROVIDER=anthropic and ANTHROPIC_API_KEY are"
        if job.spec.protocol == ANTHROPIC
        else "HERMES_BULK_BASE_URL and the key are"
    )
    return f"No worker that serves it is live: start one where {where} set: hermes-bulk worker"


def run(
    jobs: Jobs,
    place: Place,
    *,
    job: str,
    concurrency: int | None = None,
    rpm: int | None = None,
    tpm: int | None = None,
    wait: bool = False,
    sample: int | None = None,
) -> Reply:
    """wait: the workers are this process's (`hermes-bulk run --wait`), so none need naming.
    sample: run --sample N (Jobs.run)."""
    named = jobs.get(job)  # the prefix is resolved once: what follows acts on this job alone
    if named.spec.mode != "batch":  # a batch job is submitted by a hermes-bulk worker
        place.check_servable(named.job_id)
    job = jobs.run(named.job_id, concurrency=concurrency, rpm=rpm, tpm=tpm, sample=sample)
    check = f"Check it with: {place.cmd} status {job.job_id}"
    if job.sample:
        check = (
            f"It runs a sample of {count(len(job.sample), 'item')} spread over the job, then "
            f"pauses: look at the answers ({place.cmd} export {job.job_id}), then resume it for "
            f"the rest ({place.cmd} resume {job.job_id}). {check}"
        )
    if wait:  # the workers are this process's (`hermes-bulk run --wait`), whose bar says the rest
        return Reply(f"Job {job.job_id} is running: {count(job.pending, 'item')} pending.", job)
    return Reply(under_way(jobs, place, job, f"Job {job.job_id}", check), job)


def under_way(jobs: Jobs, place: Place, job: JobRecord, lead: str, check: str) -> str:
    """What run, resume and retry answer once the job is set running: who serves it (this
    process's workers, live workers that serve it by fleet/endpoints' rule, or none yet), whether
    the request budget holds its requests and until when (in the budget's zone), and the next
    step. Only what will happen: a job that no worker serves, or that the budget holds, is not
    said to be running. lead: "Job <id>", or "Job <id> resumed and"; check: the closing line."""
    sep = place.next_step_sep
    pending = count(job.pending, "item")
    if job.spec.mode == "batch":  # Hermes' model has no batch call: a hermes-bulk worker's
        live = jobs.status(job.job_id).live_workers
        said = "is running" if live else "waits for a worker"
        return (
            f"{lead} {said}: {pending} pending. It runs through {BATCH_API}, submitted by a "
            f"hermes-bulk worker with its own endpoint. {_batch_workers(live, job)}{sep}{check}"
        )
    if place.processes_here:
        place.start_workers()
        place.watch(job.job_id)
    st = jobs.status(job.job_id)  # after the start: the workers serving it and their cap
    if st.budget_held_until is not None:  # nothing is sent before the window reopens
        held = st.budget_held_until
        until = held.shown() if hasattr(held, "shown") else zoned_clock(held)
        who = (
            f"The worker in this process sends them then, up to {st.concurrency} at once, if it "
            "still runs."
            if place.processes_here
            else _who_picks_it_up(job, jobs, place)
        )
        return "\n".join(
            [
                f"{lead} waits for the request budget: {pending} pending, none sent before "
                f"{until} (the rest of this window is kept for chat). {who}",
                *views.concurrency_notes(st),
                check,
            ]
        )
    if place.processes_here:
        return "\n".join(
            [
                f"{lead} is running in the background: {pending} pending, up to "
                f"{st.concurrency} at once.",
                *views.concurrency_notes(st),
                check,
            ]
        )
    said = "is running" if st.live_workers else "waits for a worker"
    return f"{lead} {said}: {pending} pending. {_who_picks_it_up(job, jobs, place)}{sep}{check}"


def _who_picks_it_up(job: JobRecord, jobs: Jobs, place: Place) -> str:
    if (
        hints.PROCESSED_BY.get(job.spec.client) == hints.SLASH
    ):  # only where Hermes' model can be called
        return (
            "Workers that can call Hermes' model pick it up: a hermes-bulk worker with HERMES_HOME "
            "set to the profile it was created in, or Hermes itself: "
            f"{hints.process(job, 'run', hints.CLI)}."
        )
    live = len(jobs.liveness.capable_workers(job))  # only those that serve its endpoint and key
    if live:
        return f"{count(live, 'live worker')} pick{'s' if live == 1 else ''} it up."
    # who is live and what they serve instead, and the command for a worker that would
    return views.worker_wanted(jobs.status(job.job_id), place.cmd) + "."


def status(
    jobs: Jobs, place: Place, *, job: str | None = None, events: int = 0, failed: bool = False
) -> Reply:
    """One job, or (no job given) the most recent ten."""
    if job is None:
        return jobs_list(jobs, place, limit=10)
    st = jobs.status(job, events=events)
    if failed:
        return failed_items(st, jobs, place)
    if views.has_ended(st):
        place.unwatch(st.job.job_id)  # this reply is the news
    return Reply(
        views.status_text(st, tokens_source=place.tokens_source(st.job), cmd=place.cmd), st
    )


#: How often `wait` looks at the job.
WAIT_POLL_S = 0.5


def wait(jobs: Jobs, place: Place, *, job: str, timeout: float | None = None) -> Reply:
    """The job's status once it ends (status), or, after timeout or the place's limit, that it
    has not ended yet and that news of its end follows (the job is watched). A job not started
    would never end: that is said at once."""
    job_id = jobs.resolve(job)
    limits = [t for t in (timeout, place.wait_limit_s) if t is not None]
    deadline = time.monotonic() + min(limits) if limits else None
    while not views.has_ended(st := jobs.status(job_id)):
        if st.state == "not_started":
            return Reply(
                f"Job {job_id} is not started: start it with: {place.cmd} run {job_id}",
                st,
            )
        if deadline is not None and time.monotonic() >= deadline:
            place.watch(job_id)
            j = st.job
            return Reply(
                f"Job {job_id} is still {state_label(st.state)} after {min(limits):g} s: "
                f"{j.completed}/{j.total} completed, {j.failed} failed.{place.next_step_sep}"
                f"A notice follows when it ends; check it with: {place.cmd} status {job_id}",
                st,
            )
        time.sleep(WAIT_POLL_S)
    return status(jobs, place, job=job_id)


#: status --failed lists at most this many failed items; the export has them all.
FAILED_LISTED = 20


def failed_items(st: JobStatus, jobs: Jobs, place: Place) -> Reply:
    """status --failed: the job's failed items by name, with their recorded errors."""
    items = jobs.failed_items(st.job.job_id, FAILED_LISTED)
    return Reply(views.failed_text(st.job.job_id, items, st.job.failed, place.cmd), items)


def show(jobs: Jobs, place: Place, *, job: str, item: str) -> Reply:
    """One item: its state, what was sent, the answer and every recorded attempt."""
    shown = jobs.item(job, item)
    return Reply(views.show_text(shown), shown)


def jobs_list(jobs: Jobs, place: Place, *, limit: int = 20) -> Reply:
    statuses = jobs.list(limit)
    return Reply(views.jobs_text(statuses, cmd=place.cmd), statuses)


def pause(jobs: Jobs, place: Place, *, job: str) -> Reply:
    job = jobs.pause(job)
    place.unwatch(job.job_id)
    return Reply(
        f"Job {job.job_id} paused: no new items start; items in progress may finish."
        f"{place.next_step_sep}Continue with: {hints.process(job, 'resume', place.cmd)}",
        job,
    )


def resume(
    jobs: Jobs,
    place: Place,
    *,
    job: str,
    max_tokens: int | None = None,
    max_cost: int | None = None,
    concurrency: int | None = None,
    rpm: int | None = None,
    tpm: int | None = None,
    wait: bool = False,
) -> Reply:
    named = jobs.get(job)
    if named.spec.mode != "batch":  # a batch job is submitted by a hermes-bulk worker
        place.check_servable(named.job_id)
    job = jobs.resume(
        named.job_id,
        max_tokens=max_tokens,
        max_cost=max_cost,
        concurrency=concurrency,
        rpm=rpm,
        tpm=tpm,
    )
    if wait:  # the workers are this process's: no one else to ask for
        return Reply(f"Job {job.job_id} resumed: {count(job.pending, 'item')} pending.", job)
    check = f"Check it with: {place.cmd} status {job.job_id}"
    return Reply(under_way(jobs, place, job, f"Job {job.job_id} resumed and", check), job)


def retry(jobs: Jobs, place: Place, *, job: str, wait: bool = False) -> Reply:
    named = jobs.get(job)
    if named.spec.mode != "batch":  # a batch job is submitted by a hermes-bulk worker
        place.check_servable(named.job_id)
    job, n = jobs.retry(named.job_id)
    returned = f"Job {job.job_id}: {count(n, 'failed item')} returned to the queue"
    if job.state == PAUSED:
        return Reply(
            f"{returned}. The job is paused; continue with: {place.cmd} resume {job.job_id}", job
        )
    if wait:  # the workers are this process's: no one else to ask for
        return Reply(returned + ".", job)
    check = f"Check it with: {place.cmd} status {job.job_id}"
    return Reply(under_way(jobs, place, job, f"{returned}; the job", check), job)


def export(
    jobs: Jobs,
    place: Place,
    *,
    job: str,
    format: str = "md",
    output: str | None = None,
    with_input: bool = False,
    only: str | None = None,
    column: str | None = None,
) -> Reply:
    """To a file; standard output is the CLI's own (in Hermes it is the gateway's channel)."""
    if output == "-":
        raise UsageError(
            f"{place.cmd} export cannot write to standard output; give a file name as --output."
        )
    named = jobs.get(job)
    path = jobs.export(
        named.job_id,
        fmt=format,
        output=place.output_path(output),
        with_input=with_input,
        only=only,
        column=column,
    )
    if not place.export_summary:
        return Reply(str(path), path)
    job = jobs.get(named.job_id)
    unfinished = job.total - job.completed - job.failed
    return Reply(
        f"Exported job {job.job_id} to {path}\n{job.completed} completed, {job.failed} failed, "
        f"{unfinished} unfinished, of {count(job.total, 'item')}.",
        path,
    )


def events(jobs: Jobs, place: Place, *, job: str, limit: int = 50) -> Reply:
    st = jobs.status(job, events=limit)
    return Reply(
        "\n".join(views.event_lines(st.events, st.event_names))
        or f"Job {st.job.job_id} has no events yet.",
        st,
    )


def doctor(jobs: Jobs, place: Place, *, model: str | None = None) -> Reply:
    """Can the model the jobs made here call be reached, with this key and model? One line a
    check; on Redis, a line for the store: its primary and replicas."""
    report = place.doctor(model, jobs.settings, jobs.request_gate)
    store_check(report, jobs.settings)
    return doctor_reply(report)


def store_check(report: Report, settings: Settings) -> None:
    """On a Redis backend: the primary writes go to and its replicas (OK), or why it cannot be
    used (FAIL). Nothing on SQLite (the file is opened by any command that needs it)."""
    from ..config.backend_url import RedisUrl, parse_backend_url
    from ..fleet.broker import open_backend
    from ..providers.doctor import FAIL, OK

    if not isinstance(parse_backend_url(settings.backend_url), RedisUrl):
        return
    try:
        line = open_backend(settings).describe()
    except HermesBulkError as exc:
        report.add("store", FAIL, str(exc))
        return
    report.add("store", OK, line or "")


def doctor_reply(report: Report) -> Reply:
    if report.held_until is not None:  # the budget keeps what is left of the window for chat
        verdict = (
            f"Not checked. Check again once the window reopens at {report.held_until.shown()}, "
            "or give bulk more of this window (raise daily_limit or lower chat_reserve)."
        )
    elif report.usable:
        verdict = "Usable."
    else:
        verdict = (
            "Not usable: correct what the FAIL lines name, then check again (a job that paused "
            "for it continues with resume)."
        )
    return Reply(f"{report.text()}\n{verdict}", report)


def delete(jobs: Jobs, place: Place, *, job: str, abandon_batches: bool = False) -> Reply:
    job_id = jobs.delete(job, abandon_batches=abandon_batches)
    return Reply(f"Deleted job {job_id}.", job_id)


#: jobs, place, then the command's options as keyword parameters
Handler = Callable[..., Reply]
#: The commands both places have; the CLI adds worker, workers, wait, path and budget.
HANDLERS: dict[str, Handler] = {
    "create": create,
    "run": run,
    "status": status,
    "pause": pause,
    "resume": resume,
    "retry": retry,
    "export": export,
    "list": jobs_list,
    "events": events,
    "delete": delete,
    "show": show,
    "doctor": doctor,
    "wait": wait,
}
