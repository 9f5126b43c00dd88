"""Items by name at the terminal: events, `show JOB ITEM`, `status --failed`, `export --only`.

Through real `hermes-bulk` processes, the loopback provider, and SQLite or a real redis-server.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

BACKENDS = ["sqlite", "redis"]
CLOCK = re.compile(r"^\s*\d\d:\d\d:\d\d ")


def _folder_job(cli, tmp_path: Path, fake_provider) -> str:
    """A folder job whose 2026/q2.txt fails with HTTP 503 after one retry."""
    src = tmp_path / "reports"
    (src / "2026").mkdir(parents=True)
    (src / "2026" / "q1.txt").write_text("first quarter\n")
    (src / "2026" / "q2.txt").write_text("second FLAKY quarter\n")
    (src / "notes.txt").write_text("notes\n")
    fake_provider.configure(item_faults={"FLAKY": "503"})
    job_id = cli.create("Summarise", src, "--retries", "1")
    assert cli("run", job_id, "--wait", check=False, timeout=90).returncode == 1, (
        "ends with a failed item"
    )
    return job_id


def _event_lines(text: str) -> list[str]:
    return [CLOCK.sub("", line) for line in text.splitlines() if CLOCK.match(line)]


def test_events_name_items_as_exports_do_and_say_each_thing_once(
    backend_cli, tmp_path, fake_provider
):
    cli = backend_cli
    job_id = _folder_job(cli, tmp_path, fake_provider)
    events = _event_lines(cli("events", job_id).stdout)
    assert events.count("attempt_failed 2026/q2.txt: the provider answered HTTP 503") == 2, events
    assert events[-1] == "item_failed 2026/q2.txt: the provider answered HTTP 503", events
    assert not [
        e for e in events if "item 2" in e or "attempt failed" in e or e.count("HTTP 503") > 1
    ]
    # status --events shows the same lines (one place builds them)
    assert _event_lines(cli("status", job_id, "--events", "50").stdout) == events


def test_show_one_item_by_name_or_number(backend_cli, tmp_path, fake_provider):
    cli = backend_cli
    job_id = _folder_job(cli, tmp_path, fake_provider)
    failed = cli("show", job_id, "2026/q2.txt").stdout
    assert failed.startswith(f"Item 2026/q2.txt (number 2 of job {job_id})\nState: failed\n")
    assert "Error: TransientError: the provider answered HTTP 503" in failed
    # the content as sent: the instruction, and the item between its boundary lines
    assert re.search(
        r"Instruction:\nSummarise\n\nItem 2026/q2.txt \(between the BEGIN and END lines\):\n"
        r"----- BEGIN ITEM (\w{12}) -----\nsecond FLAKY quarter\n\n----- END ITEM \1 -----",
        failed,
    )
    assert "[system]\nYou apply one instruction to one item" in failed
    attempts = _event_lines(failed.split("Attempts and events:", 1)[1])
    assert attempts == ["attempt_failed 2026/q2.txt: the provider answered HTTP 503"] * 2 + [
        "item_failed 2026/q2.txt: the provider answered HTTP 503"
    ]

    done = cli("show", job_id, "1").stdout
    assert done.startswith(f"Item 2026/q1.txt (number 1 of job {job_id})\nState: completed\n")
    answer = done.split("Answer:\n", 1)[1].split("\n\n", 1)[0]
    exported = {
        r["item"]: r
        for r in map(
            json.loads,
            cli("export", job_id, "--format", "jsonl", "--output", "-").stdout.splitlines(),
        )
    }
    assert answer == exported["2026/q1.txt"]["result"]
    tokens = (
        f"Tokens (reported by the provider): {exported['2026/q1.txt']['tokens_in']:,} in, "
        f"{exported['2026/q1.txt']['tokens_out']:,} out"
    )
    assert tokens in done and exported["2026/q1.txt"]["tokens_in"] > 0
    # a completed file's content is not kept: show says where the file is instead
    assert (
        "Sent:\n(not kept once the item completed: the file is 2026/q1.txt in "
        f"{tmp_path / 'reports'})" in done
    )
    assert "BEGIN ITEM" not in done.split("Answer:", 1)[0], "nothing framed: the content is gone"

    data = cli.json("show", job_id, "2026/q2.txt", "--json")
    assert (data["item"], data["number"], data["status"], data["result"]) == (
        "2026/q2.txt",
        2,
        "failed",
        None,
    )
    assert data["error"] == {
        "error_type": "TransientError",
        "http_status": 503,
        "message": "the provider answered HTTP 503",
    }
    assert [m["role"] for m in data["messages"]] == ["system", "user"]
    assert "second FLAKY quarter" in data["messages"][1]["content"]
    assert [(e["kind"], e["http_status"]) for e in data["events"]] == [
        ("attempt_failed", 503),
        ("attempt_failed", 503),
        ("item_failed", 503),
    ]
    assert cli.json("show", job_id, "3", "--json")["item"] == "notes.txt"
    assert cli.json("show", job_id, "3", "--json")["messages"] == [], "completed: its content went"


@pytest.mark.parametrize("ref", ["nope.txt", "0", "4", "99999999999999999999999"])
def test_an_unknown_item_is_one_line_saying_what_names_look_like(cli, tmp_path, ref):
    src = tmp_path / "rows.csv"
    src.write_text("a\n1\n2\n3\n")
    job_id = cli.create("Do", src)
    proc = cli("show", job_id, ref, check=False)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == (
        f"hermes-bulk: Job {job_id} has no item '{ref}'; give an item's name as the export "
        "shows it (a relative path, row:N, record:N or line:N) or its number, 1 to 3.\n"
    )
    assert "row:2" in cli("show", job_id, "row:2").stdout.splitlines()[0]


def test_status_failed_lists_failed_items_by_name_capped(cli, tmp_path, fake_provider):
    src = tmp_path / "items.jsonl"
    src.write_text(
        "".join(
            json.dumps({"n": i, "x": "PERMANENT-400" if i % 2 else "fine"}) + "\n"
            for i in range(50)
        )
    )
    fake_provider.configure(item_faults={"PERMANENT-400": "400"})
    job_id = cli.create("Do", src)
    cli("run", job_id, "--wait", check=False, timeout=90)
    names = [
        r["item"]
        for r in map(
            json.loads,
            cli("export", job_id, "--format", "jsonl", "--output", "-").stdout.splitlines(),
        )
        if r["status"] == "failed"
    ]
    assert len(names) == 25
    lines = cli("status", job_id, "--failed").stdout.splitlines()
    assert lines[0] == f"Failed items of job {job_id}:"
    listed = lines[1:21]
    assert [line.split(": ", 1)[0].strip() for line in listed] == names[:20]
    assert all(
        line.split(": ", 1)[1].startswith("PermanentError") and "HTTP 400" in line
        for line in listed
    )
    assert lines[21] == f"  … and 5 more: hermes-bulk export {job_id} --only failed"
    assert lines[22] == f"One item in full: hermes-bulk show {job_id} ITEM"
    rows = cli.json("status", job_id, "--failed", "--json")
    assert [r["item"] for r in rows] == names[:20] and {r["http_status"] for r in rows} == {400}

    clean = cli.create("Do", tmp_path / "items.jsonl")
    assert cli("status", clean, "--failed").stdout == f"Job {clean} has no failed items.\n"


def test_export_only_failed_or_completed_in_every_format(backend_cli, tmp_path, fake_provider):
    cli = backend_cli
    job_id = _folder_job(cli, tmp_path, fake_provider)
    for only, names in (("failed", ["2026/q2.txt"]), ("completed", ["2026/q1.txt", "notes.txt"])):
        rows = [
            json.loads(line)
            for line in cli(
                "export", job_id, "--format", "jsonl", "--only", only, "--output", "-"
            ).stdout.splitlines()
        ]
        assert [(r["item"], r["status"]) for r in rows] == [(n, only) for n in names]
        path = Path(cli("export", job_id, "--format", "csv", "--only", only).stdout.strip())
        table = list(csv.DictReader(path.read_text(encoding="utf-8-sig").splitlines()))
        assert [(r["item"], r["status"]) for r in table] == [(n, only) for n in names]
        md = cli("export", job_id, "--only", only, "--output", "-").stdout
        assert re.findall(r"^## (.+)$", md, re.M) == names
    everything = cli("export", job_id, "--format", "jsonl", "--output", "-").stdout.splitlines()
    assert len(everything) == 3, "without --only every item is exported"
    bad = cli("export", job_id, "--only", "pending", check=False)
    assert bad.returncode == 2 and "--only" in bad.stderr


def test_each_export_variant_has_its_own_default_file(backend_cli, tmp_path, fake_provider):
    """`export --only failed` after a full export replaced the full results.csv: each variant
    (which items, with their input or not) now writes a name of its own in the job's folder."""
    cli = backend_cli
    job_id = _folder_job(cli, tmp_path, fake_provider)
    written = {}
    for flags in ([], ["--only", "failed"], ["--only", "completed"], ["--with-input"]):
        path = Path(cli("export", job_id, "--format", "csv", *flags).stdout.strip())
        written[path.name] = path.read_bytes()
    assert sorted(written) == [
        "results-completed.csv",
        "results-failed.csv",
        "results-with-input.csv",
        "results.csv",
    ]
    for name, before in written.items():
        assert (path.parent / name).read_bytes() == before, f"{name} was replaced"
    assert written["results.csv"].count(b"\n") == 4, "the full export kept its three rows"
    both = cli("export", job_id, "--format", "jsonl", "--only", "failed", "--with-input")
    assert Path(both.stdout.strip()).name == "results-failed-with-input.jsonl"
