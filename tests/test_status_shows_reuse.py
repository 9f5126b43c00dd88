"""`status` tells what reuse saved: the reused items and the tokens saved, in its text and in
--json, through real CLI processes on SQLite and Redis."""

from __future__ import annotations

import re

from .test_reuse import _answered, _folder


def test_status_names_reused_answers_and_the_tokens_they_saved(
    backend_cli,
    tmp_path,
    fake_provider,
):
    cli = backend_cli
    folder, first = _answered(cli, tmp_path, 3)
    _folder(tmp_path, 1, start=3)
    again = cli.create("Summarise", folder)
    cli("run", again, "--wait", timeout=120)

    st = cli.json("status", again, "--json")
    assert st["reused"] == 3 and st["tokens_saved"] > 0
    text = cli("status", again).stdout
    assert (
        f"Reused answers: 3 of 4 items answered before, {st['tokens_saved']:,} tokens saved" in text
    ), text
    assert not re.search(r"Reused answers", cli("status", first).stdout), (
        "a job that reused nothing says nothing"
    )
