"""`/bulk` refuses an empty or blank job id as the CLI does.

The handler's text is checked directly (no gateway needed): the refusal comes before any job is
looked at, and the jobs made here are in the same data directory the handler opens.
"""

from __future__ import annotations

import os
import stat

import pytest

from hermes_bulk.config.settings import load_settings
from hermes_bulk.fleet import broker
from hermes_bulk.jobs.request import JobRequest
from hermes_bulk.jobs.service import Jobs
from hermes_bulk.plugin import bulk

COMMANDS = ["run", "status", "pause", "resume", "retry", "export", "events", "delete"]


@pytest.fixture
def plugin_jobs(env, tmp_path, monkeypatch):
    """Two jobs in the data directory /bulk uses (HERMES_BULK_HOME wins over the profile's)."""
    hermes_home = tmp_path / "hermes-home"
    hermes_home.mkdir()
    monkeypatch.setenv("HERMES_HOME", str(hermes_home))
    jobs = Jobs(load_settings())
    ids = []
    for name in ("older", "newer"):
        src = tmp_path / f"{name}.txt"
        src.write_text(name)
        ids.append(jobs.create(JobRequest(instruction="Do", over=str(src))).job.job_id)
    yield jobs, ids
    broker.close_all()


@pytest.mark.parametrize("blank", ['""', "''", '"   "'], ids=["empty", "single-quoted", "spaces"])
@pytest.mark.parametrize("command", COMMANDS)
def test_bulk_refuses_a_blank_job_id(plugin_jobs, command, blank):
    jobs, ids = plugin_jobs
    before = [jobs.store.get_job(i) for i in ids]
    reply = bulk.answer(f"{command} {blank}")
    assert "job id is empty" in reply, reply
    assert "unexpected error" not in reply
    assert [jobs.store.get_job(i) for i in ids] == before, "no job was touched"


def test_bulk_status_without_an_argument_lists_recent_jobs(plugin_jobs):
    _, ids = plugin_jobs
    reply = bulk.answer("status")
    assert all(i in reply for i in ids), reply


def test_bulk_export_writes_only_a_regular_file(plugin_jobs, tmp_path):
    """/bulk has no standard output of its own (the gateway's is JSON-RPC), and refuses a FIFO."""
    _, ids = plugin_jobs
    assert bulk.answer(f"export {ids[0]} --output -") == (
        "/bulk export cannot write to standard output; give a file name as --output."
    )
    fifo = tmp_path / "pipe.md"
    os.mkfifo(fifo)
    reply = bulk.answer(f"export {ids[0]} --output {fifo}")
    assert "it is a FIFO (named pipe), not a regular file" in reply, reply
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
