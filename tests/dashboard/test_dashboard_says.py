"""What the dashboard says, in a real headless Chromium: a job whose items all failed is drawn
red, not green; its buttons answer in the page's words; and after the dashboard restarts with a
new token, an open tab asks for the token instead of showing a bare HTTP 403 over old figures."""

from __future__ import annotations

import urllib.parse

from ..helpers import wait_for
from .test_dashboard_browser import browser  # noqa: F401 - the fixture


def _bar_widths(browser, job_id: str) -> tuple[str, str] | None:
    return browser.evaluate(f"""(() => {{
        const bar = document.querySelector('tr[data-job="{job_id}"] .bar');
        if (!bar) return null;
        const done = bar.querySelector('.done'), failed = bar.querySelector('.failed');
        return [done ? done.style.width : '', failed ? failed.style.width : ''];
    }})()""")


def test_a_failed_job_is_drawn_failed_actions_speak_dashboard_and_a_restart_asks_for_the_token(
    cli,
    fake_provider,
    dashboard,
    browser,
    tmp_path,
):
    fake_provider.configure(item_faults={"BAD": "400"})
    folder = tmp_path / "items"
    folder.mkdir()
    for i in range(4):
        (folder / f"{i}.txt").write_text(f"BAD item {i}")
    job_id = cli.create("Summarize", folder, "--retries", "0")
    cli("run", job_id, "--wait", check=False)

    first = dashboard()
    browser.navigate(first.url)
    widths = wait_for(lambda: _bar_widths(browser, job_id), timeout=30, message="the job's bar")
    assert widths == ["0%", "100%"], "all four items failed: the bar is all red, none of it green"
    colours = browser.evaluate(f"""(() => {{
        const bar = document.querySelector('tr[data-job="{job_id}"] .bar');
        return [getComputedStyle(bar.querySelector('.done')).backgroundColor,
                getComputedStyle(bar.querySelector('.failed')).backgroundColor]; }})()""")
    assert colours[1] == "rgb(192, 57, 43)", colours

    browser.navigate(f"{first.base}/jobs/{job_id}")
    wait_for(
        lambda: browser.evaluate("!document.querySelector('#do-retry').disabled"),
        message="Retry enabled",
    )
    browser.click("#do-retry")
    said = wait_for(
        lambda: browser.evaluate("document.querySelector('#said').textContent") or None,
        timeout=30,
        message="the answer to Retry",
    )
    assert "4 failed items returned to the queue" in said and "hermes-bulk" not in said, said
    wait_for(
        lambda: browser.evaluate("!document.querySelector('#do-pause').disabled"),
        message="Pause enabled",
    )
    browser.click("#do-pause")
    said = wait_for(
        lambda: (
            "paused" in (t := browser.evaluate("document.querySelector('#said').textContent")) and t
        ),
        timeout=30,
        message="the answer to Pause",
    )
    assert "Press Resume" in said and "hermes-bulk" not in said, said

    # The dashboard restarts on the same port with a new token; the tab stays open
    port = urllib.parse.urlsplit(first.base).port
    first.stop()
    second = dashboard("--port", str(port))
    assert second.token != first.token
    wait_for(
        lambda: browser.evaluate("!!document.querySelector('#ask-token')"),
        timeout=30,
        message="the page to ask for the token",
    )
    text = browser.evaluate("document.body.innerText")
    assert "HTTP 403" not in text and "Token needed" in text
    assert browser.evaluate("document.querySelectorAll('#f-state, tr[data-job]').length") == 0, (
        "no stale figures"
    )

    browser.evaluate(f"document.querySelector('#token').value = {second.token!r}")
    browser.click("#token-go")
    wait_for(
        lambda: (
            browser.evaluate(
                "document.querySelector('#f-state') && "
                "document.querySelector('#f-state').textContent"
            )
            == "paused"
        ),
        timeout=30,
        message="the job's page again, with the new token",
    )
    assert browser.evaluate("location.search") == ""
