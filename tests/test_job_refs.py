"""An empty or blank job id is a usage error, never "the newest job".

`delete ""` once deleted the newest job, twice in a row, and `run ""` would have spent tokens on
it: an unset shell variable must not pick a job. Only `status` and `list` with no argument at
all show recent jobs.
"""

from __future__ import annotations

import pytest

from .test_cli_errors import assert_one_line_error

#: Every command that takes a job reference, with the flags it needs to get that far.
JOB_COMMANDS = [
    ["run"],
    ["run", "--wait"],
    ["status"],
    ["status", "--json"],
    ["status", "--watch"],
    ["pause"],
    ["resume"],
    ["resume", "--max-tokens", "100"],
    ["retry"],
    ["export"],
    ["events"],
    ["delete"],
]


@pytest.fixture
def two_jobs(cli, tmp_path):
    """Two jobs: the newer is what an empty id used to mean."""
    ids = []
    for name in ("older", "newer"):
        src = tmp_path / f"{name}.txt"
        src.write_text(name)
        ids.append(cli.create("Do", src))
    return ids


@pytest.mark.parametrize("blank", ["", " \t "], ids=["empty", "blank"])
@pytest.mark.parametrize("command", JOB_COMMANDS, ids=lambda c: " ".join(c))
def test_a_blank_job_id_is_a_usage_error_for_every_command(
    cli, two_jobs, fake_provider, command, blank
):
    before = cli.json("list", "--json")
    proc = cli(command[0], blank, *command[1:], check=False, timeout=60)
    assert_one_line_error(proc, 2, "job id is empty")
    assert cli.json("list", "--json") == before, "no job was touched"
    assert fake_provider.stats()["requests"] == 0, "no tokens were spent"


def test_delete_of_an_empty_id_twice_deletes_nothing(cli, two_jobs):
    for _ in range(2):
        assert_one_line_error(cli("delete", "", check=False), 2, "job id is empty")
    assert {j["job_id"] for j in cli.json("list", "--json")} == set(two_jobs)


def test_status_and_list_without_an_argument_still_show_recent_jobs(cli, two_jobs):
    assert [j["job_id"] for j in cli.json("status", "--json")] == list(reversed(two_jobs))
    assert [j["job_id"] for j in cli.json("list", "--json")] == list(reversed(two_jobs))
