"""What each export format holds, byte for byte, from a real SQLite store, in-process.

tests/test_export_output.py runs `hermes-bulk export` for the paths it may write; these tests
pin the content of every format (Markdown, CSV, JSONL, with and without the input, a --schema
job's columns, --only) and the atomic replacement, on items completed, failed, unfinished and
reused through the store's own operations.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import stat
from dataclasses import replace

import pytest

from hermes_bulk.errors import InputError, UsageError
from hermes_bulk.fleet import broker
from hermes_bulk.jobs import export
from hermes_bulk.store.protocol import (
    COMPLETED,
    FAILED,
    NOT_STARTED,
    RUNNING,
    ItemError,
    ItemRecord,
    JobSpec,
    NewItem,
    Usage,
)


@pytest.fixture
def store(tmp_path):
    backend = broker.build_backend(f"sqlite:///{tmp_path / 'bulk.db'}")
    yield backend.store
    backend.close()


def _job(
    store, job_id: str, contents: list[str], *, names=None, kind="directory", keys=None, **spec_kw
) -> str:
    store.begin_job(
        JobSpec(
            job_id=job_id,
            instruction="Summarise",
            source="/in",
            source_kind=kind,
            concurrency=10,
            retries=0,
            provider_key="p:test",
            **spec_kw,
        )
    )
    store.add_items(
        job_id,
        [
            NewItem(
                i,
                (names or [f"f{i}.txt" for i in range(len(contents))])[i],
                c,
                f"b2:{job_id}:{i}",
                f"f{i}.txt",
                -1,
                "1:1",
                10,
                answer_key=(keys or [""] * len(contents))[i],
            )
            for i, c in enumerate(contents)
        ],
    )
    store.finish_job(job_id)
    store.set_state(job_id, RUNNING, from_states=[NOT_STARTED])
    return job_id


def _complete(store, job_id, index, result, **kw):
    claim = store.claim_item(job_id, index, "w1", lease_s=30, max_running=100)
    assert claim.index == index
    assert store.complete_item(job_id, index, "w1", result, Usage(10, 5), **kw)


def _fail(store, job_id, index, error):
    claim = store.claim_item(job_id, index, "w1", lease_s=30, max_running=100)
    assert claim.index == index
    assert store.fail_item(job_id, index, "w1", error)


@pytest.fixture
def mixed(store):
    """Four items: a completed one whose name and answer start a formula, one failed with an
    HTTP status, one failed without, one never run."""
    job_id = _job(
        store, "mixed0001", ["a", "b", "c", "d"], names=["=a.txt", "b.txt", "c.txt", "d.txt"]
    )
    _complete(
        store,
        job_id,
        0,
        "-1 point\n\n",
        provider="http://user:hunter2pass@llm.example/v1",
        model="m1",
    )
    _fail(store, job_id, 1, ItemError("http_error", "bad request", 400))
    _fail(store, job_id, 3, ItemError("timeout", "", None))
    return job_id


def _stream(store, job_id, fmt, **kw) -> str:
    out = io.StringIO()
    export.export_to_stream(store, store.get_job(job_id), fmt, out, **kw)
    return out.getvalue()


def test_markdown_holds_the_job_and_every_item_in_order(store, mixed):
    assert _stream(store, mixed, "md") == (
        "# Bulk job mixed0001\n\n- Instruction: Summarise\n- Source: /in\n- Items: 1 completed, 2 "
        "failed, 1 unfinished, of 4\n\n## =a.txt\n\n-1 point\n\n## b.txt\n\n_Failed: http_error "
        "(HTTP 400): bad request_\n\n## c.txt\n\n_Not processed yet (pending)._\n\n## "
        "d.txt\n\n_Failed: timeout_\n\n"
    )


def test_the_unfinished_count_is_what_is_neither_completed_nor_failed(store):
    job_id = _job(store, "counts0001", ["a", "b", "c", "d", "e", "f"])
    _complete(store, job_id, 0, "x")
    _fail(store, job_id, 1, ItemError("timeout", "t"))
    _fail(store, job_id, 2, ItemError("timeout", "t"))
    assert "- Items: 1 completed, 2 failed, 3 unfinished, of 6\n" in _stream(store, job_id, "md")


def test_csv_neutralises_every_cell_and_describes_each_state(store, mixed):
    rows = list(csv.reader(io.StringIO(_stream(store, mixed, "csv"))))
    assert rows == [
        ["item", "status", "result", "error", "tokens_in", "tokens_out", "cost_usd"],
        ["'=a.txt", COMPLETED, "'-1 point\n\n", "", "10", "5", ""],
        ["b.txt", FAILED, "", "http_error (HTTP 400): bad request", "0", "0", ""],
        ["c.txt", "pending", "", "", "0", "0", ""],
        ["d.txt", FAILED, "", "timeout", "0", "0", ""],
    ]


def test_jsonl_holds_each_item_with_who_answered_and_masked_credentials(store, mixed):
    rows = [json.loads(line) for line in _stream(store, mixed, "jsonl").splitlines()]
    assert rows[0] == {
        "item": "=a.txt",
        "index": 0,
        "status": COMPLETED,
        "result": "-1 point\n\n",
        "error": None,
        "tokens_in": 10,
        "tokens_out": 5,
        "cost_usd": None,
        "provider": "http://user:***@llm.example/v1",
        "model": "m1",
    }
    assert rows[1] == {
        "item": "b.txt",
        "index": 1,
        "status": FAILED,
        "result": None,
        "error": "http_error (HTTP 400): bad request",
        "tokens_in": 0,
        "tokens_out": 0,
        "cost_usd": None,
        "provider": None,
        "model": None,
    }
    assert [r["status"] for r in rows] == [COMPLETED, FAILED, "pending", FAILED]
    assert rows[3]["error"] == "timeout" and rows[2]["error"] is None


def test_only_limits_the_items_and_refuses_other_states(store, mixed):
    completed = [
        json.loads(x)["item"] for x in _stream(store, mixed, "jsonl", only=COMPLETED).splitlines()
    ]
    failed = [
        json.loads(x)["item"] for x in _stream(store, mixed, "jsonl", only=FAILED).splitlines()
    ]
    assert (completed, failed) == (["=a.txt"], ["b.txt", "d.txt"])
    with pytest.raises(InputError, match="--only pending: use one of completed, failed"):
        _stream(store, mixed, "jsonl", only="pending")


def test_an_unknown_format_and_markdown_with_input_are_refused(store, mixed):
    with pytest.raises(InputError, match="--format xml: use one of md, csv, jsonl"):
        _stream(store, mixed, "xml")
    with pytest.raises(UsageError, match="--with-input needs --format csv or --format jsonl"):
        _stream(store, mixed, "md", with_input=True)


def test_a_schema_job_gets_a_column_per_field_and_its_data(store):
    schema = json.dumps({"type": "object", "properties": {"title": {}, "n": {}, "tags": {}}})
    job_id = _job(store, "schema0001", ["a", "b", "c", "d"], schema=schema)
    _complete(store, job_id, 0, json.dumps({"title": "=x", "n": 3, "tags": ["é"], "extra": 1}))
    _complete(store, job_id, 1, "not json")
    _complete(store, job_id, 2, json.dumps(["a", "list"]))
    _fail(store, job_id, 3, ItemError("invalid_answer", "off schema"))
    rows = list(csv.reader(io.StringIO(_stream(store, job_id, "csv"))))
    assert rows[0] == [
        "item",
        "status",
        "result",
        "error",
        "tokens_in",
        "tokens_out",
        "cost_usd",
        "title",
        "n",
        "tags",
    ]
    assert rows[1][7:] == ["'=x", "3", '["é"]']
    assert (
        rows[2][7:] == ["", "", ""] and rows[3][7:] == ["", "", ""] and rows[4][7:] == ["", "", ""]
    )
    lines = [json.loads(x) for x in _stream(store, job_id, "jsonl").splitlines()]
    assert lines[0]["data"] == {"title": "=x", "n": 3, "tags": ["é"], "extra": 1}
    assert [line["data"] for line in lines[1:]] == [None, None, None]
    assert '"é"' in _stream(store, job_id, "jsonl"), "non-ASCII text is written as itself"


def test_a_schema_without_properties_adds_no_column(store):
    job_id = _job(store, "schema0002", ["a"], schema=json.dumps({"type": "object"}))
    assert export.schema_fields(store.get_job(job_id)) == []
    assert _stream(store, job_id, "csv").splitlines()[0] == (
        "item,status,result,error,tokens_in,tokens_out,cost_usd"
    )


def test_a_csv_source_is_written_back_with_its_own_columns_first(store):
    rows = [{"=name": "=ann", "age": 30, "note": None}, {"=name": "bob", "age": 41, "note": "x"}]
    job_id = _job(
        store, "csvin0001", [json.dumps(r) for r in rows], kind="csv", names=["row:1", "row:2"]
    )
    _complete(store, job_id, 0, "ok")
    table = list(csv.reader(io.StringIO(_stream(store, job_id, "csv", with_input=True))))
    assert table == [  # the source's own names and cells as they were; the item column guarded
        [
            "=name",
            "age",
            "note",
            "item",
            "status",
            "result",
            "error",
            "tokens_in",
            "tokens_out",
            "cost_usd",
        ],
        ["=ann", "30", "", "row:1", COMPLETED, "ok", "", "10", "5", ""],
        ["bob", "41", "x", "row:2", "pending", "", "", "0", "0", ""],
    ]
    lines = [json.loads(x) for x in _stream(store, job_id, "jsonl", with_input=True).splitlines()]
    assert lines[0]["input"] == rows[0] and list(lines[0])[:2] == ["input", "item"]


def test_json_records_go_back_as_their_values_and_files_as_their_paths(store):
    job_id = _job(store, "jsonin001", ['{"a": [1, 2]}', "7", "1" * 5000], kind="jsonl")
    table = list(csv.reader(io.StringIO(_stream(store, job_id, "csv", with_input=True))))
    assert table[0] == [
        "input",
        "item",
        "status",
        "result",
        "error",
        "tokens_in",
        "tokens_out",
        "cost_usd",
    ]
    assert [r[0] for r in table[1:]] == ['{"a": [1, 2]}', "7", "1" * 5000]
    lines = [json.loads(x) for x in _stream(store, job_id, "jsonl", with_input=True).splitlines()]
    assert lines[0]["input"] == {"a": [1, 2]} and lines[1]["input"] == 7
    assert lines[2]["input"] == "1" * 5000, "past int()'s digit limit: the record as stored"
    files = _job(store, "filein001", ["text"], names=["=dir/a.txt"])
    table = list(csv.reader(io.StringIO(_stream(store, files, "csv", with_input=True))))
    assert table == [
        ["path", "item", "status", "result", "error", "tokens_in", "tokens_out", "cost_usd"],
        ["=dir/a.txt", "'=dir/a.txt", "pending", "", "", "0", "0", ""],  # the path: as it is
    ]
    line = json.loads(_stream(store, files, "jsonl", with_input=True))
    assert line["path"] == "=dir/a.txt" and "input" not in line


def test_each_row_says_what_its_item_was_billed_at_the_jobs_price(store):
    """tokens_in, tokens_out and cost_usd: the kept answer and the attempts not kept (a cut or
    invalid answer the provider billed), exactly in nano-USD; cost_usd needs a price."""
    price = {"input": 1.0, "output": 2.0, "cached_input": 1.0, "source": "test"}
    job_id = _job(store, "billed001", ["a", "b", "c"], price=price)
    store.claim_item(job_id, 0, "w1", lease_s=30, max_running=100)
    off = Usage(7, 3, cost_nusd=13_000, list_nusd=13_000)
    error = ItemError("InvalidAnswer", "off schema", 200)
    assert store.settle_failed_attempt(job_id, 0, "w1", error, retries=1, usage=off) == 1
    store.claim_item(job_id, 0, "w1", lease_s=30, max_running=100)
    assert store.complete_item(job_id, 0, "w1", "ok", Usage(10, 5, cost_nusd=1_000_000_020))
    store.claim_item(job_id, 1, "w1", lease_s=30, max_running=100)
    assert store.fail_item(job_id, 1, "w1", ItemError("Truncated", "cut", 200), usage=off)
    rows = list(csv.reader(io.StringIO(_stream(store, job_id, "csv"))))
    assert [r[4:7] for r in rows] == [
        ["tokens_in", "tokens_out", "cost_usd"],
        ["17", "8", "1.00001302"],
        ["7", "3", "0.000013"],
        ["0", "0", "0"],
    ]
    lines = [json.loads(x) for x in _stream(store, job_id, "jsonl").splitlines()]
    assert [(x["tokens_in"], x["tokens_out"], x["cost_usd"]) for x in lines] == [
        (17, 8, 1.00001302),
        (7, 3, 0.000013),
        (0, 0, 0.0),
    ]
    # With input too, the source's own cells come first, as they were.
    with_input = list(csv.reader(io.StringIO(_stream(store, job_id, "csv", with_input=True))))
    assert with_input[1][0] == "f0.txt" and with_input[1][5:8] == ["17", "8", "1.00001302"]


def test_a_reused_answer_says_where_it_came_from(store):
    first = _job(store, "reuse0001", ["other", "same"], keys=["k-other", "k-same"])
    _complete(store, first, 0, "the other answer")
    _complete(store, first, 1, "the answer")
    second = _job(store, "reuse0002", ["new", "same"], keys=["k-new", "k-same"])
    lines = [json.loads(x) for x in _stream(store, second, "jsonl").splitlines()]
    assert "reused_from" not in lines[0]
    assert lines[1]["reused_from"] == {"job_id": first, "item": 2}, (
        "numbered from 1, as users count"
    )
    assert lines[1]["result"] == "the answer"


def test_an_export_file_replaces_the_target_whole_and_is_owner_only(store, mixed, tmp_path):
    target = tmp_path / "out" / "report.md"
    with pytest.raises(InputError):  # a folder the user named must exist
        export.export(store, store.get_job(mixed), "md", target)
    assert not target.parent.exists()
    export.export(store, store.get_job(mixed), "md", target, make_folder=True)
    assert target.read_text() == _stream(store, mixed, "md")
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o700
    target.write_text("x" * 100_000)
    target.chmod(0o644)
    export.export(store, store.get_job(mixed), "md", target)
    assert target.read_text() == _stream(store, mixed, "md")
    assert stat.S_IMODE(target.stat().st_mode) == 0o600, (
        "inside the data directory: owner-only again"
    )
    assert [p.name for p in target.parent.iterdir()] == ["report.md"], "no temporary file is left"


def test_a_csv_file_starts_with_a_bom_and_other_files_do_not(store, mixed, tmp_path):
    export.export(store, store.get_job(mixed), "csv", tmp_path / "r.CSV")
    assert (tmp_path / "r.CSV").read_bytes().startswith(b"\xef\xbb\xbfitem,status")
    export.export(store, store.get_job(mixed), "jsonl", tmp_path / "r.jsonl")
    assert (tmp_path / "r.jsonl").read_bytes().startswith(b'{"item"')
    export.export(
        store, store.get_job(mixed), "csv", tmp_path / "report"
    )  # no suffix: not for Excel
    assert (tmp_path / "report").read_bytes().startswith(b"item,status")


def test_a_shared_export_keeps_the_mode_of_the_file_it_replaces(store, mixed, tmp_path):
    target = tmp_path / "shared.md"
    target.write_text("old")
    target.chmod(0o644)
    export.export(store, store.get_job(mixed), "md", target, private=False)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    new = tmp_path / "new.md"
    export.export(store, store.get_job(mixed), "md", new, private=False)
    assert stat.S_IMODE(new.stat().st_mode) == 0o600
    assert export.replaced_mode(tmp_path) == 0o600, "a directory's mode is not copied"


def test_a_failing_writer_leaves_the_old_file_and_no_temporary_one(store, mixed, tmp_path):
    target = tmp_path / "out" / "keep.md"
    target.parent.mkdir()
    target.write_text("old")

    class Broken(Exception):
        pass

    with pytest.raises(Broken), export.replace_atomically(target) as f:
        f.write("partial")
        raise Broken
    assert target.read_text() == "old"
    assert [p.name for p in target.parent.iterdir()] == ["keep.md"]


def test_a_full_disk_says_so_and_leaves_the_old_file(tmp_path):
    target = tmp_path / "out" / "keep.csv"
    target.parent.mkdir()
    target.write_text("old")
    with (
        pytest.raises(InputError, match="the disk is full there"),
        export.replace_atomically(target),
    ):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert target.read_text() == "old"
    assert [p.name for p in target.parent.iterdir()] == ["keep.csv"]
    with (
        pytest.raises(PermissionError),
        export.replace_atomically(target),
    ):  # any other error as it is
        raise PermissionError(errno.EACCES, "denied")
    assert [p.name for p in target.parent.iterdir()] == ["keep.csv"]


def test_a_target_whose_folder_cannot_be_made_is_refused_in_our_words(tmp_path):
    (tmp_path / "a-file").write_text("x")
    with (
        pytest.raises(InputError, match="choose another --output"),
        export.replace_atomically(tmp_path / "a-file" / "out.csv"),
    ):
        pass


def _record(status, result, index=0, error_type=None):
    return ItemRecord(
        index,
        f"n{index}",
        status,
        result,
        error_type,
        None,
        "m" if error_type else None,
        1,
        2,
        0,
        None,
        None,
    )


def test_records_are_written_by_their_state_whatever_store_they_come_from(store):
    """Records built from the status constants themselves, as any store may return them."""
    job = store.get_job(
        _job(store, "records01", ["a"], schema=json.dumps({"properties": {"t": {}}}))
    )
    items = [_record(COMPLETED, '{"t": "x"}', 0), _record(FAILED, None, 1, "timeout")]
    out = io.StringIO()
    export.write_jsonl(out, job, iter(items))
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [(x["result"], x["data"], x["error"]) for x in lines] == [
        ('{"t": "x"}', {"t": "x"}, None),
        (None, None, "timeout: m"),
    ]
    out = io.StringIO()
    export.write_csv(out, job, iter(items))
    rows = list(csv.reader(io.StringIO(out.getvalue())))
    assert rows[1] == ["n0", COMPLETED, '{"t": "x"}', "", "1", "2", "", "x"] and rows[2] == [
        "n1",
        FAILED,
        "",
        "timeout: m",
        "1",
        "2",
        "",
        "",
    ]


@pytest.mark.parametrize(
    ("answer", "cell"),
    [
        ("-10", "-10"),
        ("+3", "+3"),
        ("-0.5e3", "-0.5e3"),
        ("-.5", "-.5"),
        ("-10 stars", "'-10 stars"),
        ("=1+1", "'=1+1"),
        ("+3 apples", "'+3 apples"),
        ("@x", "'@x"),
        ("-", "'-"),
        ("1e", "1e"),
    ],
)
def test_a_numeric_answer_stays_a_number_and_any_other_formula_start_is_guarded(
    store, answer, cell
):
    job = store.get_job(
        _job(store, "numbers01", ["a"], schema=json.dumps({"properties": {"t": {}}}))
    )
    out = io.StringIO()
    export.write_csv(out, job, iter([_record(COMPLETED, json.dumps({"t": answer}), 0)]))
    row = list(csv.reader(io.StringIO(out.getvalue())))[1]
    assert row[7] == cell, "a schema field"
    out = io.StringIO()
    plain = store.get_job(_job(store, "numbers02", ["a"]))
    export.write_csv(out, plain, iter([_record(COMPLETED, answer, 0)]))
    assert list(csv.reader(io.StringIO(out.getvalue())))[1][2] == cell, "a result"


def test_describe_error_is_empty_for_a_completed_item_or_one_without_an_error():
    def item(status, error_type, http_status=None, message=None):
        return ItemRecord(
            0, "n", status, None, error_type, http_status, message, 0, 0, 0, None, None
        )

    assert export.describe_error(item(COMPLETED, "x", 500, "m")) == ""
    assert export.describe_error(item(FAILED, None)) == ""
    assert export.describe_error(item(FAILED, "x", 0, "m")) == "x: m"
    assert export.describe_error(item(FAILED, "x", 503, None)) == "x (HTTP 503)"


def test_column_may_not_take_any_key_a_jsonl_line_has(store):
    """OUR_JSONL_KEYS is written out beside write_jsonl: a key added there and not here fails."""
    job = store.get_job(_job(store, "keys0001", ["a"], schema=json.dumps({"properties": {}})))
    item = replace(_record(COMPLETED, "{}", 0), reused_from=("j0", 0), provider="p", model="m")
    for with_input in (False, True):
        out = io.StringIO()
        export.write_jsonl(out, job, iter([item]), with_input=with_input)
        assert set(json.loads(out.getvalue())) - {export.RESULT} <= set(export.OUR_JSONL_KEYS)
