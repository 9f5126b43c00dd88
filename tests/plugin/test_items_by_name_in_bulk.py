"""/bulk names items as `hermes-bulk` does: events, `show JOB ITEM`, `status --failed` (real
Hermes)."""

from __future__ import annotations

from .conftest import job_id_of
from .test_bulk_plugin import wait_for_state


def test_bulk_shows_one_item_and_names_items_in_events(gateway, hermes_provider, tmp_path):
    src = tmp_path / "notes"
    (src / "2026").mkdir(parents=True)
    (src / "2026" / "q1.txt").write_text("first quarter\n")
    (src / "2026" / "q2.txt").write_text("second PERMANENT-400 quarter\n")
    hermes_provider.configure(item_faults={"PERMANENT-400": "400"})
    gw = gateway()
    job = job_id_of(gw.bulk(f'"Summarise" --over {src}'))
    gw.bulk(f"run {job}")
    wait_for_state(gw, job, "completed with errors")
    failed_lines = [
        line for line in gw.bulk(f"events {job}").splitlines() if " item_failed " in line
    ]
    assert len(failed_lines) == 1 and " item_failed 2026/q2.txt" in failed_lines[0], failed_lines
    assert "item 2" not in failed_lines[0]

    shown = gw.bulk(f"show {job} 2026/q2.txt")
    assert shown.startswith(f"Item 2026/q2.txt (number 2 of job {job})\nState: failed\n"), shown
    assert "----- BEGIN ITEM " in shown and "second PERMANENT-400 quarter" in shown
    assert gw.bulk(f"show {job} 1").startswith(
        f"Item 2026/q1.txt (number 1 of job {job})\nState: completed\n"
    )
    listed = gw.bulk(f"status {job} --failed")
    assert listed.splitlines()[1].startswith("  2026/q2.txt: "), listed
    assert f"/bulk show {job} ITEM" in listed
    assert "has no item 'nope'" in gw.bulk(f"show {job} nope")
