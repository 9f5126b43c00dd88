"""Inside a real Hermes 0.19.0 TUI gateway: a provider that echoes Hermes' configured key.

Before any session exists, Hermes has no log handlers of its own and Python's last-resort
handler writes our warnings to the gateway's stderr; the plugin masks them at register().
"""

from __future__ import annotations

import sqlite3

from ..helpers import wait_for
from .conftest import config_set, job_id_of

KEY = "correct-horse-battery-staple"  # no known shape: only masking by value catches it


def test_provider_text_echoing_the_configured_key_is_masked_on_gateway_stderr(
    gateway, hermes_home, hermes_provider, tmp_path
):
    config_set(hermes_home, "model.api_key", KEY)
    # 400, not 401: a refused key pauses the whole job (runtime/breaker.py); here one item fails.
    hermes_provider.configure(
        item_faults={"LEAK": "400"},
        echo_credentials=True,
        error_echo=f"your key {KEY} is not valid",
    )
    src = tmp_path / "rows.jsonl"
    src.write_text('{"x": "fine"}\n{"x": "LEAK"}\n')
    gw = gateway()
    job = job_id_of(gw.bulk(f'"Classify" --over {src} --concurrency 1'))
    gw.bulk(f"run {job}")
    status = wait_for(
        lambda: (lambda s: s if "0 pending, 0 running" in s else None)(gw.bulk(f"status {job}")),
        timeout=60,
        interval=0.2,
        message="the job to end",
    )
    assert "1 failed" in status, status
    stderr = wait_for(
        lambda: (lambda text: text if "Hermes' model call failed" in text else None)(
            gw.log.read_text()
        ),
        timeout=10,
        message="the plugin's warning on the gateway's stderr",
    )
    assert "is not valid" in stderr, (
        "the provider's text was logged (masked), so the check below means something"
    )
    gw.close()
    data = hermes_home / "plugin-data" / "bulk"
    stored = "\n".join(
        p.read_bytes().decode("utf-8", "replace") for p in data.rglob("*") if p.is_file()
    )
    with sqlite3.connect(f"file:{data / 'bulk.db'}?mode=ro", uri=True) as db:
        stored += "\n".join(db.iterdump())
    ours = "\n".join(
        line
        for log in (hermes_home / "logs").glob("*.log")
        for line in log.read_text().splitlines()
        if "hermes_bulk" in line
    )
    for text in (gw.log.read_text(), stored, ours):
        assert KEY not in text
