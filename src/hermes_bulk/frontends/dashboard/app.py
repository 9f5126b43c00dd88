"""The dashboard as a Starlette application: three pages, a JSON API, actions, static files.

The pages are one static HTML shell (static/index.html) and one script (static/dashboard.js)
that fetches the JSON API every two seconds and builds the page with textContent, never HTML
from data: an item's name or an instruction holding `<script>` shows as those characters. The
Content-Security-Policy allows scripts and styles from this origin only, so even a slip there
would run nothing. Actions are the CLI's own (replies.pause, resume, retry over the jobs API);
export downloads stream `export --output -` into the response: nothing is written to disk.
Every request goes through access.Access first.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
from collections.abc import Iterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import URL
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...durations import zoned_clock
from ...errors import HermesBulkError, InputError, InvalidTransition, JobNotFound, NoDatabase
from ...jobs.service import Jobs
from ...store.protocol import JobRecord
from ...words import count
from .. import replies
from .access import Access
from .figures import Figures, describe_failure

log = logging.getLogger("hermes_bulk.frontends.dashboard")
STATIC = Path(__file__).parent / "static"
JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
EXPORT_FORMATS = {"md": "text/markdown", "csv": "text/csv", "jsonl": "application/x-ndjson"}

#: Sent with every response: scripts, styles and fetches from this origin only; no framing; the
#: token in a URL never leaves in a Referer.
SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        b"img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]


class Guarded:
    """ASGI middleware: every request meets Access.check; every response gets SECURITY_HEADERS."""

    def __init__(self, app: ASGIApp, access: Access) -> None:
        self.app, self.access = app, access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        request = Request(scope)
        verdict = self.access.check(
            request.method, request.headers, request.cookies, request.query_params
        )
        if not verdict.allowed:
            await PlainTextResponse(verdict.reason, status_code=403)(scope, receive, send_secured)
        elif (
            verdict.from_query
        ):  # keep the token out of the address bar and history: a cookie from now on
            rest = URL(scope=scope).remove_query_params("token")
            # One leading slash: `//host/x` (or a slash then a backslash) names another site.
            path = "/" + rest.path.lstrip("/\\")
            response = RedirectResponse(
                path + (f"?{rest.query}" if rest.query else ""), status_code=303
            )
            response.set_cookie(
                self.access.cookie_name,
                self.access.token,
                httponly=True,
                samesite="strict",
                path="/",
            )
            await response(scope, receive, send_secured)
        else:
            await self.app(scope, receive, send_secured)


def build_app(jobs: Jobs, figures: Figures, access: Access) -> ASGIApp:
    async def page(request: Request) -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    async def api_jobs(request: Request) -> JSONResponse:
        return await _answer(figures.jobs_page)

    async def api_job(request: Request) -> JSONResponse:
        return await _answer(lambda: figures.job_page(_job_id(request)))

    async def api_workers(request: Request) -> JSONResponse:
        return await _answer(figures.workers_page)

    async def api_action(request: Request) -> JSONResponse:
        action = request.path_params["action"]
        act = ACTIONS.get(action)
        if act is None:
            return JSONResponse(
                {"error": f"No action {action!r}; the actions are pause, resume and retry."}, 404
            )
        return await _answer(lambda: {"message": act(jobs, _job_id(request))})

    async def api_export(request: Request) -> StreamingResponse | JSONResponse:
        fmt = request.query_params.get("format", "md")
        if fmt not in EXPORT_FORMATS:
            return JSONResponse({"error": f"format={fmt}: give md, csv or jsonl."}, 400)
        try:  # an unknown job is a 404, not a broken download
            job = await run_in_threadpool(lambda: jobs.get(_job_id(request)))
        except HermesBulkError as exc:
            return _failure(exc)
        return StreamingResponse(
            _export_chunks(jobs, job.job_id, fmt),
            media_type=EXPORT_FORMATS[fmt] + "; charset=utf-8",
            headers={"content-disposition": f'attachment; filename="job-{job.job_id}.{fmt}"'},
        )

    routes = [
        Route("/", page),
        Route("/workers", page),
        Route("/jobs/{job_id}", page),
        Route("/api/jobs", api_jobs),
        Route("/api/workers", api_workers),
        Route("/api/jobs/{job_id}", api_job),
        Route("/api/jobs/{job_id}/export", api_export),
        Route("/api/jobs/{job_id}/{action}", api_action, methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC)),
    ]
    return Guarded(Starlette(routes=routes), access)


def cookie_name(port: int) -> str:
    """Cookies are per host, not per port: two dashboards on one machine keep their own."""
    return f"hermes_bulk_dashboard_{port}"


def _job_id(request: Request) -> str:
    job_id = request.path_params["job_id"]
    if not JOB_ID.fullmatch(job_id):
        raise JobNotFound(f"No job {job_id!r}.")
    return job_id


async def _answer(read, *args) -> JSONResponse:
    """A read or an action run on a worker thread (the store is synchronous); errors as JSON."""
    try:
        return JSONResponse(await run_in_threadpool(read, *args))
    except HermesBulkError as exc:
        return _failure(exc)
    except Exception as exc:  # an outage mid-read: the page shows it and keeps polling
        return JSONResponse({"error": describe_failure(exc)}, 503)


def _failure(exc: HermesBulkError) -> JSONResponse:
    """Unknown job 404; an action the job's state refuses 409; the backend out of reach 503."""
    status = (
        404
        if isinstance(exc, JobNotFound | NoDatabase)
        else 409
        if isinstance(exc, InvalidTransition | InputError)
        else 503
    )
    return JSONResponse({"error": describe_failure(exc)}, status)


# The actions answer in the page's words: its buttons, not the CLI's commands.


def pause(jobs: Jobs, job_id: str) -> str:
    replies.pause(jobs, replies.Place(), job=job_id)
    return (
        f"Job {job_id} paused: no new items start; items in progress may finish. Press Resume "
        "to continue."
    )


def resume(jobs: Jobs, job_id: str) -> str:
    job = replies.resume(jobs, replies.Place(), job=job_id).data
    pending = count(job.pending, "item")
    return f"Job {job.job_id} resumed: {pending} pending. {_who_takes_it(jobs, job)}"


def retry(jobs: Jobs, job_id: str) -> str:
    job, n = jobs.retry(job_id)
    returned = f"Job {job.job_id}: {count(n, 'failed item')} returned to the queue."
    return (
        f"{returned} The job is paused: press Resume to continue."
        if job.state == "paused"
        else (f"{returned} {_who_takes_it(jobs, job)}")
    )


def _who_takes_it(jobs: Jobs, job: JobRecord) -> str:
    """Who serves the job now (live workers that take its items, fleet/endpoints' rule), and
    whether the request budget holds it: what replies.under_way says, in the page's words."""
    st = jobs.status(job.job_id)
    live = st.live_workers
    who = (
        f"{count(live, 'live worker')} {'takes' if live == 1 else 'take'} it up (see Workers)."
        if live
        else "No live worker serves it: the job waits until one starts (see Workers)."
    )
    held = st.budget_held_until
    if held is None or job.spec.mode == "batch":
        return who
    until = held.shown() if hasattr(held, "shown") else zoned_clock(held)
    return f"Nothing is sent before {until}: the request budget keeps the rest for chat. {who}"


#: What each button does, answered in the page's words.
ACTIONS = {"pause": pause, "resume": resume, "retry": retry}


class _QueueWriter:
    """A text stream that hands what is written to a bounded queue (the response reads it)."""

    def __init__(self, out: queue.Queue, stop: threading.Event) -> None:
        self.out, self.stop, self.buffer, self.size = out, stop, [], 0

    def write(self, text: str) -> int:
        if self.stop.is_set():
            raise BrokenPipeError("the download was cancelled")
        self.buffer.append(text)
        self.size += len(text)
        if self.size >= 64 * 1024:
            self.flush()
        return len(text)

    def flush(self) -> None:
        if self.buffer:
            chunk, self.buffer, self.size = "".join(self.buffer).encode(), [], 0
            while not self.stop.is_set():
                try:
                    self.out.put(chunk, timeout=0.5)
                    return
                except queue.Full:
                    continue


def _export_chunks(jobs: Jobs, job_id: str, fmt: str) -> Iterator[bytes]:
    """The export of `export --output -`, produced on its own thread and streamed as it comes:
    memory holds a few chunks, never the job."""
    out: queue.Queue = queue.Queue(maxsize=16)
    stop, done = threading.Event(), object()

    def produce() -> None:
        writer = _QueueWriter(out, stop)
        try:
            jobs.export_to_stream(job_id, writer, fmt=fmt)  # type: ignore[arg-type]
            writer.flush()
        except BrokenPipeError:
            pass
        except (
            Exception
        ) as exc:  # the backend went away mid-download: the download ends short, the log says why
            log.warning(
                "dashboard: the export of job %s stopped (%s)", job_id, describe_failure(exc)
            )
        finally:
            while not stop.is_set():
                try:
                    out.put(done, timeout=0.5)
                    break
                except queue.Full:
                    continue

    threading.Thread(target=produce, name="hermes-bulk-dashboard-export", daemon=True).start()
    try:
        while (chunk := out.get()) is not done:
            yield chunk
    finally:
        stop.set()
