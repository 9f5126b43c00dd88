"""max_item_bytes holds for records too: a CSV row, JSONL line or JSON element larger than it is
one line at create (naming the line), read no further than the limit, and no job is made.

A 50 MB CSV cell once became one item and took `create` to 398 MB. Here a record of 40 MB meets
the default limit (4 MiB) in a real `create`, whose peak RSS is compared with the same command's
over a small file: the difference stays far below the record's size.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .test_cli_errors import assert_one_line_error

BIG = 40 * 1024 * 1024
LIMIT = 1024 * 1024


def _csv(path: Path, cell: int) -> Path:
    with open(path, "w") as f:
        f.write("id,text\n1,small\n2,small too\n")
        f.write('3,"' + "x" * cell + '"\n4,after\n')
    return path


def _jsonl(path: Path, size: int) -> Path:
    with open(path, "w") as f:
        f.write('"one"\n"two"\n"three"\n' + json.dumps("y" * size) + "\n")
    return path


def _json(path: Path, size: int) -> Path:
    with open(path, "w") as f:
        f.write('[\n"one",\n"two",\n"three",\n{"text": ' + json.dumps("z" * size) + "}\n]\n")
    return path


MAKERS = {"csv": (_csv, 4), "jsonl": (_jsonl, 4), "json": (_json, 5)}


@pytest.mark.parametrize("kind", list(MAKERS))
def test_a_record_over_max_item_bytes_is_one_line_naming_it_and_no_job(cli, tmp_path, kind):
    make, line = MAKERS[kind]
    src = make(tmp_path / f"big.{kind}", LIMIT + 10)
    proc = cli(
        "create", "Do", "--over", str(src), check=False, HERMES_BULK_MAX_ITEM_BYTES=str(LIMIT)
    )
    assert_one_line_error(
        proc,
        1,
        f"line {line}",
        f"larger than max_item_bytes ({LIMIT} bytes)",
        "HERMES_BULK_MAX_ITEM_BYTES",
    )
    assert cli("list", "--json").stdout.strip() in ("", "[]")


@pytest.mark.parametrize("kind", list(MAKERS))
def test_a_record_at_max_item_bytes_is_an_item(cli, tmp_path, kind):
    make, _ = MAKERS[kind]
    src = make(tmp_path / f"fits.{kind}", LIMIT // 2)
    assert (
        cli.json(
            "create", "Do", "--over", str(src), "--json", HERMES_BULK_MAX_ITEM_BYTES=str(LIMIT)
        )["items"]
        == 4
    )


def _peak_rss_kib(cli, src: Path) -> int:
    # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so it would report the forking
    # test process's own peak.
    code = (
        "import re, sys; from hermes_bulk.frontends.cli import main; main(sys.argv[1:]); "
        "print(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())[1], "
        "file=sys.stderr)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "create", "Do", "--over", str(src), "--dry-run"],
        capture_output=True,
        text=True,
        env=cli.full_env(),
        timeout=120,
    )
    return int(proc.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", list(MAKERS))
def test_memory_stays_flat_for_a_huge_record(cli, tmp_path, kind):
    make, _ = MAKERS[kind]
    small = _peak_rss_kib(cli, make(tmp_path / f"small.{kind}", 10))
    huge = _peak_rss_kib(cli, make(tmp_path / f"huge.{kind}", BIG))
    assert huge - small < BIG // 1024 // 4, (small, huge)
