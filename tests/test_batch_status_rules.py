"""Batch status mapping as pure functions, with the neighbours of the cases
tests/test_message_batches.py reads: what an ended Message Batch is (a cancel asked with and
without canceled requests, expired beside canceled), what is counted failed, and which OpenAI
batch statuses are known."""

from __future__ import annotations

import pytest

from hermes_bulk.providers.batch_api import (
    STATUSES,
    TERMINAL,
    BatchAnswerInvalid,
    remote_batch,
)
from hermes_bulk.providers.message_batches import message_batch

ASKED = "2026-12-05T12:00:00Z"


def counts(succeeded=0, errored=0, canceled=0, expired=0, processing=0) -> dict[str, int]:
    return {
        "succeeded": succeeded,
        "errored": errored,
        "canceled": canceled,
        "expired": expired,
        "processing": processing,
    }


def batch(status="ended", asked=None, **n) -> dict:
    return {
        "id": "msgbatch_1",
        "type": "message_batch",
        "processing_status": status,
        "request_counts": counts(**n),
        "cancel_initiated_at": asked,
    }


@pytest.mark.parametrize(
    ("asked", "n", "ours"),
    [
        (ASKED, {"succeeded": 2, "canceled": 1}, "cancelled"),
        (ASKED, {"succeeded": 3}, "completed"),  # asked too late: nothing was cancelled
        (ASKED, {"succeeded": 2, "expired": 1}, "expired"),
        (ASKED, {"canceled": 1, "expired": 1}, "cancelled"),  # our cancel names the end
        (None, {"canceled": 1, "expired": 1}, "expired"),
        (None, {"canceled": 1}, "completed"),  # canceled, not by us: no cancel of ours
        (None, {"succeeded": 1, "errored": 2}, "completed"),
        (None, {"expired": 1}, "expired"),
        (None, {}, "completed"),
    ],
)
def test_what_an_ended_message_batch_is(asked, n, ours):
    read = message_batch(batch(asked=asked, **n))
    assert read.status == ours and read.output_file == "msgbatch_1"


@pytest.mark.parametrize(("status", "ours"), [("in_progress", "in_progress"),
                                              ("canceling", "cancelling")])  # fmt: skip
def test_a_message_batch_not_ended_has_no_results_whatever_it_counts(status, ours):
    for asked in (None, ASKED):
        read = message_batch(batch(status, asked, succeeded=1, canceled=1, expired=1))
        assert (read.status, read.output_file) == (ours, None)


def test_requests_still_processing_are_neither_done_nor_failed():
    read = message_batch(batch("in_progress", succeeded=1, errored=1, processing=5))
    assert (read.completed, read.failed) == (1, 1)


@pytest.mark.parametrize("status", sorted(STATUSES))
def test_every_openai_batch_status_is_read_as_given(status):
    data = {"id": "batch_1", "status": status, "request_counts": {"completed": 1, "failed": 0}}
    assert remote_batch(data).status == status


@pytest.mark.parametrize("status", ["ended", "canceled", "canceling", "Completed", "", None])
def test_a_status_beside_the_known_ones_makes_the_answer_invalid(status):
    with pytest.raises(BatchAnswerInvalid):
        remote_batch({"id": "batch_1", "status": status, "request_counts": {}})


def test_the_terminal_statuses_are_the_four_ends():
    assert {"completed", "failed", "expired", "cancelled"} == TERMINAL
    assert {"validating", "in_progress", "finalizing", "cancelling"} == STATUSES - TERMINAL
