"""Never pay twice for the same answer, through real CLI processes on SQLite and Redis:
a job reuses the answers of earlier jobs of its store and asks once for identical items; the
loopback provider counts what was really sent."""

from __future__ import annotations

import csv
import json
import re

import pytest


def _export(cli, job_id: str) -> list[dict]:
    out = cli("export", job_id, "--format", "jsonl", "--output", "-").stdout
    return [json.loads(line) for line in out.splitlines()]


def _folder(tmp_path, n: int, start: int = 0):
    folder = tmp_path / "reports"
    folder.mkdir(exist_ok=True)
    for i in range(start, start + n):
        (folder / f"r{i:03}.txt").write_text(f"report number {i}\n")
    return folder


def _answered(cli, tmp_path, n: int):
    """A folder of n reports and the job that answered them all (the answers later jobs reuse)."""
    folder = _folder(tmp_path, n)
    job = cli.create("Summarise", folder)
    cli("run", job, "--wait", timeout=120)
    return folder, job


def test_a_rerun_over_a_grown_folder_asks_only_for_the_new_files(
    backend_cli, tmp_path, fake_provider
):
    cli = backend_cli
    folder, a = _answered(cli, tmp_path, 20)
    first = {r["item"]: r["result"] for r in _export(cli, a)}
    assert len(fake_provider.requests) == 20
    _folder(tmp_path, 5, start=20)
    fake_provider.reset_records()

    made = cli("create", "Summarise", "--over", str(folder))
    b = made.stdout.split()[2]
    assert f"Created job {b} with 25 items: 20 answered before (reused), 5 to run." in made.stdout
    cli("run", b, "--wait", timeout=120)
    assert len(fake_provider.requests) == 5, "only the five new files were sent"
    rows = _export(cli, b)
    assert [r["status"] for r in rows] == ["completed"] * 25
    assert all(r["result"] for r in rows)
    for r in rows:
        if r["item"] in first:
            assert r["result"] == first[r["item"]]
            assert r["reused_from"]["job_id"] == a
        else:
            assert "reused_from" not in r
    st = cli.json("status", b, "--json")
    assert (st["reused"], st["state"]) == (20, "completed")
    assert st["tokens_saved"] > 0
    assert st["tokens_charged"] < cli.json("status", a, "--json")["tokens_charged"], (
        "reused items are not charged"
    )
    # The output allowance is learned from the items answered here, not diluted by the reused
    # ones (which cost this job nothing): the same answers per item as job A's, so about its figure.
    learned = re.compile(r"learned from (\d+) completed items: (\d+) output tokens")
    a_basis, b_basis = (learned.search(cli("status", j).stdout) for j in (a, b))
    assert b_basis and b_basis.group(1) == "5", cli("status", b).stdout
    assert a_basis and a_basis.group(1) == "20"
    assert int(b_basis.group(2)) >= int(a_basis.group(2)) // 2

    fake_provider.reset_records()
    fresh = cli.json("create", "Summarise", "--over", str(folder), "--fresh", "--json")
    assert fresh["reused"] == 0
    cli("run", fresh["job_id"], "--wait", timeout=120)
    assert len(fake_provider.requests) == 25, "--fresh asks for every item"


@pytest.mark.parametrize("change", ["instruction", "model", "schema"])
def test_a_changed_question_reuses_nothing(change, backend_cli, tmp_path, fake_provider):
    cli = backend_cli
    folder, _ = _answered(cli, tmp_path, 4)
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"title": {"type": "string"}}}))
    flags = {
        "instruction": ("Summarise briefly",),
        "model": ("Summarise", "--model", "other-model"),
        "schema": ("Summarise", "--schema", str(schema)),
    }[change]
    made = cli.json("create", flags[0], "--over", str(folder), *flags[1:], "--json")
    assert made["reused"] == 0
    # The same question again is still reused: the key is only what shapes the answer.
    assert cli.json("create", "Summarise", "--over", str(folder), "--json")["reused"] == 4


def test_reuse_off_by_setting_and_deleted_jobs_answer_nothing(backend_cli, tmp_path, fake_provider):
    cli = backend_cli
    folder, a = _answered(cli, tmp_path, 3)
    assert (
        cli.json("create", "Summarise", "--over", str(folder), "--json", HERMES_BULK_REUSE="false")[
            "reused"
        ]
        == 0
    )
    assert cli.json("create", "Summarise", "--over", str(folder), "--json")["reused"] == 3
    cli("delete", a)
    assert cli.json("create", "Summarise", "--over", str(folder), "--json")["reused"] == 0


def test_a_job_answered_before_in_full_is_completed_at_create_and_says_so(
    backend_cli, tmp_path, fake_provider
):
    cli = backend_cli
    folder, _ = _answered(cli, tmp_path, 3)
    fake_provider.reset_records()
    made = cli("create", "Summarise", "--over", str(folder)).stdout
    b = made.split()[2]
    assert "3 answered before (reused), 0 to run." in made
    assert f"Nothing to run: the job is completed. Export it with: hermes-bulk export {b}" in made
    assert "Start it with" not in made, "a run of it would only say it has no pending items"
    st = cli.json("status", b, "--json")
    assert (st["state"], st["completed"], st["pending"]) == ("completed", 3, 0)
    assert len(_export(cli, b)) == 3 and not fake_provider.requests


def _csv_with_duplicates(tmp_path):
    """100 rows: 60 distinct, 40 repeating earlier ones."""
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text"])
        for i in range(100):
            w.writerow([f"row text {i if i < 60 else i % 20}"])
    return path


def test_identical_rows_are_asked_once(backend_cli, tmp_path, fake_provider):
    cli = backend_cli
    job = cli.create("Classify", _csv_with_duplicates(tmp_path))
    cli("run", job, "--wait", timeout=120)
    assert len(fake_provider.requests) == 60
    rows = _export(cli, job)
    assert [r["status"] for r in rows] == ["completed"] * 100
    for i in range(60, 100):
        assert rows[i]["result"] == rows[i % 20]["result"]
    st = cli.json("status", job, "--json")
    assert (st["completed"], st["pending"], st["reused"]) == (100, 0, 0)


def test_a_failed_answer_fails_its_duplicates_and_retry_asks_once(
    backend_cli, tmp_path, fake_provider
):
    cli = backend_cli
    fake_provider.configure(item_faults={"row text 7": "400"})
    job = cli.create("Classify", _csv_with_duplicates(tmp_path), "--retries", "0")
    cli("run", job, "--wait", timeout=120, check=False)
    st = cli.json("status", job, "--json")
    # row text 7 is rows 7, 67 and 87.
    assert (st["failed"], st["completed"]) == (3, 97)
    assert len(fake_provider.requests) == 60
    rows = _export(cli, job)
    assert {rows[i]["status"] for i in (7, 67, 87)} == {"failed"}
    fake_provider.configure(item_faults={})
    fake_provider.reset_records()
    cli("retry", job)
    cli("run", job, "--wait", timeout=120, check=False)
    assert len(fake_provider.requests) == 1, "the three are asked once"
    st = cli.json("status", job, "--json")
    assert (st["failed"], st["completed"], st["state"]) == (0, 100, "completed")
    rows = _export(cli, job)
    assert rows[67]["result"] == rows[7]["result"] == rows[87]["result"]
