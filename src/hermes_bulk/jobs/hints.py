"""Next steps that work from where they are shown.

Commands that make a job's items go to the model (`run`, `resume`, `retry`) depend on who can
call the job's model: a job made by `hermes-bulk create` calls the endpoint in HERMES_BULK_*,
so Hermes' `/bulk` does not process it; a job made by `/bulk` calls Hermes' model, which only a
Hermes process (or a worker in its profile) can. Every other command works on any job from
anywhere. `shown_in` is the command the user is typing: `hermes-bulk` or `/bulk`.
"""

from __future__ import annotations

from ..store.protocol import JobRecord

CLI = "hermes-bulk"
SLASH = "/bulk"
#: The command that processes jobs of each kind of model client (job.spec.client).
PROCESSED_BY = {"http": CLI, "hermes": SLASH}


def create(cmd: str) -> str:
    """How a job is created where `cmd` is typed: a shell spells the command out, /bulk has none."""
    return (
        f'{cmd} create "<instruction>" --over PATH'
        if cmd == CLI
        else f'{cmd} "<instruction>" --over PATH'
    )


def process(job: JobRecord, verb: str, shown_in: str, args: str = "") -> str:
    """`run`, `resume` or `retry` of this job, as a command that works for the user reading it."""
    by = PROCESSED_BY.get(job.spec.client, CLI)
    tail = f" {args}" if args else ""
    if by == shown_in:
        return f"{by} {verb} {job.job_id}{tail}"
    if by == CLI:  # shown in Hermes: the work runs where HERMES_BULK_* reaches its endpoint
        return (
            f"{CLI} {verb} {job.job_id}{tail} --wait (in a shell, or keep a hermes-bulk "
            "worker running)"
        )
    return f"{SLASH} {verb} {job.job_id}{tail} (in Hermes, in the profile the job was created in)"
