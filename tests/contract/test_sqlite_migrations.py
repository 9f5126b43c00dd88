"""SQLite schema migrations: a database made by an older hermes-bulk opens, is brought up to
date in place, and keeps its jobs (store/sqlite/schema.py MIGRATIONS)."""

from __future__ import annotations

import sqlite3

import pytest

from hermes_bulk.fleet import broker
from hermes_bulk.store.sqlite.database import open_database
from hermes_bulk.store.sqlite.schema import MIGRATIONS


@pytest.mark.parametrize(
    "with_auto_since", [False, True], ids=["first-release", "auto-since-in-m001"]
)
def test_an_older_database_is_migrated_and_keeps_its_jobs(tmp_path, with_auto_since):
    path = tmp_path / "bulk.db"
    old = open_database(path, migrations=MIGRATIONS[:1])
    with old.write() as conn:
        if with_auto_since:  # m001 as one earlier version of main wrote it
            conn.execute("ALTER TABLE limits ADD COLUMN auto_since REAL NOT NULL DEFAULT 0")
        conn.execute("INSERT INTO limits (key, pause_until) VALUES ('k', 1e12)")
        conn.execute(
            "INSERT INTO jobs (id, created_at, spec, state, total) VALUES"
            " ('j1', 0, '{}', 'completed', 0)"
        )
    old.close()

    backend = broker.build_backend(f"sqlite:///{path}")
    try:
        assert backend.store.db.schema_version() == [name for name, _ in MIGRATIONS]
        columns = {row[1] for row in backend.store.db.read("PRAGMA table_info(limits)")}
        assert {"auto_since", "decreases"} <= columns
        # The limiter's short-lived state starts afresh; the jobs are untouched.
        turn = backend.limits.acquire("k", rpm=None, tpm=None, tokens=1)
        assert (turn.wait, turn.epoch) == (0.0, 0)
        assert backend.store.db.read("SELECT id, state FROM jobs") == [("j1", "completed")]
    finally:
        backend.close()

    # Opening it again applies nothing twice.
    again = open_database(path)
    assert again.schema_version() == [name for name, _ in MIGRATIONS]
    again.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM schema_migrations").fetchone()[0] == len(
            MIGRATIONS
        )


def test_batches_ended_before_their_final_status_was_kept_read_back_without_it(tmp_path):
    """m008: a batch row written by m005's schema opens with final_status None (it shows "done")."""
    path = tmp_path / "bulk.db"
    names = [name for name, _ in MIGRATIONS]
    old = open_database(path, migrations=MIGRATIONS[: names.index("m008_batch_final_status")])
    with old.write() as conn:
        conn.execute(
            "INSERT INTO batches (id, job_id, status, items, created_at, provider_id) VALUES"
            " ('b1', 'j1', 'done', 3, 1.0, 'batch_1')"
        )
    old.close()
    backend = broker.build_backend(f"sqlite:///{path}")
    try:
        (batch,) = backend.store.list_batches("j1")
        assert (batch.status, batch.final_status, batch.provider_id, batch.items) == (
            "done",
            None,
            "batch_1",
            3,
        )
    finally:
        backend.close()
