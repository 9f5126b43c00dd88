"""Who serves a job: `run JOB --wait` serves JOB alone; states say who the job waits for.

Real `hermes-bulk` processes (run --wait, status) on SQLite and on Redis, the loopback provider,
whose request log is the proof of what was sent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes_bulk.testing.fake_provider import digest

BACKENDS = ["sqlite", "redis"]


@pytest.fixture(params=BACKENDS)
def backend_env(request) -> dict[str, str]:
    if request.param == "sqlite":
        return {}
    return {"HERMES_BULK_BACKEND": request.getfixturevalue("redis_url")}


def _items(tmp_path: Path, name: str, n: int) -> tuple[Path, set[str]]:
    folder = tmp_path / name
    folder.mkdir()
    texts = [f"{name} item number {i}\n" for i in range(n)]
    for i, text in enumerate(texts):
        (folder / f"{i:03d}.txt").write_text(text)
    return folder, {digest(t) for t in texts}


def _create(cli, folder: Path, env, *flags: str) -> str:
    return cli.json("create", "Summarize", "--over", str(folder), *flags, "--json", **env)["job_id"]


def _status(cli, job_id, env):
    return cli.json("status", job_id, "--json", **env)


def test_run_wait_serves_only_the_job_it_names(cli, fake_provider, tmp_path, backend_env):
    """Job A was run with no worker alive; `run B --wait` answers B and none of A's items.
    A's triggers were queued first, so by the time B is done run --wait has met them all."""
    folder_a, items_a = _items(tmp_path, "alpha", 10)
    folder_b, items_b = _items(tmp_path, "beta", 4)
    job_a = _create(cli, folder_a, backend_env)
    job_b = _create(cli, folder_b, backend_env)
    cli("run", job_a, **backend_env)
    cli("run", job_b, "--wait", **backend_env)
    sent = {r.item for r in fake_provider.requests}
    assert items_b <= sent
    assert not sent & items_a, f"{len(sent & items_a)} of job A's items were sent by run B --wait"
    st = _status(cli, job_a, backend_env)
    assert st["completed"] == 0 and st["pending"] == 10, st
    assert st["state"] == "waiting_for_worker", st
    text = cli("status", job_a, **backend_env).stdout
    assert "waiting for a worker" in text.lower() and "hermes-bulk worker" in text, text
    # A's triggers were not lost: a background worker serves A now.
    worker = cli.spawn_worker("-w", "2", **backend_env)
    from .helpers import wait_for
    wait_for(lambda: _status(cli, job_a, backend_env)["completed"] == 10, timeout=60, message="A done")
    worker.terminate()
    worker.wait(30)
