"""/bulk reuses earlier answers as the CLI does, and `/bulk … --fresh` asks again, in
real Hermes 0.19.0: the provider counts what was sent."""

from __future__ import annotations

from .conftest import job_id_of, run_until_completed


def test_bulk_reuses_answers_and_fresh_asks_again(gateway, hermes_provider, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"{i}.txt").write_text(f"item {i}")
    gw = gateway()
    first = job_id_of(gw.bulk(f'"Summarize" --over {src}'))
    run_until_completed(gw, first, "the first job")
    assert len(hermes_provider.requests) == 3
    (src / "3.txt").write_text("item 3")
    reply = gw.bulk(f'"Summarize" --over {src}')
    assert "with 4 items: 3 answered before (reused), 1 to run." in " ".join(reply.split())
    second = job_id_of(reply)
    run_until_completed(gw, second, "the second job")
    assert len(hermes_provider.requests) == 4, "only the new file was sent"
    fresh = gw.bulk(f'"Summarize" --over {src} --fresh')
    assert "reused" not in fresh and "with 4 items." in fresh, fresh
