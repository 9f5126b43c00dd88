"""The search for a Message Batch created but not recorded (MessageBatchApi.find) against a
loopback server of this file that lists the pages each test writes, and what `discard` removes:
an entry that is not a batch, or has no creation time, is passed over and the search reads on
(the batch that fits may come after it); a last page is the last list call; only a requests file
kept by `upload` is discarded. tests/test_message_batches.py holds the same search against the
project's loopback provider."""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hermes_bulk.fleet import broker
from hermes_bulk.providers.batch_api import BatchAnswerInvalid
from hermes_bulk.providers.message_batches import LOCAL, MessageBatchApi
from hermes_bulk.store.protocol import BatchRecord

from .helpers import without_proxies


class _Pages(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 - the http.server interface
        self.server.asked.append(self.path)
        page = self.server.pages.pop(0) if self.server.pages else {"data": [], "has_more": False}
        body = json.dumps(page).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Pages)
        self.pages: list[dict] = []
        self.asked: list[str] = []


@pytest.fixture
def api(tmp_path, monkeypatch):
    without_proxies(monkeypatch)
    server = _Server()
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    backend = broker.build_backend(f"sqlite:///{tmp_path / 'bulk.db'}")
    client = MessageBatchApi(
        base_url=f"http://127.0.0.1:{server.server_address[1]}/v1",
        api_key="sk-ant-test",
        provider_key="p:test",
        limits=backend.limits,
        timeout_s=5,
    )
    client.server = server  # type: ignore[attr-defined]
    yield client
    client.close()
    backend.close()
    server.shutdown()
    server.server_close()


NOW = float(int(time.time()))  # whole seconds: a creation time exactly at the skew's edge


def _batch(batch_id: str, requests: int, *, age_s: float = 0.0, **fields) -> dict:
    created = datetime.fromtimestamp(NOW - age_s, tz=UTC).isoformat()
    return {
        "id": batch_id,
        "type": "message_batch",
        "processing_status": "in_progress",
        "request_counts": {"processing": requests, "succeeded": 0, "errored": 0,
                           "canceled": 0, "expired": 0},
        "created_at": created,
        **fields,
    }  # fmt: skip


def _record(items: int) -> BatchRecord:
    return BatchRecord(
        batch_id="b1", job_id="j", status="preparing", items=items, created_at=NOW - 60
    )


@pytest.mark.parametrize(
    "passed_over",
    [
        {"type": "not_a_batch"},
        {"processing_status": "unheard_of"},
        {"request_counts": "many"},
        {"created_at": None},
        {"created_at": "yesterday"},
    ],
    ids=["another-type", "unknown-status", "unreadable-counts", "no-time", "unreadable-time"],
)
def test_an_entry_that_is_not_a_readable_batch_is_passed_over_and_the_page_read_on(
    api, passed_over
):
    api.server.pages = [
        {
            "data": [_batch("msgbatch_x", 3, **passed_over), _batch("msgbatch_ours", 3)],
            "has_more": False,
            "last_id": "msgbatch_ours",
        }
    ]
    found = api.find(_record(3))
    assert found is not None and found.id == "msgbatch_ours"


def test_a_search_stops_at_the_last_page_and_follows_one_that_has_more(api):
    api.server.pages = [
        {"data": [_batch("msgbatch_a", 4)], "has_more": True, "last_id": "msgbatch_a"},
        {"data": [_batch("msgbatch_ours", 3)], "has_more": False, "last_id": "msgbatch_ours"},
        {"data": [_batch("msgbatch_b", 3)], "has_more": False, "last_id": "msgbatch_b"},
    ]
    assert api.find(_record(3)).id == "msgbatch_ours"
    assert len(api.server.asked) == 2, "the second page said it was the last"
    assert "after_id=msgbatch_a" in api.server.asked[1]


def test_a_batch_of_more_requests_than_small_numbers_is_found_by_its_count(api):
    api.server.pages = [{"data": [_batch("msgbatch_ours", 300)], "has_more": False}]
    assert api.find(_record(300)).id == "msgbatch_ours"


@pytest.mark.parametrize(("age_s", "found"), [(360.0, True), (361.0, False)])
def test_a_batch_created_at_the_clocks_skew_before_ours_is_still_a_candidate(api, age_s, found):
    """Ours was opened 60 s ago; the skew allowed is 300 s: 360 s ago is the edge, 361 s past."""
    api.server.pages = [{"data": [_batch("msgbatch_ours", 3, age_s=age_s)], "has_more": False}]
    assert (api.find(_record(3)) is not None) is found


def test_a_search_stops_at_a_batch_older_than_ours(api):
    api.server.pages = [
        {
            "data": [_batch("msgbatch_ours", 3), _batch("msgbatch_old", 3, age_s=3600)],
            "has_more": True,
            "last_id": "msgbatch_old",
        },
        {"data": [_batch("msgbatch_b", 3)], "has_more": False, "last_id": "msgbatch_b"},
    ]
    assert api.find(_record(3)).id == "msgbatch_ours"
    assert len(api.server.asked) == 1, "past an older batch every one is older"


def test_discard_removes_only_a_requests_file_that_upload_kept(api, tmp_path):
    folder = tmp_path / "batches"
    folder.mkdir()
    folder.joinpath("b1.jsonl").write_text("{}\n")
    kept = api.upload(folder.joinpath("b1.jsonl"))  # moved to b1.requests.jsonl
    assert kept == LOCAL + str(folder / "b1.requests.jsonl")
    other = folder / "b2.jsonl"  # not a kept requests file
    bare = folder / "b3.requests.jsonl"  # named as one, but not given as kept (no local:)
    for path in (other, bare):
        path.write_text("{}\n")
    api.discard(LOCAL + str(other))
    api.discard(str(bare))
    api.discard(None)
    api.discard("file_abc")  # an id at a provider: nothing here
    assert other.exists() and bare.exists()
    api.discard(kept)
    assert not folder.joinpath("b1.requests.jsonl").exists()
    api.discard(kept)  # already gone (the create removed it): nothing to do, no error


@pytest.mark.parametrize("has_more", ["missing", None, "true", 1])
def test_a_page_that_does_not_say_true_for_more_is_the_last(api, has_more):
    page = {"data": [_batch("msgbatch_a", 4)], "last_id": "msgbatch_a"}
    if has_more != "missing":
        page["has_more"] = has_more
    api.server.pages = [page, {"data": [_batch("msgbatch_ours", 3)], "has_more": False}]
    assert api.find(_record(3)) is None
    assert len(api.server.asked) == 1


def test_two_batches_that_fit_are_neither_adopted_and_the_log_says_so(api, caplog):
    api.server.pages = [
        {"data": [_batch("msgbatch_a", 3), _batch("msgbatch_b", 3)], "has_more": False}
    ]
    with caplog.at_level(logging.WARNING, logger="hermes_bulk.providers.message_batches"):
        assert api.find(_record(3)) is None
    assert [r.getMessage() for r in caplog.records] == [
        "batch b1: 2 provider batches could be it; none is adopted"
    ]
    caplog.clear()
    api.server.pages = [{"data": [_batch("msgbatch_a", 4)], "has_more": False}]
    with caplog.at_level(logging.WARNING, logger="hermes_bulk.providers.message_batches"):
        assert api.find(_record(3)) is None
    assert caplog.records == [], "none fits: nothing to say"


@pytest.mark.parametrize("folder", ["archive", "batches-old", "other"])
def test_a_requests_file_outside_a_batches_folder_is_never_read(api, tmp_path, folder):
    """Folders whose names sort before and after `batches`, and one that begins with it."""
    path = tmp_path / folder / "b1.requests.jsonl"
    path.parent.mkdir()
    path.write_text("{}\n")
    with pytest.raises(BatchAnswerInvalid, match="not on this machine"):
        api.create(LOCAL + str(path), window="24h", metadata={})
    assert path.exists() and api.server.asked == []
