"""What a benchmark runs in a child process (each measured side has a process of its own).

    python -m bench.drive pool --source F --threads N       the bare thread-pool baseline (--client)
    python -m bench.drive run JOB --threads N               hermes-bulk `run --wait`, timed by the
    store
    python -m bench.drive run JOB --external K              `run`, with K `hermes-bulk worker`s
    already up
    python -m bench.drive fill JOB                          complete every item through the store
    API
    python -m bench.drive admit --factory M:F …             time budget admissions (row 5)

Each prints one JSON object on its last line. Settings come from the environment
(HERMES_BULK_*), as for `hermes-bulk` itself.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from concurrent.futures import ThreadPoolExecutor

INSTRUCTION = "Summarize this item in one line"


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def pool(args: argparse.Namespace) -> dict:
    """A bare thread pool making the calls hermes-bulk makes, with the same request body.

    --client hermes (the baseline): hermes-bulk's own HttpModelClient, as its workers build it
    (httpx, one connection per thread); the difference to hermes-bulk is then all dispatch.
    --client shared: one httpx.Client with a pool of --threads connections, as one would write
    it by hand.
    """
    import httpx

    from hermes_bulk.jobs import prompt
    from hermes_bulk.providers.client import HttpModelClient
    from hermes_bulk.sources import Source, content_hash

    items = [(e.name, e.content) for e in Source(args.source, max_item_bytes=1 << 22).entries()]
    url = args.base_url.rstrip("/")
    if args.client == "hermes":
        client = HttpModelClient(
            base_url=url,
            api_key="sk-bench-not-a-secret",
            model="fake-model",
            timeout_s=120.0,
            max_connections=max(4, args.threads),
        )

        def call(item: tuple[str, str]) -> bool:
            name, content = item
            messages = prompt.build_messages(INSTRUCTION, name, content, content_hash(content))
            return bool(client.complete(messages, max_tokens=None).text)
    else:
        client = httpx.Client(
            headers={"Authorization": "Bearer sk-bench-not-a-secret"},
            timeout=httpx.Timeout(120.0, connect=10.0),
            limits=httpx.Limits(
                max_connections=max(4, args.threads), max_keepalive_connections=max(4, args.threads)
            ),
        )

        def call(item: tuple[str, str]) -> bool:
            name, content = item
            body = {
                "model": "fake-model",
                "messages": prompt.build_messages(
                    INSTRUCTION, name, content, content_hash(content)
                ),
            }
            response = client.post(url + "/chat/completions", json=body)
            return response.status_code == 200 and bool(
                response.json()["choices"][0]["message"]["content"]
            )

    cpu0, t0 = _cpu_s(), time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.threads) as executor:
        ok = sum(executor.map(call, items))
    elapsed = time.perf_counter() - t0
    client.close()
    return {"elapsed_s": elapsed, "items": len(items), "ok": ok, "cpu_s": _cpu_s() - cpu0}


def run(args: argparse.Namespace) -> dict:
    """`hermes-bulk run JOB --wait`, without the progress bar: from `run` until the store's
    counts say every item finished. With --external K, this process only runs the job (as
    `hermes-bulk run JOB` does) and watches; K worker processes, already registered, do the work."""
    from hermes_bulk.config.settings import load_settings
    from hermes_bulk.jobs.service import Jobs
    from hermes_bulk.runtime.worker import WorkerRuntime

    settings = load_settings()
    jobs = Jobs(settings)
    store = jobs.backend.store
    job_id = jobs.resolve(args.job)
    if args.external:
        deadline = time.monotonic() + 60
        while len(store.live_workers()) < args.external:
            if time.monotonic() > deadline:
                raise SystemExit(f"{args.external} workers did not register within 60 s")
            time.sleep(0.05)
    cpu0, t0 = _cpu_s(), time.perf_counter()
    jobs.run(job_id)
    runtime = None
    if not args.external:
        runtime = WorkerRuntime(jobs.backend, settings, threads=args.threads)
        runtime.start()
        runtime.start_embedded_consumer()
    first_done = None
    deadline = t0 + args.timeout
    try:
        while True:
            job = store.get_job(job_id)
            if first_done is None and job.completed + job.failed > 0:
                first_done = time.perf_counter() - t0
            if job.finished or (job.state == "paused" and job.running == 0):
                break  # done, or stopped at a limit (row 14) with nothing in flight
            if time.perf_counter() > deadline:
                raise SystemExit(f"job {job_id} did not finish within {args.timeout} s: {job}")
            time.sleep(args.poll)
        elapsed = time.perf_counter() - t0
        cpu = _cpu_s() - cpu0
    finally:
        if runtime is not None:
            runtime.stop(graceful=True)
    return {
        "elapsed_s": elapsed,
        "first_done_s": first_done,
        "items": job.total,
        "completed": job.completed,
        "failed": job.failed,
        "cpu_s": cpu,
        "state": job.state,
        "cost_usd": job.cost_nusd / 1e9,
    }


def fill(args: argparse.Namespace) -> dict:
    """Give every item of a job a result through the store's own claim and complete_and_claim (no
    model calls): how the export benchmark gets a million completed results in minutes."""
    from hermes_bulk.config.settings import load_settings
    from hermes_bulk.fleet.broker import open_backend
    from hermes_bulk.store.protocol import NOT_STARTED, RUNNING, ClaimRefused, Usage
    from hermes_bulk.testing.fake_provider import expected_answer

    settings = load_settings()
    store = open_backend(settings).store
    store.set_state(args.job, RUNNING, from_states=[NOT_STARTED, RUNNING])
    worker, usage = "bench-filler", Usage(40, 20)
    t0, n = time.perf_counter(), 0
    claim = store.claim_item(args.job, 0, worker, lease_s=3600, max_running=1 << 30)
    while not isinstance(
        claim, ClaimRefused
    ):  # each completion claims the next, as a worker's chain does
        _, claim = store.complete_and_claim(
            args.job,
            claim.index,
            worker,
            expected_answer(claim.content),
            usage,
            provider="bench",
            model="fake-model",
            index_hint=claim.index + 1,
            lease_s=3600,
            max_running=1 << 30,
        )
        n += 1
    return {"elapsed_s": time.perf_counter() - t0, "items": n}


def answer_all(args: argparse.Namespace) -> dict:
    """Every item of a SQLite job answered at once, as a million completions would leave the
    store (results, counters, the answer index): set-wise SQL, seconds where `fill` takes
    tens of minutes on a loaded machine. Only for building a full index of earlier answers
    (row 8); what one completion writes is complete_item's, tested in tests/test_reuse.py."""
    from hermes_bulk.config.settings import load_settings
    from hermes_bulk.fleet.broker import open_backend

    store = open_backend(load_settings()).store
    t0 = time.perf_counter()
    with store.db.write() as conn:
        n = conn.execute(
            "UPDATE items SET status = 'completed', tokens_in = 40, tokens_out = 20"
            " WHERE job_id = ? AND status IN ('pending', 'waiting')",
            (args.job,),
        ).rowcount
        conn.execute(
            "INSERT INTO results (job_id, idx, text) SELECT job_id, idx, 'answer ' || idx FROM "
            "items WHERE job_id = ?",
            (args.job,),
        )
        conn.execute(
            "INSERT OR REPLACE INTO answers (key, job_id, idx, tokens) SELECT answer_key, job_id, "
            "idx, 60 FROM items WHERE job_id = ? AND answer_key != '' AND dup_of IS NULL",
            (args.job,),
        )
        conn.execute(
            "UPDATE jobs SET completed = total, pending = 0, tokens_charged = 60 * total WHERE "
            "id = ?",
            (args.job,),
        )
    return {"elapsed_s": time.perf_counter() - t0, "items": n}


def partial(args: argparse.Namespace) -> dict:
    """A SQLite job left as a run part-way through would leave it, set-wise (row 11, the
    dashboard): the first --share of the items completed with results, every --fail-every-th of
    those failed with an error and an item_failed event, the job running. Seconds, where
    claiming and completing a million takes tens of minutes on a loaded machine."""
    from hermes_bulk.config.settings import load_settings
    from hermes_bulk.fleet.broker import open_backend
    from hermes_bulk.store.protocol import NOT_STARTED, RUNNING

    store = open_backend(load_settings()).store
    t0 = time.perf_counter()
    job = store.get_job(args.job)
    upto = int(job.total * args.share)
    every = args.fail_every
    with store.db.write() as conn:
        conn.execute(
            "UPDATE items SET status = 'completed', tokens_in = 40, tokens_out = 20"
            " WHERE job_id = ? AND idx < ? AND idx % ? != 0",
            (args.job, upto, every),
        )
        conn.execute(
            "UPDATE items SET status = 'failed', error_type = 'PermanentError', http_status = 400,"
            " error_message = 'the provider rejected the request (HTTP 400)'"
            " WHERE job_id = ? AND idx < ? AND idx % ? = 0",
            (args.job, upto, every),
        )
        conn.execute(
            "INSERT INTO results (job_id, idx, text) SELECT job_id, idx, 'answer ' || idx FROM "
            "items WHERE job_id = ? AND status = 'completed'",
            (args.job,),
        )
        conn.execute(
            "INSERT INTO events (job_id, at, kind, item_idx, message, error_type, http_status)"
            " SELECT job_id, ?, 'item_failed', idx, 'the provider rejected the request (HTTP 400)',"
            " 'PermanentError', 400 FROM items WHERE job_id = ? AND status = 'failed'",
            (time.time(), args.job),
        )
        failed = -(-upto // every)
        conn.execute(
            "UPDATE jobs SET completed = ?, failed = ?, pending = total - ?, tokens_in = 40 * ?,"
            " tokens_out = 20 * ?, tokens_charged = 60 * ? WHERE id = ?",
            (upto - failed, failed, upto, upto - failed, upto - failed, upto - failed, args.job),
        )
    store.set_state(args.job, RUNNING, from_states=[NOT_STARTED])
    return {"elapsed_s": time.perf_counter() - t0, "completed": upto - failed, "failed": failed}


def admit(args: argparse.Namespace) -> dict:
    """Time each of --count admissions made through factory(backend, cap), starting at --start-at;
    back to back, or at --rate admissions a second (0: back to back)."""
    import importlib

    module, name = args.factory.split(":")
    call = getattr(importlib.import_module(module), name)(args.backend, args.cap)
    time.sleep(max(0.0, args.start_at - time.time()))
    latencies, admitted = [], 0
    cpu0, wall0 = _cpu_s(), time.perf_counter()
    for n in range(args.count):
        if args.rate:
            time.sleep(max(0.0, wall0 + n / args.rate - time.perf_counter()))
        t0 = time.perf_counter_ns()
        admitted += bool(call())
        latencies.append((time.perf_counter_ns() - t0) / 1e6)
    return {
        "latencies_ms": latencies,
        "admitted": admitted,
        "cpu_s": _cpu_s() - cpu0,
        "wall_s": time.perf_counter() - wall0,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.drive")
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("pool")
    p.add_argument("--base-url", required=True)
    p.add_argument("--source", required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--client", choices=("hermes", "shared"), default="hermes")
    p = sub.add_parser("run")
    p.add_argument("job")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--external", type=int, default=0, metavar="K")
    p.add_argument("--poll", type=float, default=0.02)
    p.add_argument("--timeout", type=float, default=3600)
    p = sub.add_parser("fill")
    p.add_argument("job")
    p = sub.add_parser("answer-all")
    p.add_argument("job")
    p = sub.add_parser("partial")
    p.add_argument("job")
    p.add_argument("--share", type=float, default=0.6)
    p.add_argument("--fail-every", type=int, default=1000)
    p = sub.add_parser("admit")
    p.add_argument("--factory", required=True, metavar="MODULE:FUNCTION")
    p.add_argument("--backend", required=True)
    p.add_argument("--cap", type=int, required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--start-at", type=float, default=0.0)
    p.add_argument(
        "--rate", type=float, default=0.0, help="admissions a second per process (0: back to back)"
    )
    args = parser.parse_args(argv)
    result = {
        "pool": pool,
        "run": run,
        "fill": fill,
        "answer-all": answer_all,
        "partial": partial,
        "admit": admit,
    }[args.what](args)
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
