"""`export --with-input` gives the source back with its answers, and
`run`/`resume --concurrency/--rpm/--tpm` change a job as it runs. Real processes, a real SQLite
file, the loopback provider."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from hermes_bulk.testing.fake_provider import expected_answer

from .helpers import job_status, local_jobs, wait_for, worker_passes


def _csv_source(tmp_path):
    src = tmp_path / "people.csv"
    src.write_text(
        'name,city,name,note\n"Smith, Jo","Paris, FR",dup1,=1+1\nAda,London,dup2,plain\n'
    )
    return src


def _rows(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text.lstrip("\ufeff"))))


def test_a_csv_comes_back_as_itself_plus_answers(cli, tmp_path):
    job_id = cli.create("Describe", _csv_source(tmp_path))
    cli("run", job_id, "--wait")
    out = tmp_path / "enriched.csv"
    assert cli(
        "export", job_id, "--format", "csv", "--with-input", "--output", str(out)
    ).stdout.strip() == str(out)
    rows = _rows(out.read_text(encoding="utf-8-sig"))
    assert rows[0] == [
        *("name", "city", "name_2", "note", "item", "status", "result", "error"),
        *("tokens_in", "tokens_out", "cost_usd"),
    ]
    assert rows[1][:4] == ["Smith, Jo", "Paris, FR", "dup1", "=1+1"], (
        "the user's own cells come back as they were"
    )
    assert rows[2][:4] == ["Ada", "London", "dup2", "plain"]
    assert [r[4:7] for r in rows[1:]] == [
        [
            "row:1",
            "completed",
            expected_answer(
                json.dumps(
                    {"name": "Smith, Jo", "city": "Paris, FR", "name_2": "dup1", "note": "=1+1"}
                )
            ),
        ],
        [
            "row:2",
            "completed",
            expected_answer(
                json.dumps({"name": "Ada", "city": "London", "name_2": "dup2", "note": "plain"})
            ),
        ],
    ]
    plain = _rows(cli("export", job_id, "--format", "csv", "--output", "-").stdout)
    assert plain[0] == [
        "item",
        "status",
        "result",
        "error",
        "tokens_in",
        "tokens_out",
        "cost_usd",
    ], "without the flag the seed's columns stay"
    streamed = _rows(
        cli("export", job_id, "--format", "csv", "--with-input", "--output", "-").stdout
    )
    assert streamed == rows
    lines = [
        json.loads(x)
        for x in cli(
            "export", job_id, "--format", "jsonl", "--with-input", "--output", "-"
        ).stdout.splitlines()
    ]
    assert lines[0]["input"] == {
        "name": "Smith, Jo",
        "city": "Paris, FR",
        "name_2": "dup1",
        "note": "=1+1",
    }
    assert list(lines[0])[:4] == ["input", "item", "index", "status"]


def test_with_input_gives_every_input_cell_back_byte_for_byte(cli, tmp_path):
    """Cells a spreadsheet would read as formulas or signed numbers are the user's: they come
    back as they were; only what the model and hermes-bulk wrote is guarded."""
    src = tmp_path / "scores.csv"
    src.write_text('score,note,@who\n-10,=1+1,@x\n+3,-10 stars #3,"=HYPERLINK(""a"")"\n')
    job_id = cli.create("Describe", src)
    cli("run", job_id, "--wait")
    out = tmp_path / "scores.out.csv"
    cli("export", job_id, "--format", "csv", "--with-input", "--output", str(out))
    given = _rows(src.read_text())
    back = _rows(out.read_text(encoding="utf-8-sig"))
    assert [row[:3] for row in back] == given
    assert [row[3:5] for row in back[1:]] == [["row:1", "completed"], ["row:2", "completed"]]


def test_a_jsonl_source_and_a_folder_come_back_with_their_records_and_paths(cli, tmp_path):
    src = tmp_path / "records.jsonl"
    src.write_text('{"id": 1, "text": "a, b"}\n"just text"\n')
    job_id = cli.create("Do", src)
    cli("run", job_id, "--wait")
    lines = [
        json.loads(x)
        for x in cli(
            "export", job_id, "--format", "jsonl", "--with-input", "--output", "-"
        ).stdout.splitlines()
    ]
    assert [line["input"] for line in lines] == [{"id": 1, "text": "a, b"}, "just text"]
    assert [line["status"] for line in lines] == ["completed", "completed"]
    rows = _rows(cli("export", job_id, "--format", "csv", "--with-input", "--output", "-").stdout)
    assert rows[0][:2] == ["input", "item"] and json.loads(rows[1][0]) == {"id": 1, "text": "a, b"}

    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("alpha")
    (folder / "sub" / "b.txt").write_text("beta")
    job_id = cli.create("Do", folder)
    cli("run", job_id, "--wait")
    rows = _rows(cli("export", job_id, "--format", "csv", "--with-input", "--output", "-").stdout)
    assert [r[:3] for r in rows] == [
        ["path", "item", "status"],
        ["a.txt", "a.txt", "completed"],
        ["sub/b.txt", "sub/b.txt", "completed"],
    ]
    lines = [
        json.loads(x)
        for x in cli(
            "export", job_id, "--format", "jsonl", "--with-input", "--output", "-"
        ).stdout.splitlines()
    ]
    assert [line["path"] for line in lines] == ["a.txt", "sub/b.txt"] and "input" not in lines[0]


def test_with_input_and_markdown_is_a_usage_error(cli, tmp_path):
    job_id = cli.create("Do", _csv_source(tmp_path))
    proc = cli("export", job_id, "--with-input", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "hermes-bulk: --with-input needs --format csv or --format jsonl."
    assert not (tmp_path / "home" / "jobs" / job_id / "results.md").exists()


def _make_items(tmp_path, n: int):
    src = tmp_path / "items.jsonl"
    src.write_text("".join(f'"item {i}"\n' for i in range(n)))
    return src


def test_run_wait_with_concurrency_runs_that_many_and_records_it(cli, tmp_path, fake_provider):
    job_id = cli.create("Do", _make_items(tmp_path, 12), "--concurrency", "1")
    fake_provider.configure(latency_s=0.5)
    cli("run", job_id, "--wait", "--concurrency", "4", "--rpm", "6000", "--tpm", "900000")
    assert fake_provider.max_in_flight == 4
    st = cli.json("status", job_id, "--json")
    assert (st["state"], st["concurrency"], st["rpm"], st["tpm"]) == ("completed", 4, 6000, 900000)
    assert "concurrency 4 (was 1)" in cli("events", job_id).stdout


def test_raising_concurrency_on_a_running_job_uses_the_new_slots_at_once(
    cli, tmp_path, fake_provider
):
    job_id = cli.create("Do", _make_items(tmp_path, 16), "--concurrency", "1")
    fake_provider.hold()  # every item stays in flight until released
    worker = cli.spawn_worker(
        "-w", "8", HERMES_BULK_LEASE_SECONDS="3"
    )  # a maintenance pass a second
    try:
        cli("run", job_id)
        fake_provider.wait_held(1)
        with local_jobs() as jobs:
            worker_passes(
                jobs, job_id
            )  # every trigger taken, two passes since: a second item had its chance
        assert (fake_provider.held, len(fake_provider.requests)) == (1, 1), (
            "concurrency 1: one item at a time"
        )
        cli("run", job_id, "--concurrency", "4")
        fake_provider.wait_held(4)  # three more start while the first is still in flight
        fake_provider.release()
        with local_jobs() as jobs:
            wait_for(
                lambda: job_status(jobs, job_id)["state"] == "completed",
                timeout=60,
                message="completion",
            )
        assert fake_provider.max_in_flight == 4
    finally:
        fake_provider.release()
        worker.terminate()
        worker.wait(timeout=30)


@pytest.mark.parametrize("command", ["run", "resume"])
def test_concurrency_above_max_concurrency_is_a_usage_error_and_changes_nothing(
    cli, tmp_path, command
):
    job_id = cli.create("Do", _make_items(tmp_path, 2), "--concurrency", "2")
    if command == "resume":
        cli("pause", job_id)
    proc = cli(command, job_id, "--concurrency", "17", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "hermes-bulk: --concurrency 17 is more than max_concurrency (16); "
        "lower it, or raise HERMES_BULK_MAX_CONCURRENCY."
    )
    assert cli.json("status", job_id, "--json")["concurrency"] == 2
    assert cli("run", job_id, "--concurrency", "0", check=False).returncode == 2


def test_resume_records_new_concurrency_and_pacing(cli, tmp_path):
    job_id = cli.create("Do", _make_items(tmp_path, 3), "--concurrency", "1")
    cli("pause", job_id)
    cli("resume", job_id, "--concurrency", "3", "--rpm", "120", "--wait")
    st = cli.json("status", job_id, "--json")
    assert (st["state"], st["concurrency"], st["rpm"], st["tpm"]) == ("completed", 3, 120, None)


def test_column_names_the_answer_in_csv_and_jsonl_and_is_refused_where_it_cannot_be(cli, tmp_path):
    job_id = cli.create("Describe", _csv_source(tmp_path))
    cli("run", job_id, "--wait")
    plain = _rows(
        cli("export", job_id, "--format", "csv", "--column", "summary", "--output", "-").stdout
    )
    assert plain[0] == ["item", "status", "summary", "error", "tokens_in", "tokens_out", "cost_usd"]
    enriched = _rows(
        cli(
            "export",
            job_id,
            "--format",
            "csv",
            "--with-input",
            "--column",
            "summary",
            "--output",
            "-",
        ).stdout
    )
    assert enriched[0] == [
        *("name", "city", "name_2", "note", "item", "status", "summary", "error"),
        *("tokens_in", "tokens_out", "cost_usd"),
    ]
    assert enriched[1][6] == plain[1][2] != ""
    out = tmp_path / "named.jsonl"
    cli("export", job_id, "--format", "jsonl", "--column", "summary", "--output", str(out))
    line = json.loads(out.read_text().splitlines()[0])
    assert line["summary"] == plain[1][2] and "result" not in line
    for args, says in [
        (["--format", "md", "--column", "summary"], "--format csv or jsonl"),
        (["--format", "csv", "--column", "status"], "choose another"),
        (["--format", "csv", "--column", "cost_usd"], "choose another"),
        (["--format", "jsonl", "--column", "tokens_in"], "choose another"),
        (["--format", "csv", "--column", " "], "give the answer column a name"),
    ]:
        proc = cli("export", job_id, *args, "--output", str(tmp_path / "x.out"), check=False)
        assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, (
            args,
            proc.stderr,
        )
        assert not (tmp_path / "x.out").exists()


def test_a_csv_given_back_begins_as_the_source_did_with_a_bom_or_not(cli, tmp_path):
    """--with-input gives the user's CSV back: it began with a byte-order mark the source did
    not have. It now follows the source; an export of answers alone keeps its BOM (Excel)."""
    plain = _csv_source(tmp_path)
    marked = tmp_path / "marked.csv"
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    for src, begins in ((plain, b"name,city"), (marked, b"\xef\xbb\xbfname,city")):
        job_id = cli.create("Describe", src)
        back = cli("export", job_id, "--format", "csv", "--with-input").stdout.strip()
        assert Path(back).read_bytes().startswith(begins), src.name
        answers = cli("export", job_id, "--format", "csv").stdout.strip()
        assert Path(answers).read_bytes().startswith(b"\xef\xbb\xbfitem,"), src.name
