"""The dashboard's HTTP side, on both backends: a real `hermes-bulk dashboard` process, real
requests. What the pages show, that the token is needed everywhere, that actions need the same
origin and go through to the store, and the start-up rules (loopback, token, a busy port)."""

from __future__ import annotations

import csv
import io
import json
import signal
import socket

import httpx

from ..helpers import wait_for
from .conftest import HOSTILE_NAME, TOKEN


def test_pages_show_the_job_its_failed_item_and_the_workers(
    backend_env, cli, dashboard, job_with_a_failure, jobs
):
    job_id = job_with_a_failure
    worker = cli.spawn_worker("-w", "3")
    try:
        d = dashboard(HERMES_BULK_DASHBOARD_TOKEN=TOKEN)
        with d.client() as c:
            row = next(j for j in c.get("/api/jobs").json()["jobs"] if j["job_id"] == job_id)
            assert (
                row["total"],
                row["completed"],
                row["failed"],
                row["pending"],
                row["state"],
            ) == (7, 6, 1, 0, "completed_with_errors")
            assert row["progress"] == 1.0 and row["actions"] == {
                "pause": False,
                "resume": False,
                "retry": True,
            }
            assert row["instruction"] == "Summarize <b>this</b>"
            assert row["cost_shown"] == "unknown", "the loopback's model has no price"
            page = c.get(f"/api/jobs/{job_id}").json()
            assert page["failed_items"] == [
                {
                    "number": page["failed_items"][0]["number"],
                    "name": HOSTILE_NAME,
                    "error": page["failed_items"][0]["error"],
                    "attempts": 0,
                }
            ]
            assert "HTTP 400" in page["failed_items"][0]["error"]
            assert any(
                e["kind"] == "item_failed" and e["item"] == HOSTILE_NAME for e in page["events"]
            )
            assert page["series"][-1][1:] == [6, 1]
            workers = wait_for(
                lambda: c.get("/api/workers").json()["workers"], message="the worker shows"
            )
            assert [(w["threads"], w["answering"], w["holding"]) for w in workers] == [(3, True, 0)]
            assert workers[0]["host"] == socket.gethostname()
            for path in (
                "/",
                "/workers",
                f"/jobs/{job_id}",
                "/static/dashboard.js",
                "/static/dashboard.css",
            ):
                response = c.get(path)
                assert response.status_code == 200, path
                assert "script-src 'self'" in response.headers["content-security-policy"]
            assert c.get("/api/jobs/nosuchjob").status_code == 404
    finally:
        worker.terminate()
        worker.wait(30)
    assert jobs.get(job_id).failed == 1, "reading changed nothing"


def test_every_request_needs_the_token_and_the_url_token_becomes_a_cookie(
    backend_env, cli, dashboard, job_with_a_failure
):
    d = dashboard(HERMES_BULK_DASHBOARD_TOKEN=TOKEN)
    with d.client(token=False) as c:
        for path in (
            "/",
            "/api/jobs",
            f"/api/jobs/{job_with_a_failure}",
            "/api/workers",
            "/static/dashboard.js",
            f"/api/jobs/{job_with_a_failure}/export?format=csv",
        ):
            assert c.get(path).status_code == 403, path
            assert (
                c.get(path, headers={"Authorization": "Bearer not-the-token"}).status_code == 403
            ), path
            cookie = f"hermes_bulk_dashboard_{d.base.rsplit(':', 1)[1]}=wrong"
            assert c.get(path, headers={"Cookie": cookie}).status_code == 403, path
        assert c.get("/?token=wrong").status_code == 403
        first = c.get(f"/workers?token={TOKEN}")
        assert first.status_code == 303 and first.headers["location"] == "/workers"
        cookie = first.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        assert c.get("/api/jobs").status_code == 200, "the cookie from now on"


def test_actions_need_the_token_and_the_same_origin_and_reach_the_store(
    backend_env, cli, dashboard, jobs, job_with_a_failure, tmp_path
):
    job_id = cli.create(
        "Do", tmp_path / "items"
    )  # not started: pause, resume work without a worker
    d = dashboard(HERMES_BULK_DASHBOARD_TOKEN=TOKEN)
    host = d.base.removeprefix("http://")
    with httpx.Client(base_url=d.base, timeout=10) as c:
        assert c.post(f"/api/jobs/{job_id}/pause").status_code == 403
        c.get(f"/?token={TOKEN}")  # the cookie a browser holds
        for origin in ("http://evil.example", "null", f"http://{host}.evil.example"):
            refused = c.post(f"/api/jobs/{job_id}/pause", headers={"Origin": origin})
            assert refused.status_code == 403 and "same origin" in refused.text
        cross = c.post(
            f"/api/jobs/{job_id}/pause",
            headers={"Origin": f"http://{host}", "Sec-Fetch-Site": "cross-site"},
        )
        assert cross.status_code == 403
        assert c.post(f"/api/jobs/{job_id}/pause").status_code == 403, (
            "a cookie without an Origin: a form, not the page"
        )
        assert jobs.get(job_id).state == "not_started", "nothing refused changed the job"

        ok = c.post(
            f"/api/jobs/{job_id}/pause",
            headers={"Origin": f"http://{host}", "Sec-Fetch-Site": "same-origin"},
        )
        assert ok.status_code == 200 and ok.json()["message"].startswith(f"Job {job_id} paused")
        assert jobs.get(job_id).state == "paused"
        again = c.post(f"/api/jobs/{job_id}/pause", headers={"Origin": f"http://{host}"})
        assert again.status_code == 409 and "already paused" in again.json()["error"]
        assert (
            c.post(f"/api/jobs/{job_id}/resume", headers={"Origin": f"http://{host}"}).status_code
            == 200
        )
        assert jobs.get(job_id).state == "running"
    with d.client() as scripted:  # a script with the Bearer header: no Origin needed
        assert scripted.post(f"/api/jobs/{job_id}/pause").status_code == 200
        assert jobs.get(job_id).state == "paused"
        retried = scripted.post(f"/api/jobs/{job_with_a_failure}/retry")
        assert (
            retried.status_code == 200
            and "1 failed item returned to the queue" in retried.json()["message"]
        )
        assert jobs.get(job_with_a_failure).failed == 0
        assert scripted.post(f"/api/jobs/{job_id}/explode").status_code == 404


def test_export_downloads_stream_the_results(backend_env, cli, dashboard, job_with_a_failure):
    d = dashboard(HERMES_BULK_DASHBOARD_TOKEN=TOKEN)
    with d.client() as c:
        response = c.get(f"/api/jobs/{job_with_a_failure}/export?format=csv")
        assert response.status_code == 200
        assert (
            response.headers["content-disposition"]
            == f'attachment; filename="job-{job_with_a_failure}.csv"'
        )
        rows = list(csv.DictReader(io.StringIO(response.text)))
        assert len(rows) == 7 and sum(r["status"] == "failed" for r in rows) == 1
        lines = c.get(f"/api/jobs/{job_with_a_failure}/export?format=jsonl").text.splitlines()
        assert [json.loads(line)["item"] for line in lines if HOSTILE_NAME in line] == [
            HOSTILE_NAME
        ]
        assert c.get(f"/api/jobs/{job_with_a_failure}/export?format=exe").status_code == 400
        assert c.get("/api/jobs/nosuchjob/export?format=csv").status_code == 404


def test_start_up_refuses_another_address_without_a_token_and_a_busy_port(cli, dashboard):
    for args, env in (
        (["--host", "0.0.0.0"], {}),
        (["--host", "::"], {}),
        (["--host", "127.0.0.1"], {"HERMES_BULK_DASHBOARD_TOKEN": "short"}),
    ):
        proc = cli("dashboard", "--port", "0", *args, check=False, **env)
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        assert proc.stderr.count("\n") == 1 and "HERMES_BULK_DASHBOARD_TOKEN" in proc.stderr
    d = dashboard()  # loopback, no token set: a new one, printed
    assert len(d.token) >= 16 and d.url == f"{d.base}/?token={d.token}"
    with d.client() as c:
        assert c.get("/api/jobs").json()["jobs"] == []
    busy = cli("dashboard", "--port", d.base.rsplit(":", 1)[1], check=False)
    assert (
        busy.returncode == 1
        and "cannot listen there" in busy.stderr
        and busy.stderr.count("\n") == 1
    )
    other = dashboard(
        "--host", "0.0.0.0", HERMES_BULK_DASHBOARD_TOKEN=TOKEN
    )  # with a token: served
    assert other.token == TOKEN
    for served, sig in (
        (d, signal.SIGINT),
        (other, signal.SIGTERM),
    ):  # Ctrl-C, or a service manager's stop
        served.stop(sig)
        assert served.proc.returncode == 0 and served.lines[-1] == "Dashboard stopped.", (
            served.lines
        )


def test_the_page_loads_nothing_from_elsewhere_and_ships_in_the_package():
    import fnmatch
    import re
    import tomllib
    from pathlib import Path

    import hermes_bulk.frontends.dashboard as package

    static = Path(package.__file__).parent / "static"
    files = sorted(p.name for p in static.iterdir())
    assert files == ["dashboard.css", "dashboard.js", "index.html"]
    html = (static / "index.html").read_text()
    assert re.findall(r'(?:src|href)="([^"]+)"', html) == [
        "/static/dashboard.css",
        "/static/dashboard.js",
        "/",
        "/workers",
    ]
    for name in files:  # no URL of another host anywhere: the page works offline
        text = (static / name).read_text()
        assert not re.search(
            r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text.replace("http://www.w3.org/2000/svg", "")
        ), name
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    shipped = pyproject["tool"]["setuptools"]["package-data"]["hermes_bulk"]
    assert all(
        any(fnmatch.fnmatch(f"frontends/dashboard/static/{name}", glob) for glob in shipped)
        for name in files
    )


def test_a_running_job_shows_its_rate_its_time_to_finish_and_the_rate_limit_wait(
    backend_env, cli, dashboard, fake_provider, tmp_path
):
    fake_provider.configure(latency_s=0.3)
    src = tmp_path / "items.jsonl"
    src.write_text("".join(f'{{"n": {i}}}\n' for i in range(80)))
    job_id = cli.create("Do", src, "--concurrency", "2")
    d = dashboard(HERMES_BULK_DASHBOARD_TOKEN=TOKEN)
    worker = cli.spawn_worker("-w", "2")
    try:
        cli("run", job_id)
        with d.client() as c:

            def row():
                return next(j for j in c.get("/api/jobs").json()["jobs"] if j["job_id"] == job_id)

            moving = wait_for(
                lambda: (r := row())["items_per_minute"] and r["eta_s"] and r,
                timeout=90,
                message="a rate and a time to finish",
            )
            assert moving["state"] == "processing" and moving["items_per_minute"] > 0
            left = moving["total"] - moving["completed"] - moving["failed"]
            assert abs(moving["eta_s"] - left * 60 / moving["items_per_minute"]) < 1e-6
            fake_provider.configure(script=["429:30"])  # the next request is told to wait 30 s
            waiting = wait_for(
                lambda: (r := row())["rate_limited_until"] and r, timeout=60, message="the 429 wait"
            )
            assert waiting["rate_limited_until"] > c.get("/api/jobs").json()["now"] + 10
            assert (
                c.get(f"/api/jobs/{job_id}").json()["job"]["rate_limited_until"]
                == waiting["rate_limited_until"]
            )
    finally:
        worker.terminate()
        worker.wait(30)
