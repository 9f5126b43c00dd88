"""What `status` says of the workers that are live when none serves the job, and what `workers`
says each serves (issue 46): pure functions of the registry's entries (fleet/liveness.py) and
the job, worded by frontends/views/workers.py. The process test is in test_who_serves_a_job.py."""

from __future__ import annotations

import dataclasses
import io

from hermes_bulk.config.provider import ANTHROPIC, OPENAI
from hermes_bulk.fleet import endpoints
from hermes_bulk.fleet.liveness import Unserved, offer, serves_record, unserved_because
from hermes_bulk.frontends import views
from hermes_bulk.frontends.terminal import fit_to_width, rich_table
from hermes_bulk.jobs import hints
from hermes_bulk.jobs.service import JobStatus
from hermes_bulk.store.records import JobRecord, WorkerInfo

from .fleet.test_serving_rules import WORKERS, made_for, registry_entry

URL = "http://models.example:8000/v1"
OTHER = "http://127.0.0.1:18804/v1"


def entry(worker_id: str, serves: str, *, threads: int = 4, held=()) -> WorkerInfo:
    return WorkerInfo(
        worker_id,
        worker_id.split(":")[0],
        int(worker_id.split(":")[1]),
        0.0,
        99.0,
        threads,
        serves,
        holding=list(held),
    )


def status(job: JobRecord, workers: list[WorkerInfo], here=(URL, OPENAI)) -> JobStatus:
    """A job no worker serves, with these live workers (as Jobs._status builds it)."""
    unserved = []
    for w in workers:
        reason = unserved_because(w, job)
        assert reason is not None, "every worker here leaves the job"
        unserved.append(Unserved(w, reason, offer(w)))
    return JobStatus(
        job=job,
        state="waiting_for_worker",
        rate_limit=None,
        live_workers=0,
        live_workers_total=len(workers),
        unserved=unserved,
        here=here,
    )


def said(url: str, protocol: str = OPENAI, *, only: str | None = None, batches=True) -> str:
    """The serves record of a worker of another endpoint than the job's, saying so."""
    kinds, own, old = WORKERS["other url"]
    routes = endpoints.worker_routes(kinds, own, old)
    return serves_record(routes, only, endpoint=url, protocol=protocol, batches=batches)


JOB = made_for()
J = JOB.spec.job_id


def test_no_worker_live_names_the_command_for_this_shell():
    line = views.worker_wanted(status(JOB, []), hints.CLI)
    assert line == (
        "No worker is live; start one for this job's endpoint: hermes-bulk worker, or process "
        f"it here: hermes-bulk run {J} --wait"
    )


def test_a_worker_of_another_endpoint_is_named_with_what_it_serves():
    st = status(JOB, [entry("box:1:aa", said(OTHER))])
    assert views.worker_wanted(st, hints.CLI) == (
        f"1 worker is live but serves {OTHER}; start one for this job's endpoint: hermes-bulk "
        f"worker, or process it here: hermes-bulk run {J} --wait"
    )
    # The neighbour: this shell is set for the other endpoint; the command sets the job's.
    st = status(JOB, [entry("box:1:aa", said(OTHER))], here=(OTHER, OPENAI))
    assert views.worker_wanted(st, hints.CLI) == (
        f"1 worker is live but serves {OTHER}; start one for this job's endpoint: "
        f"HERMES_BULK_BASE_URL={URL} hermes-bulk worker, or process it here: "
        f"HERMES_BULK_BASE_URL={URL} hermes-bulk run {J} --wait"
    )
    # Another protocol here too: the command sets it (the key is never shown).
    st = status(JOB, [entry("box:1:aa", said(OTHER))], here=(OTHER, ANTHROPIC))
    assert (
        f"HERMES_BULK_PROVIDER=openai HERMES_BULK_BASE_URL={URL} hermes-bulk worker"
        in views.worker_wanted(st, hints.CLI)
    )


def test_several_workers_are_grouped_by_what_they_serve():
    other_job = "0123456789ab"
    workers = [
        entry("box:1:aa", said(OTHER)),
        entry("box:2:bb", said(OTHER)),
        entry("box:3:cc", said(URL, ANTHROPIC)),
        entry("box:4:dd", said(URL, OPENAI, only=other_job)),
    ]
    assert views.workers_live(status(JOB, workers)) == (
        f"4 workers are live but none serves this job: 2 serve {OTHER}, 1 serves {URL} "
        f"(anthropic), 1 serves job {other_job} alone (run --wait)"
    )
    # Two of one kind alone: the verb agrees with them.
    assert views.workers_live(status(JOB, workers[:2])) == (f"2 workers are live but serve {OTHER}")


def test_a_worker_that_does_not_say_its_endpoint_is_not_given_one():
    older = registry_entry("other url", said=False)  # routes, no words: the last vintage
    oldest = dataclasses.replace(older, serves="")  # before the serves record
    for w in (older, oldest):
        assert views.workers_live(status(JOB, [w])) == (
            "1 worker is live but serves another endpoint (an older hermes-bulk, which does not "
            "say which)"
        )


def test_a_batch_job_names_the_worker_that_runs_no_batches():
    batch = dataclasses.replace(JOB, spec=dataclasses.replace(JOB.spec, mode="batch"))
    w = registry_entry("same", batches=False)
    assert views.workers_live(status(batch, [w])) == (
        "1 worker is live but cannot run provider batches"
    )


def test_other_credentials_and_other_kinds_say_so():
    assert views.workers_live(status(JOB, [registry_entry("other key")])) == (
        "1 worker is live but serves this endpoint with another API key"
    )
    assert views.workers_live(status(JOB, [registry_entry("hermes only")])) == (
        "1 worker is live but serves only jobs created in Hermes"
    )


def test_a_masked_url_and_a_reply_in_hermes_say_what_to_set():
    masked = made_for(base_url=URL + "?api-key=secret-query-key")
    assert masked.spec.endpoint == URL + "?api-key=***"
    line = views.worker_wanted(status(masked, []), hints.CLI)
    assert line.endswith("(with the URL's key where *** stands)"), line
    # In Hermes there is no shell of the user's: both settings, and "in a shell".
    line = views.worker_wanted(status(JOB, []), hints.SLASH)
    assert line == (
        "No worker is live; start one for this job's endpoint: HERMES_BULK_PROVIDER=openai "
        f"HERMES_BULK_BASE_URL={URL} hermes-bulk worker, or in a shell: "
        f"HERMES_BULK_PROVIDER=openai HERMES_BULK_BASE_URL={URL} hermes-bulk run {J} --wait"
    )


def test_status_json_carries_the_workers_live_and_what_they_serve():
    job = dataclasses.replace(JOB, **{f: 0 for f in NUMBERS})
    workers = [entry("box:1:aa", said(OTHER)), registry_entry("other url", said=False)]
    shown = status(job, workers).as_dict()
    assert (shown["live_workers"], shown["live_workers_total"]) == (0, 2)
    assert shown["workers_elsewhere"] == [
        {
            "worker": "box:1:aa",
            "reason": "endpoint",
            "endpoint": OTHER,
            "protocol": "openai",
            "batches": True,
            "only_job": None,
        },
        {
            "worker": "w",
            "reason": "unsaid",
            "endpoint": None,
            "protocol": None,
            "batches": None,
            "only_job": None,
        },
    ]


#: The counts of a JobRecord (made_for leaves them None: the serving rules read none of them).
NUMBERS = [
    f.name
    for f in dataclasses.fields(JobRecord)
    if f.type == "int" and getattr(JOB, f.name) is None
]


def test_the_workers_table_says_what_each_serves_within_80_columns():
    azure = "https://my-resource.openai.azure.com/openai/v1"
    many = [("3f2a91c04b7e", i) for i in range(9)]
    workers = [
        entry("build-server-07.example.internal:41234:a1b2c3", said(OTHER), held=many),
        entry("box:2:bb", said(azure, batches=False)),
        entry("box:3:cc", said(URL, ANTHROPIC, only="0123456789ab")),
        entry("box:4:dd", serves_record(["hermes"], batches=False)),
        entry("box:5:ee", ""),
        dataclasses.replace(
            registry_entry("other url", said=False), worker_id="box:6:ff", host="box", pid=6
        ),
    ]
    table = views.workers_table(workers, 100.0, heartbeat_s=1.0)
    assert [row[0] for row in table.rows][:2] == [
        "build-server-07.example.internal pid 41234, 4 threads, up 100 s",
        "box pid 2, 4 threads, up 100 s",
    ]
    assert [row[2] for row in table.rows] == [
        f"{OTHER} (openai, batches)",
        f"{azure} (openai, no batches)",
        f"job 0123456789ab only: {URL} (anthropic, batches)",
        "jobs created in Hermes (Hermes' model)",
        "jobs with no endpoint recorded (an older hermes-bulk: it says no more)",
        "an endpoint it does not name (an older hermes-bulk)",
    ]
    assert table.rows[0][3] == "3f2a91c04b7e: #1, #2, #3, #4, #5, #6 … (9 in all)"
    assert table.rows[1][3] == "-"
    _fits_80_columns(table)
    _fits_80_columns(views.workers_table(workers[:2], 100.0, heartbeat_s=1.0))


def _fits_80_columns(table) -> None:
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=80, highlight=False, soft_wrap=True, markup=False).print(
        rich_table(fit_to_width(table, 80))
    )
    drawn = out.getvalue().splitlines()
    assert all(len(line) <= 80 for line in drawn), "\n".join(drawn)
    # The long words fold so that the short cells need not: rich, left to squeeze the table,
    # broke "last seen" and "1.0 s ago" over three lines each.
    assert any("last seen" in line for line in drawn), "\n".join(drawn)
    answering = [row for row in table.rows if row[1] == "1.0 s ago"]
    assert sum("1.0 s ago" in line for line in drawn) == len(answering), "\n".join(drawn)
    # Nothing is cut: each column, read down the table, holds every character of its cells (a
    # URL or a host longer than its column is folded over lines, never ended with "…").
    body = [line.split("│")[1:-1] for line in drawn if line.startswith("│")]
    for i in range(len(table.columns)):
        down = "".join(cells[i].strip() for cells in body).replace(" ", "")
        assert down == "".join(row[i].replace(" ", "") for row in table.rows), (
            table.columns[i].header,
            "\n".join(drawn),
        )
