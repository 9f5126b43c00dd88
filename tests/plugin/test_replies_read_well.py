"""/bulk help and /cron-budget status as real Hermes 0.19.0 hands them to its TUI (issue 46, point
13): each line fits the width Hermes' TUI shows a reply in at 80 columns (its transcript and its
pager frame take 6 to 7 of them, and it breaks a wider line again), and prose is broken once, as
a fill breaks it: a line never ends where the next line's first word would still have fitted
(the help was written broken at one width and then wrapped again at another)."""

from __future__ import annotations

from hermes_bulk.budget.ledger import CallRecord
from hermes_bulk.budget.service import Budget
from hermes_bulk.budget.settings import budget_dir

from .conftest import hermes

WIDTH = 72  #: Hermes' TUI at 80 columns shows 73 in its transcript, 74 in its pager


def _ragged(lines: list[str]) -> list[tuple[str, str]]:
    """Pairs of lines of one paragraph where the second's first word would have fitted on the
    first: what a second wrapping leaves."""
    return [
        (a, b)
        for a, b in zip(lines, lines[1:], strict=False)
        if a and b.strip() and len(a) + 1 + len(b.split()[0]) <= WIDTH
    ]


def test_bulk_help_and_cron_budget_status_read_well_in_hermes(gateway, hermes_home):
    hermes(hermes_home, "plugins", "enable", "cron-budget", "--no-allow-tool-override")
    budget = Budget(budget_dir(hermes_home))
    try:
        budget.settings_file.set("timezone", "America/Argentina/Buenos_Aires")
        budget.settings_file.set("models", "*:free,gpt-4o-mini,claude-3-5-haiku-*")
        budget.settings_file.set("job_limit", "50")
        for i in range(3):
            budget.admit(
                CallRecord(
                    "cron",
                    profile="a-profile-with-a-long-name",
                    job_id="a1b2c3d4e5f6",
                    job_name="Morning digest of every feed I follow, summarised",
                    run_id=f"r{i}",
                    model="gpt-4o-mini",
                )
            )
        budget.admit(CallRecord("auxiliary", model="gpt-4o"))  # outside the globs
        budget.notes.note(
            budget.window(budget.settings()).start_s, "the ledger is not answering (locked)"
        )
        gw = gateway()
        help_text = gw.bulk("help")
        status = gw.slash("cron-budget", "status")
    finally:
        budget.close()

    for text in (help_text, status):
        wide = [line for line in text.splitlines() if len(line) > WIDTH]
        assert not wide, text
    paragraphs = help_text.split("\n\n")
    prose = [paragraphs[0], paragraphs[1], paragraphs[-1]]  # the commands between are usages
    assert prose[0].startswith("Bulk: apply one instruction to many files, CSV rows or JSON")
    for paragraph in prose:
        assert not _ragged(paragraph.splitlines()), paragraph
    assert "Morning digest of…" not in status and "Morning digest o…" in status
    assert "Not counted: 1 request, whose model was outside the models setting at" in status
    assert "Settings: mode=observe, daily_limit=1000, chat_reserve=300," in status
