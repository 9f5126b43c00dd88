"""The dashboard in a real headless Chromium, over a job that runs, on both backends (the HTTP
side, in more detail, is test_dashboard_http.py).

A person opens the printed URL: the job's row appears and its progress moves without a reload;
they open the job and press Pause, and the job is paused in the store; a page of another site
that posts to the dashboard changes nothing; a request without the token is refused; the item
whose name and content hold `<script>` shows as text and runs nothing.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Iterator

import pytest

from ..conftest import IN_CI
from ..helpers import wait_for
from .browser import Browser, chromium_path
from .conftest import HOSTILE_NAME, TOKEN, make_folder


@pytest.fixture
def browser() -> Iterator[Browser]:
    exe = chromium_path()
    if exe is None:
        if IN_CI:
            raise RuntimeError("chromium is not installed; scripts/test installs it")
        pytest.skip("chromium is not installed (scripts/test installs it)")
    b = Browser(exe)
    yield b
    b.close()


def settled(browser: Browser, job_id: str) -> int | None:
    text = browser.evaluate(f"""(() => {{
        const row = document.querySelector('tr[data-job="{job_id}"] [data-field="progress"]');
        return row ? row.textContent : null; }})()""")
    return int(re.match(r"(\d+)/", text)[1]) if text else None


def test_a_person_watches_a_running_job_pauses_it_and_nothing_hostile_runs(
    backend_env, cli, jobs, fake_provider, dashboard, browser, tmp_path
):
    # Given a job of 41 items that takes some seconds (two at a time, 0.4 s each), running on a
    # worker
    fake_provider.configure(item_faults={"PERMANENT-400": "400"}, latency_s=0.4)
    job_id = cli.create(
        "Summarize <b>this</b>",
        make_folder(tmp_path / "items", 40),
        "--retries",
        "0",
        "--concurrency",
        "2",
    )
    d = dashboard(HERMES_BULK_DASHBOARD_TOKEN=TOKEN)
    worker = cli.spawn_worker("-w", "2")
    try:
        cli("run", job_id)

        # When a person opens the printed URL, the job's row appears
        browser.navigate(d.url)
        assert browser.evaluate("location.search") == "", "the token left the address bar"
        first = (
            wait_for(
                lambda: settled(browser, job_id) is not None and settled(browser, job_id) + 1,
                timeout=30,
                message="the job's row",
            )
            - 1
        )
        browser.evaluate("window.__same_page = true")
        # and its progress moves, on the same page (no reload)
        wait_for(
            lambda: (settled(browser, job_id) or 0) > first, timeout=60, message="progress to move"
        )
        assert browser.evaluate("window.__same_page") is True

        # When they open the job and press Pause, the job is paused in the store
        browser.click(f'tr[data-job="{job_id}"] a')
        wait_for(
            lambda: browser.evaluate("location.pathname") == f"/jobs/{job_id}",
            message="the job's page",
        )
        wait_for(
            lambda: browser.evaluate(
                "!!document.querySelector('#do-pause') && "
                "!document.querySelector('#do-pause').disabled"
            ),
            message="Pause enabled",
        )
        browser.click("#do-pause")
        wait_for(
            lambda: jobs.get(job_id).state == "paused",
            timeout=30,
            message="the job paused in the store",
        )
        assert jobs.get(job_id).pause_reason == "user"
        wait_for(
            lambda: "paused" in browser.evaluate("document.querySelector('#said').textContent"),
            message="the page says so",
        )
        wait_for(
            lambda: browser.evaluate("document.querySelector('#f-state').textContent") == "paused",
            message="the state shown",
        )
        assert jobs.get(job_id).completed + jobs.get(job_id).failed < 41, "paused while it ran"
        assert browser.evaluate("document.querySelector('#f-cost').textContent") == "unknown"

        # The hostile item failed: its name shows as text, and nothing of it ran or was parsed
        wait_for(
            lambda: browser.evaluate("document.querySelectorAll('.item-name').length") == 1,
            message="the failed item listed",
        )
        assert browser.evaluate("document.querySelector('.item-name').textContent") == HOSTILE_NAME
        assert (
            browser.evaluate("document.querySelector('#instruction').textContent")
            == "Summarize <b>this</b>"
        )
        assert browser.evaluate("typeof window.__pwned") == "undefined"
        assert browser.evaluate("document.scripts.length") == 1, "only the dashboard's own script"
        assert (
            browser.evaluate(
                "document.querySelectorAll('img, #instruction *, .item-name *, main script').length"
            )
            == 0
        )
        assert HOSTILE_NAME in browser.evaluate("document.body.innerText")

        # A request without the token is refused, even from the dashboard's own page
        no_token = browser.evaluate("fetch('/api/jobs', {credentials: 'omit'}).then(r => r.status)")
        assert no_token == 403
        assert (
            browser.evaluate(
                f"fetch('/api/jobs/{job_id}', {{credentials: 'omit'}}).then(r => r.status)"
            )
            == 403
        )

        # A page of another site that posts to the dashboard (a form, and fetch) resumes nothing
        action = f"{d.base}/api/jobs/{job_id}/resume"
        hostile_page = (
            "<form method=post action='"
            + action
            + "'></form><script>fetch('"
            + action
            + "', {method: "
            "'POST', mode: 'no-cors', credentials: 'include'}).finally(() => "
            "document.forms[0].submit())"
            "</script>"
        )
        browser.navigate("data:text/html," + urllib.parse.quote(hostile_page))
        wait_for(
            lambda: browser.evaluate("location.href").startswith(d.base),
            timeout=30,
            message="the form to post",
        )
        assert "Refused" in browser.evaluate(
            "document.body.innerText"
        ) or "needs its access token" in browser.evaluate("document.body.innerText")
        assert jobs.get(job_id).state == "paused", "another site's page could not resume the job"

        # Resume from the page works (the same origin, with the token's cookie)
        browser.navigate(f"{d.base}/jobs/{job_id}")
        wait_for(
            lambda: browser.evaluate("!document.querySelector('#do-resume').disabled"),
            message="Resume enabled",
        )
        browser.click("#do-resume")
        wait_for(
            lambda: jobs.get(job_id).state == "running", timeout=30, message="resumed in the store"
        )
        shown = json.loads(browser.evaluate("fetch('/api/jobs').then(r => r.text())"))
        assert any(j["job_id"] == job_id for j in shown["jobs"])
    finally:
        worker.terminate()
        worker.wait(30)
