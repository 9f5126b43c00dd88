"""An honest token estimate. The output allowance is learned from the job's
completed items (in the store, so every worker and both backends agree), reservations shrink
with it, and `status` shows the estimate improving. Real `hermes-bulk` processes, the loopback
provider, SQLite or a real redis-server."""

from __future__ import annotations

import json
import re

import pytest

from hermes_bulk.frontends.views import SCREENFUL_CHARS

BACKENDS = ["sqlite", "redis"]
ROWS = 40


def _short_rows(tmp_path):
    src = tmp_path / "short.csv"
    src.write_text("word\n" + "".join(f"w{i}\n" for i in range(ROWS)))
    return src


def test_the_estimate_learns_from_completed_items(backend_cli, tmp_path):
    cli = backend_cli
    created = cli.json("create", "Say A", "--over", str(_short_rows(tmp_path)), "--json")
    before = cli.json("status", created["job_id"], "--json")["estimated_tokens"]
    cli("run", created["job_id"], "--wait", "--concurrency", "2")
    job = cli.json("status", created["job_id"], "--json")
    used = job["tokens_in"] + job["tokens_out"]
    assert job["completed"] == ROWS
    assert before > 4 * used, "the fixed 512-token allowance dominates the estimate made at create"
    assert used <= job["estimated_tokens"] <= 1.2 * used, (
        "once items are done the estimate is what they cost"
    )
    assert "learned from 40 completed items" in cli("status", created["job_id"]).stdout


def test_learning_improves_the_estimate_but_never_shrinks_a_reservation(backend_cli, tmp_path):
    """A limit a little above what the job really uses: reservations shrank with the learned
    allowance once, so a provider that answered long after short answers went past the limit.
    Each item now reserves its worst case (its input bytes and max_tokens), so the job pauses
    before its last items rather than risk going over, however short its answers were."""
    cli = backend_cli
    src = _short_rows(tmp_path)
    probe = cli.create("Say A", src, "--max-output-tokens", "50")
    cli("run", probe, "--wait")
    job = cli.json("status", probe, "--json")
    used = job["tokens_in"] + job["tokens_out"]
    limit = used + 200  # less than one more item's worst case beside what all of them use
    job_id = cli.create(
        "Say B", src, "--max-tokens", str(limit), "--max-output-tokens", "50", "--concurrency", "1"
    )
    proc = cli("run", job_id, "--wait", check=False)
    job = cli.json("status", job_id, "--json")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert (job["state"], job["pause_reason"]) == ("paused", "token limit reached")
    assert job["completed"] < ROWS and job["tokens_charged"] <= limit
    assert "learned from" in cli("status", job_id).stdout, "the estimate learned all the same"


def test_create_warns_when_the_limit_is_below_the_estimate(cli, tmp_path):
    src = _short_rows(tmp_path)
    proc = cli(
        "create", "Say A", "--over", str(src), "--max-tokens", "1000", "--max-output-tokens", "100"
    )
    warnings = [line for line in proc.stdout.splitlines() if line.startswith("Warning:")]
    assert len(warnings) == 1, proc.stdout
    assert (
        "--max-tokens 1000 is below the estimate of" in warnings[0]
        and "will pause at the limit" in warnings[0]
    )
    assert "larger --max-tokens" in warnings[0]
    job_id = proc.stdout.split()[2]
    assert cli.json("status", job_id, "--json")["state"] == "not_started", (
        "the job is still created"
    )
    roomy = cli("create", "Say A", "--over", str(src), "--max-tokens", "10000000").stdout
    assert "Warning" not in roomy


def test_instruction_file_gives_a_long_instruction(cli, tmp_path):
    src = _short_rows(tmp_path)
    text = "Translate the word to French.\n" + "Keep the answer to one word. " * 50
    (tmp_path / "instruction.txt").write_text(text, encoding="utf-8")
    job_id = cli.json(
        "create",
        "--instruction-file",
        str(tmp_path / "instruction.txt"),
        "--over",
        str(src),
        "--json",
    )["job_id"]
    item = cli("show", job_id, "row:1").stdout
    assert "Keep the answer to one word. Keep" in item, "the request carries the file's instruction"


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda d: d / "missing.txt", "cannot read it"),
        (lambda d: d, "directory"),
        (lambda d: (d / "fifo", __import__("os").mkfifo(d / "fifo"))[0], "FIFO"),
        (
            lambda d: (
                d / "latin1.txt",
                (d / "latin1.txt").write_bytes("caf\xe9".encode("latin-1")),
            )[0],
            "not UTF-8",
        ),
        (lambda d: (d / "empty.txt", (d / "empty.txt").write_text("  \n"))[0], "empty"),
    ],
)
def test_a_bad_instruction_file_is_one_line_and_exit_2(cli, tmp_path, make, says):
    folder = tmp_path / "f"
    folder.mkdir()
    path = make(folder)
    proc = cli(
        "create",
        "--instruction-file",
        str(path),
        "--over",
        str(_short_rows(tmp_path)),
        check=False,
        timeout=20,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert (
        len(lines) == 1 and "--instruction-file" in lines[0] and says.lower() in lines[0].lower()
    ), lines
    assert "Traceback" not in proc.stderr


def test_instruction_and_instruction_file_are_exclusive_and_one_is_needed(cli, tmp_path):
    (tmp_path / "i.txt").write_text("Do it")
    src = str(_short_rows(tmp_path))
    both = cli(
        "create", "Do", "--instruction-file", str(tmp_path / "i.txt"), "--over", src, check=False
    )
    assert both.returncode == 2 and "not both" in both.stderr
    neither = cli("create", "--over", src, check=False)
    assert neither.returncode == 2 and "--instruction-file" in neither.stderr


def test_dry_run_shows_the_first_request_and_the_estimate_and_writes_nothing(cli, home, tmp_path):
    src = _short_rows(tmp_path)
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object", "properties": {"fr": {"type": "string"}}}')
    assert not home.exists()
    text = cli(
        "create", "Say A", "--over", str(src), "--dry-run", "--max-tokens", "1000",
        "--max-output-tokens", "100",
    ).stdout  # fmt: skip
    assert text.startswith(f"Dry run: no job created. {ROWS} items.")
    assert (
        "Estimated tokens for the whole job: " in text
        and "Warning: --max-tokens 1000 is below" in text
    )
    # The worst case every claim reserves, summed: each item's input bytes and max_tokens.
    worst = re.search(
        r"At most ([\d,]+) tokens \(each item once: its input bytes, max_tokens 100\)", text
    )
    assert worst and int(worst.group(1).replace(",", "")) > ROWS * 100
    assert (
        "----- BEGIN ITEM" in text
        and '{\\"word\\": \\"w0\\"}' in text
        and '"model": "fake-model"' in text
    )
    plan = cli.json(
        "create", "Say A", "--over", str(src), "--dry-run", "--json", "--schema", str(schema)
    )
    assert (plan["dry_run"], plan["items"], plan["first_item"]) == (True, ROWS, "row:1")
    assert [m["role"] for m in plan["request"]["messages"]] == ["system", "user"]
    assert "Say A" in plan["request"]["messages"][1]["content"]
    assert plan["request"]["response_format"]["json_schema"]["schema"]["properties"] == {
        "fr": {"type": "string"}
    }
    created = cli.create("Say A", src)
    assert plan["estimated_tokens"] == cli.json("status", created, "--json")["estimated_tokens"]


def test_dry_run_on_a_fresh_data_dir_creates_no_database(cli, home, tmp_path):
    cli("create", "Say A", "--over", str(_short_rows(tmp_path)), "--dry-run")
    cli("create", "Say A", "--over", str(_short_rows(tmp_path)), "--dry-run", "--json")
    assert not home.exists(), sorted(home.rglob("*"))


def test_dry_run_shows_a_screenful_of_a_huge_first_request_unless_full(cli, tmp_path):
    src = tmp_path / "big.txt"
    src.write_text("word " * 40_000)  # 200,000 characters in one item
    text = cli("create", "Summarize", "--over", str(src), "--dry-run").stdout
    request = text[text.index("The request for the first item") :]
    assert len(request) < SCREENFUL_CHARS + 200, "about a screenful, not the whole item"
    left = re.search(r"… and ([\d,]+) more characters: --full shows the whole request\.", text)
    assert left and int(left.group(1).replace(",", "")) > 190_000
    whole = cli("create", "Summarize", "--over", str(src), "--dry-run", "--full").stdout
    assert whole.count("word ") >= 40_000 and "--full shows" not in whole
    plan = cli.json("create", "Summarize", "--over", str(src), "--dry-run", "--json")
    assert plan["request"]["messages"][1]["content"].count("word ") == 40_000, "--json is whole"


def _rows_jsonl(tmp_path, n: int):
    """n records of equal length (equal estimates); record 5 repeats record 0."""
    src = tmp_path / "rows.jsonl"
    rows = [{"t": f"item {i % 5 if i == 5 else i:02d}"} for i in range(n)]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return src


def test_a_dry_run_counts_what_would_be_reused_and_estimates_only_the_rest(backend_cli, tmp_path):
    cli = backend_cli
    src = _rows_jsonl(tmp_path, 6)
    first = cli.json("create", "Say A", "--over", str(src), "--dry-run", "--json")
    assert (first["items"], first["reused"], first["repeats"], first["to_run"]) == (6, 0, 1, 5)
    assert first["output_allowance"] == 512 and first["allowance_from"] is None
    per_item = first["estimated_tokens"] // 5
    assert first["estimated_tokens"] == 5 * per_item, "the repeat is not estimated"
    assert (
        "6 items: 1 repeat of an item before them, 5 to run."
        in cli("create", "Say A", "--over", str(src), "--dry-run").stdout
    )

    job_id = cli.json("create", "Say A", "--over", str(src), "--json")["job_id"]
    cli("run", job_id, "--wait")
    done = cli.status(job_id)
    learned = -(-2 * done["tokens_out"] // done["completed"])  # JobRecord.output_allowance
    assert learned < 512

    src = _rows_jsonl(tmp_path, 9)  # three new records
    again = cli.json("create", "Say A", "--over", str(src), "--dry-run", "--json")
    assert (again["items"], again["reused"], again["repeats"], again["to_run"]) == (9, 6, 0, 3)
    assert (again["output_allowance"], again["allowance_from"]) == (learned, job_id)
    assert again["estimated_tokens"] == 3 * (per_item - 512 + learned)
    text = cli("create", "Say A", "--over", str(src), "--dry-run").stdout
    assert "9 items: 6 answered before (reused), 3 to run." in text
    assert (
        f"Estimated tokens for the 3 to run: {again['estimated_tokens']:,} (allowing {learned:,} "
        f"output tokens an item; as job {job_id} learned)"
    ) in text

    # --fresh reuses nothing, but still asks each question once; another instruction learned
    # nothing yet. The job create makes is the one the dry run described.
    fresh = cli.json("create", "Say A", "--over", str(src), "--fresh", "--dry-run", "--json")
    assert (fresh["reused"], fresh["repeats"], fresh["to_run"]) == (0, 1, 8)
    other = cli.json("create", "Say B", "--over", str(src), "--dry-run", "--json")
    assert (other["reused"], other["output_allowance"], other["allowance_from"]) == (0, 512, None)
    made = cli.json("create", "Say A", "--over", str(src), "--json")
    status = cli.status(made["job_id"])
    assert (made["reused"], status["pending"], status["estimated_tokens"]) == (
        6,
        3,
        again["estimated_tokens"],
    ), "the job's estimate is the dry run's: the reused items cost nothing"
