"""A mistyped command word is named as one (exit 2), not read as an instruction missing --over;
an instruction with --over still creates a job, whatever its first word."""

from __future__ import annotations


def test_a_mistyped_command_is_unknown_and_an_instruction_with_over_creates(cli, tmp_path):
    typo = cli("stauts", "abc123", check=False)
    assert (typo.returncode, typo.stderr) == (
        2,
        "hermes-bulk: unknown command 'stauts'; did you mean 'status'?\n",
    )
    word = cli("frobnicate", check=False)
    assert (word.returncode, word.stderr) == (
        2,
        "hermes-bulk: unknown command 'frobnicate'; an instruction needs --over PATH.\n",
    )
    sentence = cli("Summarize this", check=False)
    assert sentence.returncode == 2 and "required: --over" in sentence.stderr, (
        "an instruction without --over"
    )
    (tmp_path / "a.txt").write_text("alpha")
    for first in ("Summarize", "frobnicate", "stauts"):
        made = cli(first, "--over", str(tmp_path / "a.txt"))
        assert made.stdout.startswith("Created job "), made.stdout
