"""A job's end is news: in a real Hermes 0.19.0 TUI gateway, the next /bulk reply says how a
job started from /bulk ended (once); and the words of /bulk count right."""

from __future__ import annotations

import re

from ..helpers import wait_for
from .conftest import job_id_of


def _replies_until(gw, needle: str, timeout: float = 60) -> list[str]:
    """`/bulk list` until a reply holds needle; every reply, in order."""
    replies: list[str] = []

    def seen() -> bool:
        replies.append(gw.bulk("list"))
        return " ".join(needle.split()) in " ".join(replies[-1].split())  # however wrapped

    wait_for(seen, timeout=timeout, interval=0.3, message=needle)
    return replies


def test_the_next_reply_tells_once_how_a_job_ended(gateway, hermes_provider, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "only.txt").write_text("the only item")
    gw = gateway()
    created = gw.bulk(f'"Summarize" --over {src}')
    job = job_id_of(created)
    assert created.startswith(f"Created job {job} with 1 item.\n")
    assert gw.bulk(f"run {job}").startswith(
        f"Job {job} is running in the background: 1 item pending, "
    )

    notice = f"Job {job} ended: completed (1/1 item completed, 0 failed).\nNext: /bulk export {job}"
    replies = _replies_until(gw, notice)
    assert replies[-1].startswith(notice + "\n\n")  # news first, then the answer
    assert sum(notice in r for r in replies) == 1
    assert notice not in gw.bulk("list")  # told once

    again = job_id_of(gw.bulk(f'"Summarize" --over {src}'))
    gw.bulk(f"run {again}")

    def completed_status() -> str | None:
        reply = gw.bulk(f"status {again}")
        return reply if "State: completed" in reply else None

    status = wait_for(completed_status, timeout=60, interval=0.3, message="completed")
    assert status.startswith(
        f"Job {again}: completed\n"
    )  # a status showing the end is the news itself
    assert f"Job {again} ended" not in gw.bulk("list")

    assert gw.bulk(f"pause {job}") == f"Job {job} is already completed; nothing changed."


def test_a_job_paused_at_its_token_limit_is_news_a_job_the_user_paused_is_not(
    gateway, hermes_provider, tmp_path
):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"{i}.txt").write_text(f"item {i} " * 50)
    gw = gateway()
    # A limit that fits one item's worst case and a little more: the first item runs, and what
    # it is charged leaves no room for the next one's worst case.
    plan = " ".join(gw.bulk(f'"Summarize" --over {src} --dry-run').split())
    per_item = int(re.search(r"At most ([\d,]+) tokens", plan).group(1).replace(",", "")) // 3
    limited = job_id_of(gw.bulk(f'"Summarize" --over {src} --max-tokens {per_item + 10}'))
    gw.bulk(f"run {limited}")
    replies = _replies_until(
        gw,
        f"Job {limited} paused at its token limit (1/3 items completed, 0 failed).\n"
        f"Continue with: /bulk resume {limited} --max-tokens <n>",
    )
    assert replies

    hermes_provider.configure(latency_s=1.0)
    paused = job_id_of(gw.bulk(f'"Summarize" --over {src}'))
    gw.bulk(f"run {paused}")
    assert gw.bulk(f"pause {paused}").startswith(f"Job {paused} paused: ")
    assert "State: paused" in gw.bulk(f"status {paused}")
    reply = gw.bulk("list")
    assert f"Job {paused} " not in reply and "paused at" not in reply, reply
