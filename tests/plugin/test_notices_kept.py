"""A job's end reaches the Hermes user once, even across a gateway restart (real Hermes 0.19.0);
and a mistyped /bulk command word is named as one, not read as an instruction."""

from __future__ import annotations

import json
import stat

from ..helpers import wait_for
from .conftest import job_id_of
from .test_gateway_shows_what_runs import cli_env, status_json


def test_a_job_that_ended_before_a_gateway_restart_is_told_once_after_it(
    gateway, hermes_home, hermes_provider, tmp_path
):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(2):
        (src / f"{i}.txt").write_text(f"item {i}")
    first = gateway()
    job = job_id_of(first.bulk(f'"Summarize" --over {src}'))
    assert first.bulk(f"run {job}").startswith(f"Job {job} is running in the background")
    env = cli_env(hermes_home, hermes_provider)
    wait_for(
        lambda: status_json(env, job)["state"] == "completed",
        timeout=60,
        message="the job completed",
    )
    first.close()  # the gateway restarts before the user asks anything

    second = gateway()
    notice = (
        f"Job {job} ended: completed (2/2 items completed, 0 failed).\nNext: /bulk export {job}"
    )
    reply = second.bulk("list")
    assert reply.startswith(notice + "\n\n"), reply
    assert notice not in second.bulk("list"), "told once"
    book = hermes_home / "plugin-data" / "bulk" / "notices.json"
    assert stat.S_IMODE(book.stat().st_mode) == 0o600, "the notices are the owner's alone"
    second.close()
    assert notice not in gateway().bulk("list"), "told once, also after another restart"


def test_a_mistyped_command_word_is_an_unknown_command_in_bulk(gateway, hermes_home, tmp_path):
    (tmp_path / "a.txt").write_text("alpha")
    gw = gateway()
    assert gw.bulk("stauts abc") == "unknown command 'stauts'; did you mean 'status'?"
    assert (
        gw.bulk("frobnicate") == "unknown command 'frobnicate'; an instruction needs --over PATH."
    )
    created = gw.bulk(f'"Summarize" --over {tmp_path / "a.txt"}')
    assert created.startswith("Created job "), created
    assert gw.bulk(f"frobnicate --over {tmp_path / 'a.txt'}").startswith("Created job ")


def test_every_bulk_reply_fits_80_columns(gateway, hermes_home, hermes_provider, tmp_path):
    src = tmp_path / "reports"
    src.mkdir()
    for i in range(3):
        (src / f"{i}.txt").write_text(f"item {i}")
    gw = gateway()
    instruction = (
        "Summarize this quarterly report in three bullet points for the board of directors"
    )
    created = gw.bulk(f'"{instruction}" --over {src}')
    job = job_id_of(created)
    replies = [created, gw.bulk(""), gw.bulk(f"run {job}")]
    env = cli_env(hermes_home, hermes_provider)
    wait_for(
        lambda: status_json(env, job)["state"] == "completed",
        timeout=60,
        message="the job completed",
    )
    replies += [
        gw.bulk("list"),
        gw.bulk(f"status {job}"),
        gw.bulk(f"status {job} --events 5"),
        gw.bulk(f"show {job} 0.txt"),
        gw.bulk(f"export {job}"),
        gw.bulk("stauts"),
        gw.bulk("status --help"),
    ]
    for reply in replies:
        # A single word longer than a line (a path) stays whole, to be copied.
        wide = [line for line in reply.splitlines() if len(line) > 80 and " " in line.strip()]
        assert not wide, "\n".join(wide)
    status = gw.bulk(f"status {job}")
    assert (
        "Items: 3/3 completed, 0 failed" in status
        and "Estimated tokens for the whole job: " in status
    )


#: A real 0.19.0 TUI gateway given what newer gateways have: inject_message(..., session_key=)
#: and a session key for the turn. Each message posted is a line of POSTED.
NEWER_GATEWAY = """
import json, runpy
import gateway.session_context as session_context
import hermes_cli.plugins as plugins
_get = session_context.get_session_env
session_context.get_session_env = lambda name, default="": (
    "agent:main:tui:test" if name == "HERMES_SESSION_KEY" else _get(name, default))
def inject_message(self, content, role="user", *, session_key=None):
    with open({posted!r}, "a") as f:
        f.write(json.dumps({{"content": content, "session_key": session_key}}) + "\\n")
    return True
plugins.PluginContext.inject_message = inject_message
runpy.run_module("tui_gateway.entry", run_name="__main__", alter_sys=True)
"""


def test_where_hermes_can_post_into_the_session_a_job_end_is_posted_there_once(
    gateway, hermes_home, hermes_provider, tmp_path
):
    src = tmp_path / "src"
    src.mkdir()
    (src / "only.txt").write_text("the only item")
    posted = tmp_path / "posted.jsonl"
    gw = gateway(argv=["-c", NEWER_GATEWAY.format(posted=str(posted))])
    job = job_id_of(gw.bulk(f'"Summarize" --over {src}'))
    gw.bulk(f"run {job}")
    wait_for(
        lambda: posted.exists() and posted.read_text().strip(),
        timeout=60,
        message="a message posted",
    )
    messages = [json.loads(line) for line in posted.read_text().splitlines()]
    assert messages == [
        {
            "content": f"Job {job} ended: completed (1/1 item completed, 0 failed).\n"
            f"Next: /bulk export {job}",
            "session_key": "agent:main:tui:test",
        }
    ]
    assert f"Job {job} ended" not in gw.bulk("list"), "posted, so not told again in a reply"
    assert len(posted.read_text().splitlines()) == 1
