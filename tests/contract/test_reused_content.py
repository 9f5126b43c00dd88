"""Contents of items completed at create by reuse, on both backends: where the job
drops a completed item's content, a reused item's content is never stored; an item that still
needs those bytes (pending, waiting, failed) has them; CSV/JSON jobs and jobs that do not reuse
keep every content; retry, show and export work on such a job."""

from __future__ import annotations

import csv
import io
import json

import pytest

from hermes_bulk.config.settings import load_settings
from hermes_bulk.fleet import broker
from hermes_bulk.frontends import views
from hermes_bulk.jobs.request import JobRequest
from hermes_bulk.jobs.service import Jobs
from hermes_bulk.runtime.worker import WorkerRuntime
from hermes_bulk.sources import content_hash
from hermes_bulk.store.protocol import (
    COMPLETED,
    LEARN_AFTER,
    NOT_STARTED,
    PENDING,
    RUNNING,
    WAITING,
    Claim,
    ItemError,
    JobSpec,
    NewItem,
    Usage,
)

from .test_store_content import LONG, _stored, raw_client  # noqa: F401 (fixture)
from .test_store_contract import backend, backend_url, claim, store  # noqa: F401 (fixtures)

_jobs = iter(range(10**6))


def _begin(store, *, kind="directory", **spec_kw) -> str:
    job_id = f"rc{next(_jobs):04d}{abs(hash((kind, str(spec_kw)))) % 10**6:06d}"
    store.begin_job(
        JobSpec(
            job_id=job_id,
            instruction="do it",
            source="/nowhere",
            source_kind=kind,
            concurrency=1000,
            retries=2,
            provider_key="p:test",
            **spec_kw,
        )
    )
    return job_id


def _items(contents, start=0) -> list[NewItem]:
    """Items keyed as create keys them: the same content, the same answer key, in every job."""
    return [
        NewItem(
            start + i,
            f"item-{start + i}",
            c,
            content_hash(c),
            f"f{start + i}.txt",
            -1,
            "1:1",
            10,
            answer_key=content_hash(c)[3:],
        )
        for i, c in enumerate(contents)
    ]


def _start(store, job_id) -> None:
    store.finish_job(job_id)
    store.set_state(job_id, RUNNING, from_states=[NOT_STARTED])


def _answered(store, contents, *, kind="directory") -> str:
    """A job that answered every one of contents (its answers are in the store's index)."""
    job_id = _begin(store, kind=kind)
    store.add_items(job_id, _items(contents))
    _start(store, job_id)
    for i in range(len(contents)):
        c = claim(store, job_id, hint=i)
        assert store.complete_item(
            job_id, c.index, "w1", f"answer to {c.content[:10]}", Usage(5, 5)
        )
    return job_id


def _content_stored(store, raw, url, job_id, text) -> bool:
    return _stored(store, raw, url, job_id, "contents", content_hash(text)) is not None


# The store ------------------------------------------------------------------------------------


def test_a_reused_file_items_content_is_never_stored_and_its_hash_kept(
    store,
    raw_client,
    backend_url,
):
    _answered(store, [LONG, "second"])
    job_id = _begin(store)
    store.add_items(job_id, _items([LONG, "second", "new one"]))
    _start(store, job_id)
    for index, text in ((0, LONG), (1, "second")):
        detail = store.get_item(job_id, index)
        assert (detail.item.status, detail.content, detail.content_hash) == (
            COMPLETED,
            None,
            content_hash(text),
        )
        assert detail.item.reused_from is not None and detail.item.result.startswith("answer to")
        assert not _content_stored(store, raw_client, backend_url, job_id, text)
    assert [i.content for i in store.iter_items(job_id, with_content=True)] == [
        None,
        None,
        "new one",
    ]
    assert claim(store, job_id, hint=2).content == "new one", "the item to run has its content"
    assert _content_stored(store, raw_client, backend_url, job_id, "new one")
    assert store.get_job(job_id).reused == 2


def test_items_that_still_need_a_reused_content_keep_it_until_they_complete(
    store,
    raw_client,
    backend_url,
):
    """An earlier batch's pending item and its duplicate, then the answer appears (another job
    answers it while this one is being created), and a later batch's item with that content is
    reused: the bytes stay for the pending item, and go when it completes."""
    job_id = _begin(store)
    store.add_items(job_id, _items([LONG, LONG]))  # item 1 waits on item 0
    _answered(store, [LONG])
    store.add_items(job_id, _items([LONG], start=2))
    _start(store, job_id)
    assert [i.status for i in store.iter_items(job_id)] == [PENDING, WAITING, COMPLETED]
    assert store.get_item(job_id, 2).item.reused_from is not None
    assert _content_stored(store, raw_client, backend_url, job_id, LONG)
    c = claim(store, job_id, hint=0)
    assert (c.index, c.content) == (0, LONG)
    assert store.complete_item(job_id, 0, "w1", "asked here", Usage(1, 1))
    assert [i.status for i in store.iter_items(job_id)] == [COMPLETED] * 3
    assert not _content_stored(store, raw_client, backend_url, job_id, LONG), (
        "dropped once nothing needs it"
    )


def test_a_later_batch_that_asks_again_stores_the_content_itself(store):
    """A reused item stored nothing; the answer's job is deleted before the next batch, whose
    item with that content is asked again: it stores the bytes, and a claim gets them."""
    answered = _answered(store, [LONG])
    job_id = _begin(store)
    store.add_items(job_id, _items([LONG]))
    store.delete_job(answered)
    store.add_items(job_id, _items([LONG], start=1))
    _start(store, job_id)
    assert [i.status for i in store.iter_items(job_id)] == [COMPLETED, PENDING]
    assert claim(store, job_id, hint=1).content == LONG


def test_a_failed_item_beside_reused_ones_keeps_its_content_for_retry(store):
    _answered(store, ["answered"])
    job_id = _begin(store)
    store.add_items(job_id, _items(["answered", LONG]))
    _start(store, job_id)
    c = claim(store, job_id, hint=1)
    assert store.fail_item(job_id, c.index, "w1", ItemError("PermanentError", "no"))
    assert store.retry_failed(job_id) == 1, "the reused item is never failed, so never retried"
    assert claim(store, job_id, hint=1).content == LONG


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_a_record_jobs_reused_items_keep_their_content(store, raw_client, backend_url, kind):
    """export --with-input writes a row or record back from the store."""
    _answered(store, [LONG, "b"], kind=kind)
    job_id = _begin(store, kind=kind)
    store.add_items(job_id, _items([LONG, "b"]))
    _start(store, job_id)
    assert store.get_job(job_id).reused == 2
    assert [i.content for i in store.iter_items(job_id, with_content=True)] == [LONG, "b"]
    assert store.get_item(job_id, 0).content == LONG
    assert _content_stored(store, raw_client, backend_url, job_id, LONG)


def test_a_job_that_does_not_reuse_stores_every_content(store, raw_client, backend_url):
    _answered(store, [LONG])
    job_id = _begin(store, reuse=False)
    store.add_items(job_id, _items([LONG, "b"]))
    _start(store, job_id)
    assert store.get_job(job_id).reused == 0
    assert _content_stored(store, raw_client, backend_url, job_id, LONG)
    assert claim(store, job_id, hint=0).content == LONG


# Through the service: create, retry, show, export ---------------------------------------------


@pytest.fixture
def jobs(backend_url, env, monkeypatch):
    """The service (what the CLI and /bulk call) on each backend."""
    if not backend_url.startswith("sqlite"):
        monkeypatch.setenv("HERMES_BULK_BACKEND", backend_url)
    yield Jobs(load_settings())
    broker.close_all()


def _answer_all(jobs, job_id: str) -> None:
    job_store = jobs.store
    job_store.set_state(job_id, RUNNING, from_states=[NOT_STARTED])
    while True:
        c = claim(job_store, job_id)
        if not isinstance(c, Claim):
            return
        assert job_store.complete_item(job_id, c.index, "w1", f"summary of {c.name}", Usage(5, 5))


def _export(jobs, job_id: str, fmt: str, *, with_input: bool = False) -> str:
    out = io.StringIO()
    jobs.export_to_stream(job_id, out, fmt=fmt, with_input=with_input)
    return out.getvalue()


def _work(jobs, job_id: str) -> None:
    """Process the job's pending items in this process, as a worker does (the loopback provider
    answers), with the source-change check."""
    runtime = WorkerRuntime(jobs.backend, jobs.settings, threads=1)
    try:
        runtime.handle_trigger(job_id, 0)
    finally:
        runtime.stop()


def test_a_rerun_over_a_folder_drops_the_reused_contents_and_retry_show_export_work(
    jobs, tmp_path, fake_provider
):
    folder = tmp_path / "reports"
    folder.mkdir()
    for i in range(3):
        (folder / f"r{i}.txt").write_text(f"report number {i}\n")
    first = jobs.create(JobRequest(instruction="Summarise", over=str(folder))).job
    _answer_all(jobs, first.job_id)
    (folder / "r3.txt").write_text("a new report\n")

    job = jobs.create(JobRequest(instruction="Summarise", over=str(folder))).job
    assert (job.total, job.reused, job.pending) == (4, 3, 1)
    job_store = jobs.store
    reused = job_store.get_item(job.job_id, 0)
    assert (reused.item.status, reused.content, reused.content_hash) == (
        COMPLETED,
        None,
        content_hash("report number 0\n"),
    )
    assert job_store.get_item(job.job_id, 3).content == "a new report\n"

    shown = jobs.item(job.job_id, "r0.txt")
    assert shown.messages == [], "nothing to frame: the content is not kept"
    text = views.show_text(shown)
    assert f"the file is r0.txt in {folder}" in text and "summary of r0.txt" in text

    # The change check reads the sources of the items it runs, never of the reused ones.
    (folder / "r1.txt").write_text("report number 1, edited\n")
    (folder / "r3.txt").write_text("a new report, edited\n")
    jobs.run(job.job_id)
    _work(jobs, job.job_id)
    failed = job_store.get_item(job.job_id, 3).item
    assert (failed.status, failed.error_type) == ("failed", "SourceChanged")
    assert job_store.get_item(job.job_id, 1).item.result == "summary of r1.txt", (
        "a reused item is never re-read"
    )
    (folder / "r3.txt").write_text("a new report\n")
    _, returned = jobs.retry(job.job_id)
    assert returned == 1
    _work(jobs, job.job_id)
    assert len(fake_provider.requests) == 1, "only the retried item was asked"
    assert jobs.store.get_job(job.job_id).completed == 4

    rows = [
        json.loads(line)
        for line in _export(jobs, job.job_id, "jsonl", with_input=True).splitlines()
    ]
    assert [(r["item"], r["path"], r["status"]) for r in rows] == [
        (f"r{i}.txt", f"r{i}.txt", "completed") for i in range(4)
    ]
    assert [r["result"] for r in rows[:3]] == [f"summary of r{i}.txt" for i in range(3)] and rows[
        3
    ]["result"]
    assert [r.get("reused_from", {}).get("job_id") for r in rows] == [first.job_id] * 3 + [None]
    table = list(csv.reader(io.StringIO(_export(jobs, job.job_id, "csv", with_input=True))))
    assert table[0][0] == "path" and [r[0] for r in table[1:]] == [f"r{i}.txt" for i in range(4)]
    assert len(list(csv.reader(io.StringIO(_export(jobs, job.job_id, "csv"))))) == 5
    md = _export(jobs, job.job_id, "md")
    assert all(f"summary of r{i}.txt" in md for i in range(3)) and rows[3]["result"] in md

    again = jobs.create(JobRequest(instruction="Summarise", over=str(folder))).job
    assert again.reused == 3, "the kept hashes still find the answers (r1.txt was edited since)"


def test_a_rerun_over_a_csv_keeps_the_rows_for_export_with_input(jobs, tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("text,n\nhello,1\nworld,2\n")
    _answer_all(jobs, jobs.create(JobRequest(instruction="Classify", over=str(path))).job.job_id)
    job = jobs.create(JobRequest(instruction="Classify", over=str(path))).job
    assert (job.reused, job.pending) == (2, 0)
    assert json.loads(jobs.item(job.job_id, "row:1").detail.content) == {"text": "hello", "n": "1"}
    table = list(csv.reader(io.StringIO(_export(jobs, job.job_id, "csv", with_input=True))))
    assert [r[:2] for r in table] == [["text", "n"], ["hello", "1"], ["world", "2"]]


def test_the_learned_allowance_counts_only_the_items_this_job_asked_for(store):
    """Reused answers cost this job nothing: they are not among the completed items whose mean
    output it learns from (three answered here at 100 tokens out: twice the mean is 200)."""
    earlier = ["one", "two", "three"]
    _answered(store, earlier)
    job_id = _begin(store, max_output_tokens=900)
    new = [f"new {i}" for i in range(LEARN_AFTER + 1)]
    store.add_items(
        job_id,
        [
            NewItem(
                i,
                f"item-{i}",
                c,
                content_hash(c),
                f"f{i}.txt",
                -1,
                "1:1",
                600,
                answer_key=content_hash(c)[3:],
            )
            for i, c in enumerate(earlier + new)
        ],
    )
    _start(store, job_id)
    assert store.get_job(job_id).reused == len(earlier)
    for _ in range(LEARN_AFTER):
        c = claim(store, job_id)
        assert store.complete_item(job_id, c.index, "w1", "answer", Usage(50, 100))
    claim(store, job_id)
    job = store.get_job(job_id)
    assert (job.output_allowance, job.tokens_reserved) == (200, 600), "claims reserve the 600"
