"""The one service API: create, run, status, pause, resume, retry, export, list, delete.

The CLI and the `/bulk` command both call `Jobs` and nothing below it, so they behave the same.
Functions take and return plain records; rendering is `frontends/views.py`'s job. `Jobs` is the
front door; the work is in the modules of each concept: creating.py (create and its dry-run plan),
life.py (run, pause, resume, retry, delete), status.py (status and the records it shows).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from ..config.fields import env_name
from ..errors import InputError, JobNotFound, NoDatabase, UsageError
from ..fleet.broker import Backend, missing_database, open_backend
from ..fleet.liveness import Liveness
from ..providers.pacing import OpenGate, RequestGate
from ..store.protocol import ItemRecord, JobRecord, JobStore
from ..store.sqlite.database import is_open_sqlite_file
from . import hints, prompt
from .status import (
    STATES,
    ItemShown,
    JobStatus,
    derive_state,
    job_status,
    next_poll,
    shown_batches,
    state_label,
)

if TYPE_CHECKING:
    from ..config.settings import Settings
    from .creating import Created, Plan, item_answer_key
    from .request import JobRequest

#: The names front ends and tests take from the service API, wherever they are defined.
__all__ = [
    "STATES",
    "BatchCanceller",
    "Created",
    "ItemShown",
    "JobStatus",
    "Jobs",
    "Plan",
    "derive_state",
    "item_answer_key",
    "missing_database",
    "next_poll",
    "shown_batches",
    "state_label",
]

# creating, life and export are imported where used: `list` and `status` start without them
# (docs/benchmarks.md, row 7); their names above are looked up on first use (__getattr__).

#: The names this module offers from creating.py, loaded with it.
_FROM_CREATING = ("Created", "Plan", "item_answer_key")


def __getattr__(name: str):
    if name not in _FROM_CREATING:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import creating

    return getattr(creating, name)


#: Cancels a batch job's open batches at the provider before it is deleted; raises
#: InvalidTransition, naming them, when the provider cannot be asked.
BatchCanceller = Callable[["Jobs", JobRecord], None]


class Jobs:
    """Job operations over one backend.

    `cmd` and `setting_name` are how messages name commands and settings to the user:
    `hermes-bulk` and HERMES_BULK_* on the command line, `/bulk` and config.yaml keys in Hermes.
    """

    def __init__(
        self,
        settings: Settings,
        backend: Backend | None = None,
        request_gate: RequestGate | None = None,
        *,
        cmd: str = "hermes-bulk",
        setting_name: Callable[[str], str] = env_name,
        cancel_batches: BatchCanceller | None = None,
    ) -> None:
        self.settings = settings
        #: How `delete` cancels a batch job's open batches at the provider. The jobs API speaks to
        #: no provider: a front end that can reach one hands in runtime.batch_driver's.
        self.cancel_batches = cancel_batches
        self.cmd, self.setting_name = cmd, setting_name
        # A SQLite file that is not there yet is made by the first command that writes (create);
        # until then reads answer from nothing, so a mistyped path or a fresh machine keeps no file.
        if backend is None and missing_database(settings) is None:
            backend = open_backend(settings)
        self._backend = backend
        self.request_gate = request_gate or OpenGate()
        #: max_concurrency in force where a job's items run: the settings here, unless the host
        #: knows better (a worker running in Hermes keeps the settings it started with).
        self.max_concurrency_for: Callable[[JobRecord], int] = lambda job: settings.max_concurrency

    @property
    def backend(self) -> Backend:
        """The backend, opened (and a missing SQLite file made) on first use: only a command that
        writes gets here without a database; reads check `_no_database` first."""
        if self._backend is None:
            self._backend = open_backend(self.settings)
        return self._backend

    @property
    def store(self) -> JobStore:
        return self.backend.store

    @functools.cached_property
    def liveness(self) -> Liveness:
        return Liveness(self.store, self.settings.home / "workers")

    def _no_database(self) -> bool:
        """True when there is no database to read (nothing is made); NoDatabase when the user
        named one that is not there: a typo in the setting, which an empty answer would hide."""
        if self._backend is not None or (path := missing_database(self.settings)) is None:
            return False
        if self.settings.backend:
            raise NoDatabase(
                f"There is no hermes-bulk database at {path}; check "
                f"{self.setting_name('backend')}, "
                f"or create a job there first: {hints.create(self.cmd)}"
            )
        return True

    # Creating ------------------------------------------------------------------------------
    def create(
        self,
        request: JobRequest,
        *,
        on_progress: Callable[[int], None] | None = None,
        dry_run: bool = False,
    ) -> Created | Plan:
        """Discover the request's items and record them; makes no model calls. Bad input creates
        nothing. on_progress is told the items found so far. With dry_run, only discover them:
        the Plan (first request, count, estimate), nothing written (jobs/creating.py)."""
        from . import creating

        return creating.create(self, request, on_progress=on_progress, dry_run=dry_run)

    # Reading -------------------------------------------------------------------------------
    def resolve(self, job_ref: str | None) -> str:
        """A job id from an id or a unique prefix of one; the newest job when job_ref is None.

        Only None (no argument at all: `status`) means the newest job. An empty or blank id is a
        mistake (a variable that was not set), never a prefix of every id: `delete ""` must not
        delete whatever job happens to be newest.
        """
        if job_ref is not None and not job_ref.strip():
            raise UsageError(
                f"The job id is empty; give a job id or a unique prefix of one. "
                f"List jobs with: {self.cmd} list"
            )
        no_database = self._no_database()
        if job_ref is None or no_database:
            jobs = [] if no_database else self.store.list_jobs(1)
            if not jobs:
                raise JobNotFound(
                    f"There are no jobs yet. Create one with: {hints.create(self.cmd)}"
                )
            return jobs[0].job_id
        if self.store.get_job(job_ref):
            return job_ref
        matches = self.store.find_job_ids(job_ref)
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise JobNotFound(f"No job {job_ref!r}. List jobs with: {self.cmd} list")
        raise JobNotFound(
            f"{job_ref!r} matches several jobs ({', '.join(matches[:5])}); give more of the id."
        )

    def get(self, job_ref: str | None) -> JobRecord:
        job_id = self.resolve(job_ref)  # first: with no database it raises before one is opened
        job = self.store.get_job(job_id)
        if job is None:
            raise JobNotFound(f"No job {job_ref!r}.")
        return job

    def status(self, job_ref: str | None, *, events: int = 0) -> JobStatus:
        job = self.get(job_ref)
        return job_status(self, job, self.liveness.live_workers(), events)

    def item(self, job_ref: str | None, item_ref: str) -> ItemShown:
        """One item by its exact name or its number (1-based, the order of the export)."""
        job = self.get(job_ref)
        index = self.store.find_item(job.job_id, item_ref)
        if index is None and item_ref.strip().isdigit() and 1 <= int(item_ref) <= job.total:
            index = int(item_ref) - 1
        detail = self.store.get_item(job.job_id, index) if index is not None else None
        if detail is None:
            raise InputError(
                f"Job {job.job_id} has no item {item_ref!r}; give an item's name as the export "
                "shows it (a relative path, row:N, record:N or line:N) or its number, "
                f"1 to {job.total}."
            )
        # A completed file item's content is not kept (store/protocol.py drops_content): nothing
        # to frame.
        messages = (
            []
            if detail.content is None
            else prompt.item_messages(
                job.spec, detail.item.name, detail.content, detail.content_hash
            )
        )
        return ItemShown(
            job=job,
            detail=detail,
            messages=messages,
            attempts=self.store.list_events(job.job_id, item=detail.item.index),
        )

    def failed_items(self, job_id: str, limit: int) -> list[ItemRecord]:
        """The first `limit` failed items in index order (the store reads no other item)."""
        return self.store.failed_items(job_id, limit)

    def list(self, limit: int = 20) -> list[JobStatus]:
        if self._no_database():
            return []
        workers = self.liveness.live_workers()
        return [job_status(self, job, workers) for job in self.store.list_jobs(limit)]

    def job_dir(self, job_id: str) -> Path:
        return self.settings.jobs_dir / job_id

    # Changing state (jobs/life.py) ----------------------------------------------------------
    def run(
        self,
        job_ref: str | None,
        *,
        concurrency: int | None = None,
        rpm: int | None = None,
        tpm: int | None = None,
        sample: int | None = None,
    ) -> JobRecord:
        """Continue a job (life.run): concurrency, rpm, tpm recorded on it first; sample: run
        only that many pending items, spread over the job, then pause it."""
        from . import life

        return life.run(self, job_ref, concurrency=concurrency, rpm=rpm, tpm=tpm, sample=sample)

    def pause(self, job_ref: str | None) -> JobRecord:
        from . import life

        return life.pause(self, job_ref)

    def resume(
        self,
        job_ref: str | None,
        *,
        max_tokens: int | None = None,
        max_cost: int | None = None,
        concurrency: int | None = None,
        rpm: int | None = None,
        tpm: int | None = None,
    ) -> JobRecord:
        """max_cost: --max-cost in nano-USD."""
        from . import life

        return life.resume(
            self,
            job_ref,
            max_tokens=max_tokens,
            max_cost=max_cost,
            concurrency=concurrency,
            rpm=rpm,
            tpm=tpm,
        )

    def retry(self, job_ref: str | None) -> tuple[JobRecord, int]:
        """Failed items back to the queue; processing starts at once unless the job is paused."""
        from . import life

        return life.retry(self, job_ref)

    def delete(self, job_ref: str, *, abandon_batches: bool = False) -> str:
        """Remove the job; a batch job's open batches are cancelled at the provider first
        (life.delete)."""
        from . import life

        return life.delete(self, job_ref, abandon_batches=abandon_batches)

    # Results -------------------------------------------------------------------------------
    def export(
        self,
        job_ref: str | None,
        *,
        fmt: str = "md",
        output: str | None = None,
        with_input: bool = False,
        only: str | None = None,
        column: str | None = None,
    ) -> Path:
        """Write the export to output (a regular file, or a new name in an existing folder), by
        default in the job's folder under its variant's name (export.default_name); returns the
        path written."""
        from . import export as export_mod

        job = self.get(job_ref)
        if output is not None and not output.strip():
            raise UsageError("--output is empty; give a file name (or - for standard output).")
        if output:
            target = Path(output).expanduser()
            if is_open_sqlite_file(
                target
            ):  # replacing it would take the database from under every process
                raise InputError(
                    f"--output {output}: a hermes-bulk database in use; choose another --output."
                )
            # A file the user names keeps the mode it had; a new one, and all under the data
            # directory, is owner-only.
            inside = (
                Path(os.path.realpath(self.settings.home)) in Path(os.path.realpath(target)).parents
            )
            export_mod.export(
                self.store,
                job,
                fmt,
                target,
                private=inside,
                with_input=with_input,
                only=only,
                column=column,
            )
            return target
        target = self.job_dir(job.job_id) / export_mod.default_name(
            fmt, only=only, with_input=with_input
        )
        export_mod.export(
            self.store,
            job,
            fmt,
            target,
            make_folder=True,
            with_input=with_input,
            only=only,
            column=column,
        )
        return target

    def export_to_stream(
        self,
        job_ref: str | None,
        stream: TextIO,
        *,
        fmt: str = "md",
        with_input: bool = False,
        only: str | None = None,
        column: str | None = None,
    ) -> None:
        """The export written to stream (`--output -`)."""
        from . import export as export_mod

        export_mod.export_to_stream(
            self.store,
            self.get(job_ref),
            fmt,
            stream,
            with_input=with_input,
            only=only,
            column=column,
        )
