"""A fleet on Redis Sentinel outlives its primary: kill -9 of the primary is a pause of seconds.

Real parts: a primary, its replica and three Sentinels on loopback (tests/sentinels.py), worker
processes, the loopback provider, `hermes-bulk` commands; the backend is the redis+sentinel://
URL alone. Each test proves itself by the export (every item answered, with its own answer, once)
and by the provider's own count of requests (no more than the items plus those in flight when
the primary died).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
import redis

from hermes_bulk.budget.ledger import CallRecord
from hermes_bulk.budget.policy import ALLOWED, FAILED_OPEN
from hermes_bulk.budget.service import Budget
from hermes_bulk.budget.settings import LEDGER_ENV
from hermes_bulk.config.backend_url import parse_backend_url
from hermes_bulk.errors import BackendUnavailable
from hermes_bulk.fleet import broker
from hermes_bulk.store.records import Usage
from hermes_bulk.store.redis.connection import connect_redis
from hermes_bulk.store.redis.jobs import RedisJobStore
from hermes_bulk.testing.fake_provider import digest, expected_answer
from hermes_bulk.testing.sentinels import SentinelCluster, Server, free_port

from ..conftest import IN_CI
from ..helpers import running_job, wait_for
from ..test_batch_mode import FAST as POLL_FAST
from ..test_batch_mode import _source as batch_source

pytestmark = pytest.mark.slow

CONCURRENCY = 8
THREADS = 4  #: callers of the ledger test


@pytest.fixture
def cluster(tmp_path):
    if shutil.which("redis-server") is None and not IN_CI:
        pytest.skip("redis-server is not installed")
    cluster = SentinelCluster(tmp_path / "sentinel").start()
    yield cluster
    cluster.stop()


def outlived(cli, workers) -> str:
    """Why the workers did not all outlive the primary: each one's exit code and last lines."""
    logs = sorted(cli.logs_dir.glob("worker-*.log"))
    tails = ["".join(p.read_text().splitlines(keepends=True)[-15:]) for p in logs]
    return f"the workers outlived the primary: {[w.poll() for w in workers]}\n" + "\n".join(tails)


def jsonl(path: Path, n: int, key: str) -> Path:
    path.write_text("".join(json.dumps({key: i}) + "\n" for i in range(n)))
    return path


def exported(cli, job_id: str) -> list[dict]:
    path = cli("export", job_id, "--format", "jsonl").stdout.strip()
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def assert_answered_once(cli, job_id: str, n: int, key: str) -> None:
    """The export holds every item once, each with the answer to its own content."""
    rows = exported(cli, job_id)
    assert [r["item"] for r in rows] == [f"line:{i + 1}" for i in range(n)]
    assert [r["status"] for r in rows] == ["completed"] * n
    assert [r["result"] for r in rows] == [
        expected_answer(json.dumps({key: i})) for i in range(n)
    ], "each item has its own answer"


def requests_of(fake_provider, n: int, key: str) -> Counter:
    """How many times the provider was asked each item of a job (by the items' own digests)."""
    mine = {digest(json.dumps({key: i})) for i in range(n)}
    return Counter(r.item for r in fake_provider.requests if r.item in mine)


def test_a_600_item_job_on_two_workers_and_a_job_created_just_before_kill_9_of_the_primary_complete(
    cli, cluster, tmp_path, fake_provider
):
    cli.env["HERMES_BULK_BACKEND"] = cluster.url(0)
    fake_provider.configure(latency_s=0.02)
    big = cli.create(
        "Process", jsonl(tmp_path / "big.jsonl", 600, "a"), "--concurrency", str(CONCURRENCY)
    )
    cli("run", big)
    workers = [cli.spawn_worker("-w", "8", HERMES_BULK_LEASE_SECONDS="10") for _ in range(2)]
    wait_for(lambda: cli.status(big)["completed"] >= 150, timeout=60, message="the job under way")
    late = cli.create(
        "Process", jsonl(tmp_path / "late.jsonl", 40, "b"), "--concurrency", str(CONCURRENCY)
    )
    cli("run", late)
    killed_at = cluster.kill_primary()
    old, new = cluster.primary.port, cluster.replica.port
    before = cli.status(big)["completed"]  # rides out the failover: read on the new primary
    assert before < 600, "the primary died mid-job"
    wait_for(
        lambda: (
            cli.status(big)["state"] == "completed" and cli.status(late)["state"] == "completed"
        ),
        timeout=90,
        interval=0.2,
        message="both jobs completed on the new primary",
    )
    assert cluster.primary_port() == new
    assert all(w.poll() is None for w in workers), outlived(cli, workers)
    # Where writes go, as the workers said at start and doctor says now.
    first_lines = (cli.logs_dir / "worker-1.log").read_text()
    assert f"writes go to Redis primary 127.0.0.1:{old} (Sentinel service hermes), 1 replica\n" in (
        first_lines
    )
    doctor = cli("doctor").stdout
    assert f"store    Redis primary 127.0.0.1:{new} (Sentinel service hermes), 0 replicas" in doctor

    assert_answered_once(cli, big, 600, "a")
    assert_answered_once(cli, late, 40, "b")
    for n, key in ((600, "a"), (40, "b")):
        asked = requests_of(fake_provider, n, key)
        assert len(asked) == n, "every item was asked"
        again = [item for item, times in asked.items() if times > 1]
        # Asked again: only what was in flight when the primary died (the job's concurrency).
        assert sum(asked.values()) <= n + CONCURRENCY, (sum(asked.values()), n)
        for item in again:
            first = min(r.at for r in fake_provider.requests if r.item == item)
            assert first <= killed_at + 0.5, "an item was asked again without the kill"


def _ask(base_url: str, text: str) -> None:
    """One chat request to the loopback provider (it counts them)."""
    body = json.dumps({"model": "fake-model", "messages": [{"role": "user", "content": text}]})
    request = urllib.request.Request(
        f"{base_url}/chat/completions",
        data=body.encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer k"},
    )
    urllib.request.urlopen(request, timeout=10).read()


def test_a_ledger_counting_through_kill_9_of_the_primary_loses_only_what_no_replica_had(
    cluster, tmp_path, fake_provider, monkeypatch
):
    """Calls go through while the Sentinels elect a new primary (the ledger fails open and notes
    each such call); afterwards it counts on the new primary. Admissions are not confirmed with
    WAIT: what the replica had not received when the primary died is lost (the at-risk window:
    under a loaded machine, replication can lag by many admissions), and nothing else; the
    ledger never counts more than it admitted."""
    monkeypatch.delenv(LEDGER_ENV, raising=False)
    budget = Budget(tmp_path / "cron-budget")
    budget.settings_file.set("ledger", cluster.url(0, "prefix=budget"))
    stop, decisions, lock = threading.Event(), Counter(), threading.Lock()
    slowest = [0.0]

    def caller(n: int) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            call = CallRecord("cron", profile="p", job_id=f"job{n}", run_id=f"r{n}-{i}", model="m")
            with lock:  # an admission and its count are one step: the kill falls between two
                started = time.monotonic()
                outcome = budget.admit(call)
                decisions[outcome.decision] += 1
                slowest[0] = max(slowest[0], time.monotonic() - started)
            _ask(fake_provider.base_url, f"thread {n} call {i}")
            time.sleep(0.01)

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    replica = redis.Redis(port=cluster.replica.port)
    window_key = f"{{budget:budget}}:w:{budget.report().window.start_s}"
    try:
        wait_for(lambda: decisions[ALLOWED] >= 40, message="the ledger counting")
        with lock:  # no admission under way: what the old primary admitted is exact
            replica_had = int(replica.hget(window_key, "total") or 0)  # before the kill: a floor
            cluster.kill_primary()
            admitted_by_the_old = decisions[ALLOWED]
        cluster.wait_promoted()
        wait_for(
            lambda: decisions[ALLOWED] > admitted_by_the_old + 40,
            timeout=30,
            message="counting again on the new primary",
        )
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        replica.close()
    report = budget.report()
    budget.close()
    assert sum(decisions.values()) == len(fake_provider.requests), "every call was sent"
    assert decisions[FAILED_OPEN] > 0, "calls went through while there was no primary"
    assert slowest[0] < 2.5, "no call waited for the failover (the ledger fails open)"
    assert set(decisions) <= {ALLOWED, FAILED_OPEN}, decisions
    assert report.failopen is not None and report.failopen.calls == decisions[FAILED_OPEN]
    counted = report.counts.total
    admitted_by_the_new = decisions[ALLOWED] - admitted_by_the_old
    assert counted <= decisions[ALLOWED], "never more counted than admitted"
    kept = counted - admitted_by_the_new  # what the promoted replica had of the old primary's
    assert replica_had <= kept <= admitted_by_the_old, (replica_had, kept, admitted_by_the_old)


def test_create_through_kill_9_of_the_primary_makes_the_whole_job_or_says_it_did_not(
    cli, cluster, tmp_path
):
    """`create` of 30,000 items, the primary killed while it adds them: it waits the failover
    out and the job is whole on the new primary, or (a write lost in flight) it says so in one
    line and leaves no job behind; never "Created" for a job that is not all there."""
    cli.env["HERMES_BULK_BACKEND"] = cluster.url(0)
    n = 30_000
    src = jsonl(tmp_path / "many.jsonl", n, "c")
    proc = subprocess.Popen(
        [sys.executable, "-m", "hermes_bulk", "create", "Do", "--over", str(src), "--json"],
        env=cli.full_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    raw = redis.Redis(port=cluster.primary.port)
    wait_for(
        lambda: any(raw.scan_iter(match="*:contents", count=1000)),
        timeout=30,
        interval=0.01,
        message="create adding items",
    )
    raw.close()
    cluster.kill_primary()
    out, err = proc.communicate(timeout=90)
    assert proc.poll() is not None
    jobs = cli.json("list", "--json")
    if proc.returncode == 0:
        job_id = json.loads(out)["job_id"]
        status = cli.status(job_id)
        assert (status["total"], status["state"]) == (n, "not_started")
        assert [j["job_id"] for j in jobs] == [job_id]
    else:
        (line,) = err.strip().splitlines()
        assert "Traceback" not in err and "Redis" in line
        assert jobs == [], "no half-made job is listed"


class Endpoint:
    """A managed Redis's one address: a loopback TCP proxy to whichever server it names now.
    Connections made before a switch stay where they were, as after a DNS change. hold() keeps
    what clients send from then on (`held` is set once something was kept); drop() closes every
    connection, with what it kept unsent, as an endpoint that fails over drops its clients."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.socks: list[socket.socket] = []
        self.holding, self.held = False, threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target))
            except OSError:  # the server it names is gone: the client sees a closed connection
                client.close()
                continue
            self.socks += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        try:
            while data := src.recv(65536):
                if from_client and self.holding:
                    self.held.set()
                    continue
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def hold(self) -> None:
        self.held.clear()
        self.holding = True

    def drop(self) -> None:
        self.holding = False
        socks, self.socks = self.socks, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self.listener.close()
        self.drop()


@pytest.fixture
def managed(tmp_path):
    """A primary and its replica, behind one endpoint (no Sentinel)."""
    if shutil.which("redis-server") is None and not IN_CI:
        pytest.skip("redis-server is not installed")
    primary = Server(tmp_path / "p").start()
    replica = Server(tmp_path / "r", "--replicaof", "127.0.0.1", str(primary.port)).start()
    endpoint = Endpoint(primary.port)
    yield primary, replica, endpoint
    endpoint.close()
    replica.kill()
    primary.kill()


def _switch_over(primary: Server, replica: Server, endpoint: Endpoint) -> None:
    """What a managed Redis does in a failover: the replica becomes the primary, the old primary
    its replica (READONLY to writes), and the endpoint names the new one."""
    new, old = redis.Redis(port=replica.port), redis.Redis(port=primary.port)
    wait_for(lambda: new.info("replication")["master_link_status"] == "up", message="in sync")
    wait_for(lambda: old.execute_command("WAIT", 1, 100) == 1, message="the replica has it all")
    new.execute_command("REPLICAOF", "NO", "ONE")
    old.execute_command("REPLICAOF", "127.0.0.1", str(replica.port))
    endpoint.target = replica.port
    new.close()
    old.close()


def test_a_managed_endpoint_that_fails_over_answers_readonly_and_the_write_goes_to_the_new_primary(
    managed,
):
    """The store's writes, and Huey's enqueue of a trigger, refused by the demoted primary
    (READONLY) through the one address, are sent again and land on the new primary."""
    primary, replica, endpoint = managed
    backend = broker.build_backend(f"redis://127.0.0.1:{endpoint.port}/0?prefix=m")
    try:
        job_id = running_job(backend.store, "managed1", ["a", "b"])
        assert backend.store.get_job(job_id).pending == 2  # a pooled connection to the primary
        backend.trigger(job_id)  # Huey's, on the same pool
        huey = backend.queue(backend.client_of(job_id))
        _switch_over(primary, replica, endpoint)
        backend.trigger(job_id)  # first after the switch: Huey's LPUSH meets READONLY
        assert huey.pending_count() == 2, "both triggers on the new primary"
        claimed = backend.store.claim_item(job_id, 0, "w1", lease_s=30, max_running=2)
        assert claimed.index == 0, "claimed on the new primary, not refused"
        on_new = redis.Redis(port=replica.port)
        assert on_new.info("replication")["role"] == "master"
        assert backend.store.get_job(job_id).running == 1
        on_new.close()
    finally:
        backend.close()


def test_an_endpoint_that_stays_a_replica_is_one_line_after_the_wait_not_an_internal_error(
    managed,
):
    primary, replica, endpoint = managed
    location = parse_backend_url(f"redis://127.0.0.1:{endpoint.port}/0?prefix=m2")
    conn = connect_redis(location, failover_wait_s=1.0)
    store = RedisJobStore(conn)
    try:
        job_id = running_job(store, "managed2", ["a"])
        _switch_over(primary, replica, endpoint)
        endpoint.target = primary.port  # the endpoint still names the demoted primary
        started = time.monotonic()
        with pytest.raises(BackendUnavailable, match="is a replica now"):
            store.claim_item(job_id, 0, "w1", lease_s=30, max_running=1)
        assert 1.0 <= time.monotonic() - started < 5.0, "waited the failover wait, no longer"
    finally:
        store.close()


def cut_in_flight(endpoint: Endpoint, call, switch=None):
    """call() in a thread, its first request held by the endpoint and then dropped with its
    connection, after switch() (a failover) when given. Returns (its value, its error)."""
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = call()
        except Exception as exc:  # noqa: BLE001 - the caller asserts on it
            out["error"] = exc

    endpoint.hold()
    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert endpoint.held.wait(10), "the request reached the endpoint"
        if switch is not None:
            switch()
    finally:
        endpoint.drop()
        thread.join(30)
    assert not thread.is_alive()
    return out.get("value"), out.get("error")


def test_reads_cut_by_a_failover_are_read_again_on_the_new_primary_and_a_write_is_not_sent_twice(
    managed,
):
    """Through a managed endpoint (plain redis://): export's read of its second page is cut in
    flight by a failover, then status's and list's reads by dropped connections; each is read
    again and returns what the new primary holds. A write cut so (an answer saved) may have
    run: it is not sent again, and says the connection was lost. A read cut every time gives up
    after the failover wait, in one line."""
    primary, replica, endpoint = managed
    location = parse_backend_url(f"redis://127.0.0.1:{endpoint.port}/0?prefix=r")
    store = RedisJobStore(connect_redis(location, failover_wait_s=1.0))
    try:
        n = 2500
        job_id = running_job(store, "reads1", [f"c{i}" for i in range(n)])
        store.claim_item(job_id, 7, "w1", lease_s=30, max_running=4)
        pages = store.iter_items(job_id, batch=1000)
        first = next(pages)  # the first page is read
        rest, error = cut_in_flight(
            endpoint, lambda: list(pages), lambda: _switch_over(primary, replica, endpoint)
        )
        assert error is None, error
        assert [first.index] + [r.index for r in rest] == list(range(n))
        for read in (
            lambda: store.get_job(job_id).running,  # status
            lambda: len(store.list_events(job_id)),
            lambda: store.list_batches(job_id),
            lambda: [j.job_id for j in store.list_jobs()],  # list
        ):
            assert cut_in_flight(endpoint, read) == (read(), None)
        assert store.get_job(job_id).running == 1

        _, error = cut_in_flight(
            endpoint, lambda: store.complete_item(job_id, 7, "w1", "answer", Usage())
        )
        assert isinstance(error, BackendUnavailable) and "Lost the connection" in str(error)
        held = store.get_item(job_id, 7).item
        assert (held.status, held.result) == ("running", None), "the held write never ran"

        endpoint.target = free_port()  # nothing there: every connection is dropped at once
        started = time.monotonic()
        _, error = cut_in_flight(endpoint, lambda: store.get_job(job_id))
        assert isinstance(error, BackendUnavailable), error
        assert "Traceback" not in str(error) and len(str(error).splitlines()) == 1
        assert 1.0 <= time.monotonic() - started < 5.0, "waited the failover wait, no longer"
    finally:
        store.close()


def test_a_primary_with_min_replicas_to_write_that_lost_its_replica_is_waited_on_then_one_line(
    tmp_path,
):
    """min-replicas-to-write 1 (docs/operations.md advises it): while the replica is gone the
    primary refuses writes (NOREPLICAS); a write waits the failover wait for a replica, then
    says so in one line, never an internal error; once a replica is back, writes go through."""
    if shutil.which("redis-server") is None and not IN_CI:
        pytest.skip("redis-server is not installed")
    primary = Server(tmp_path / "p", "--min-replicas-to-write", "1").start()
    replicas = [
        Server(tmp_path / f"r{i}", "--replicaof", "127.0.0.1", str(primary.port)) for i in (1, 2)
    ]
    raw = redis.Redis(port=primary.port)
    synced = lambda: raw.info("replication").get("min_slaves_good_slaves") == 1  # noqa: E731
    replicas[0].start()
    location = parse_backend_url(f"redis://127.0.0.1:{primary.port}/0?prefix=nr")
    store = None
    try:
        wait_for(synced, message="the replica in sync")
        store = RedisJobStore(connect_redis(location, failover_wait_s=1.0))
        job_id = running_job(store, "norep1", ["a", "b"])
        replicas[0].kill()
        wait_for(lambda: not synced(), message="the primary without its replica")
        started = time.monotonic()
        with pytest.raises(BackendUnavailable) as refused:
            store.claim_item(job_id, 0, "w1", lease_s=30, max_running=2)
        assert 1.0 <= time.monotonic() - started < 5.0, "waited the failover wait, no longer"
        (line,) = str(refused.value).splitlines()
        assert "min-replicas-to-write" in line and "Traceback" not in line
        assert store.get_job(job_id).running == 0, "the refused claim did not run"
        replicas[1].start()
        wait_for(synced, message="another replica in sync")
        assert store.claim_item(job_id, 0, "w1", lease_s=30, max_running=2).index == 0
    finally:
        if store is not None:
            store.close()
        raw.close()
        for server in (*replicas, primary):
            server.kill()


@pytest.mark.parametrize("wait_replicas", ["", "0"])
def test_an_answer_saved_waits_for_the_replica_and_says_when_it_did_not_come(
    cluster, caplog, wait_replicas
):
    """The replica stopped (SIGSTOP): an answer saved with WAIT on waits its timeout and the log
    says it is at risk; with wait_replicas=0 the save returns at once, unconfirmed. Once the
    replica runs again, WAIT answers at once."""
    query = "prefix=w&wait_timeout_ms=300" + (
        f"&wait_replicas={wait_replicas}" * bool(wait_replicas)
    )
    backend = broker.build_backend(cluster.url(0, query))
    store = backend.store
    try:
        job_id = running_job(store, "wait1", ["a", "b", "c"])
        for index in range(3):
            store.claim_item(job_id, index, "w1", lease_s=30, max_running=3)
        cluster.replica.proc.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            assert store.complete_item(job_id, 0, "w1", "answer a", Usage())
            stopped_s = time.monotonic() - started
            assert store.complete_item(job_id, 1, "w1", "answer b", Usage())  # told once a minute
        finally:
            cluster.replica.proc.send_signal(signal.SIGCONT)
        started = time.monotonic()
        assert store.complete_item(job_id, 2, "w1", "answer c", Usage())
        running_s = time.monotonic() - started
        warned = [r for r in caplog.records if "replicas confirmed it within 300 ms" in r.message]
        if wait_replicas == "0":
            assert stopped_s < 0.25 and not warned
        else:
            assert 0.3 <= stopped_s < 2.0, "waited for the replica, up to the timeout"
            assert len(warned) == 1 and "0 of 1" in warned[0].message
        assert running_s < 0.25
        assert store.get_job(job_id).completed == 3
    finally:
        backend.close()


def sent_in_batches(fake_provider) -> Counter:
    """How many batches created at the provider held each (job, item): by the custom_ids of
    their input files (Message Batches' requests are kept as a file too)."""
    sent: Counter = Counter()
    for batch_id in fake_provider.batches.created:
        batch = fake_provider.batches.batches[batch_id]
        lines = fake_provider.batches.files[batch["input_file_id"]].read_text().splitlines()
        for line in filter(None, lines):
            _, job_id, _, index = json.loads(line)["custom_id"].split("-")
            sent[job_id, int(index)] += 1
    return sent


def test_batch_ingests_on_both_protocols_through_kill_9_of_the_primary_answer_each_item_once(
    cli, cluster, tmp_path, fake_provider
):
    """Two --batch jobs, one through OpenAI's Batch API and one through Anthropic's Message
    Batches, each ingesting its batch's results on a worker of its own when the primary dies.
    Each ingest rides out the failover and goes on, on the new primary; what the replica lacked
    is ingested again from the provider's file. The provider's own count: one batch a job, each
    item sent in one batch and answered once, nothing asked live."""
    n = 1000
    cli.env.update(HERMES_BULK_BACKEND=cluster.url(0), **POLL_FAST)
    envs = {"openai": {}, "anthropic": {"HERMES_BULK_PROVIDER": "anthropic"}}
    fake_provider.configure(batch_hold=True)  # both batches end together, once both are made
    jobs = {}
    for mark, env in envs.items():
        src = batch_source(tmp_path, n, f"{mark}.jsonl", dict.fromkeys(range(n), mark))
        jobs[mark] = cli.json(
            "create", "Summarise", "--over", str(src), "--batch", "--fresh", "--json", **env
        )["job_id"]
        cli("run", jobs[mark], **env)
    workers = [cli.spawn_worker("-w", "2", **env) for env in envs.values()]
    store = broker.build_backend(cluster.url(0)).store
    try:
        wait_for(
            lambda: len(fake_provider.batches.created) == 2, timeout=60, message="both batches"
        )
        fake_provider.configure(batch_hold=False)
        wait_for(
            lambda: all(store.get_job(j).completed > 50 for j in jobs.values()),
            timeout=60,
            interval=0.005,
            message="both ingests under way",
        )
        cluster.kill_primary()
        cut = {mark: store.get_job(j).completed for mark, j in jobs.items()}  # on the new primary
        assert all(c < n for c in cut.values()), ("the primary died mid-ingest", cut)
        for job_id in jobs.values():
            wait_for(
                lambda j=job_id: cli.status(j)["state"] == "completed",
                timeout=90,
                interval=0.2,
                message="the job completed on the new primary",
            )
    finally:
        store.close()
    assert all(w.poll() is None for w in workers), outlived(cli, workers)
    assert fake_provider.requests == [], "no item was asked live"
    assert len(fake_provider.batches.created) == 2, "one batch a job: none bought twice"
    sent = sent_in_batches(fake_provider)
    answered = Counter(r.item for r in fake_provider.batches.lines if r.status == 200)
    for mark, job_id in jobs.items():
        contents = [json.dumps({"n": i, "mark": mark}) for i in range(n)]
        rows = exported(cli, job_id)
        assert [r["item"] for r in rows] == [f"line:{i + 1}" for i in range(n)]
        assert [r["status"] for r in rows] == ["completed"] * n
        assert [r["result"] for r in rows] == [expected_answer(c) for c in contents]
        mine = {digest(c) for c in contents}
        assert sorted(times for item, times in answered.items() if item in mine) == [1] * n
        assert sorted(times for (job, _), times in sent.items() if job == job_id) == [1] * n, (
            "each item sent in one batch"
        )
