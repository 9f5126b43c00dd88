"""Every request a /bulk job makes is charged to the budget: in real Hermes 0.19.0, a provider
answering 5xx is retried by Bulk (each attempt charged), not by Hermes behind the budget's back."""

from __future__ import annotations

from hermes_bulk.budget.service import Budget
from hermes_bulk.budget.settings import budget_dir

from .conftest import job_id_of, run_until_completed


def test_the_ledger_counts_what_reached_the_provider_when_it_answers_5xx(
    gateway, hermes_home, hermes_provider, tmp_path
):
    budget = Budget(
        budget_dir(hermes_home)
    )  # the root home: HERMES_HOME is no profile of ~/.hermes
    budget.settings_file.set(
        "daily_limit", "1000"
    )  # a budget is configured: bulk requests are charged
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        (src / f"{i}.txt").write_text(f"item {i}")
    hermes_provider.configure(script=["500", "502", "ok", "503"])
    gw = gateway()
    job = job_id_of(gw.bulk(f'"Summarize" --over {src} --concurrency 1 --retries 3'))
    run_until_completed(gw, job)
    try:
        charged = budget.report().counts.by_class()["bulk"]
    finally:
        budget.close()
    statuses = [r.status for r in hermes_provider.requests]
    assert sorted(statuses) == [200] * 4 + [500, 502, 503], statuses
    assert charged == len(statuses) == 7  # each attempt charged once; Hermes retried none unseen
