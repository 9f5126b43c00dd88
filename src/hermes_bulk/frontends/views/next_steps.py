"""What a job needs next: whether it has ended, the notice when it does, and the command that
moves it on where its status is shown."""

from __future__ import annotations

from ...jobs import hints
from ...jobs.service import JobStatus, state_label
from ...store.protocol import (
    INTERRUPTED_WORKER_STOP,
    PAUSE_COST_LIMIT,
    PAUSE_SAMPLE,
    PAUSE_TOKEN_LIMIT,
    PAUSE_USER,
    RUNNING,
)
from ...words import count
from .workers import worker_command, worker_wanted, workers_live

FINAL_STATES = ("completed", "completed_with_errors", "failed")


def has_ended(st: JobStatus) -> bool:
    """Finished, or paused (by a user, or at its token limit): nothing more happens by itself."""
    return st.state in FINAL_STATES or st.state == "paused"


#: A job paused at a limit: how the end notice says so, and the flag its resume needs.
_LIMIT_PAUSES = {
    PAUSE_TOKEN_LIMIT: ("paused at its token limit", " --max-tokens <n>"),
    PAUSE_COST_LIMIT: ("paused at its cost limit", " --max-cost <usd>"),
}


def end_notice(st: JobStatus, cmd: str) -> str:
    """How a job ended, and on a line of its own what to do next (each fits 80 columns)."""
    j = st.job
    done = f"{j.completed:,}/{count(j.total, 'item')} completed, {j.failed:,} failed"
    if st.state == "paused":
        why, flag = _LIMIT_PAUSES.get(j.pause_reason, ("paused", ""))
        if j.pause_reason == PAUSE_SAMPLE:
            why = "answered its sample and paused"
        elif j.pause_reason and j.pause_reason not in (*_LIMIT_PAUSES, PAUSE_USER):
            why = f"paused: {j.pause_reason}"
        hint = f"{cmd} resume {j.job_id}{flag}"
        return f"Job {j.job_id} {why} ({done}).\nContinue with: {hint}"
    hint = f"{cmd} retry {j.job_id}" if j.failed else f"{cmd} export {j.job_id}"
    return f"Job {j.job_id} ended: {state_label(st.state)} ({done}).\nNext: {hint}"


def next_step_lines(st: JobStatus, cmd: str) -> list[str]:
    """The command to act on the job, one that works where the status is shown
    (jobs/hints.py)."""
    j = st.job
    if st.state == "paused":
        if j.pause_reason == PAUSE_TOKEN_LIMIT:
            return [
                "Paused: token limit reached. Continue with: "
                f"{hints.process(j, 'resume', cmd, '--max-tokens <n>')}"
            ]
        if j.pause_reason == PAUSE_COST_LIMIT:
            return [
                "Paused: cost limit reached. Continue with: "
                f"{hints.process(j, 'resume', cmd, '--max-cost <usd>')}"
            ]
        if j.pause_reason == PAUSE_SAMPLE:
            return [
                "Paused after its sample (run --sample). Look at the answers: "
                f"{cmd} export {j.job_id}",
                f"Run the rest with: {hints.process(j, 'resume', cmd)}",
            ]
        if (
            j.pause_reason and j.pause_reason != PAUSE_USER
        ):  # paused itself (its endpoint): why, in full
            return [
                f"Paused: {j.pause_reason}.",
                f"Continue with: {hints.process(j, 'resume', cmd)}",
            ]
        return [f"Paused. Continue with: {hints.process(j, 'resume', cmd)}"]
    if st.state == "awaiting_recovery":
        if cmd == hints.CLI and hints.PROCESSED_BY.get(j.spec.client, hints.CLI) == hints.CLI:
            return _awaiting_recovery_cli(st)
        return [
            "No worker is running this job. Items that were in progress when its workers stopped "
            "go back to the queue and are sent again only when the job runs.",
            f"Continue with: {hints.process(j, 'run', cmd)}",
        ]
    if st.state == "waiting_for_worker":
        return _waiting_for_worker(st, cmd)
    if st.state == "not_started":
        return [f"Start it with: {hints.process(j, 'run', cmd)}"]
    if st.state in ("completed_with_errors", "failed"):
        return [f"Return failed items to the queue with: {hints.process(j, 'retry', cmd)}"]
    return []


def _waiting_for_worker(st: JobStatus, cmd: str) -> list[str]:
    """Run, nothing interrupted, and no live worker that can serve it: which worker it needs."""
    j = st.job
    if hints.PROCESSED_BY.get(j.spec.client, hints.CLI) == hints.CLI:
        needs = (
            f"a hermes-bulk worker for {j.spec.endpoint} ({j.spec.protocol}) with the API key "
            "the job was created with"
            if j.spec.endpoint
            else "a hermes-bulk worker"
        )
        return [f"Nothing was interrupted; it waits for {needs}.", worker_wanted(st, cmd)]
    return [
        *([f"{workers_live(st)}."] if st.live_workers_total else []),
        "No live worker can serve this job: it needs Hermes' model (a Hermes process, or a "
        "hermes-bulk worker with HERMES_HOME set to the profile it was created in).",
        f"Process it with: {hints.process(j, 'run', cmd)}",
    ]


def _awaiting_recovery_cli(st: JobStatus) -> list[str]:
    """In a shell, `run` alone changes nothing while no worker is alive: say what is missing."""
    j, live = st.job, count(st.live_workers, "live worker")
    if st.live_workers:  # workers are alive: the job was cut off and waits for someone to run it
        return [
            f"The job's workers stopped before it finished; it waits to be run again ({live} now).",
            f"Continue with: hermes-bulk run {j.job_id}",
        ]
    cut_off = j.state != RUNNING or (j.last_claim_at or 0) >= (j.run_at or 0)
    if not cut_off:  # run, but no worker has taken an item since: a worker is all it needs
        return [worker_wanted(st, hints.CLI)]
    lines = [
        f"{workers_live(st)}. Items that were in progress when its workers stopped go back to "
        "the queue and are sent again only when the job runs.",
        f"Continue with: {worker_command(st, hints.CLI, f'run {j.job_id} --wait')}, or start "
        f"{worker_command(st, hints.CLI)} and then: hermes-bulk run {j.job_id}",
    ]
    if st.interrupted == INTERRUPTED_WORKER_STOP and j.state == RUNNING:
        lines.append(
            "Its worker stopped gracefully: hermes-bulk worker --resume-interrupted continues it "
            "by itself."
        )
    return lines
