"""The loopback provider's gate, which tests use to prove what did not reach the provider: a
held request is recorded at once and answered only after release; let_through answers the
next n first; a stop with requests held still stops."""

from __future__ import annotations

import http.client
import json
import threading

from hermes_bulk.testing.fake_provider import FakeProvider, expected_answer


def _ask(port: int, text: str, answers: list[str]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}),
            headers={"Content-Type": "application/json"},
        )
        body = json.loads(conn.getresponse().read())
        answers.append(body["choices"][0]["message"]["content"])
    except (OSError, http.client.HTTPException):
        answers.append("no answer")
    finally:
        conn.close()


def _start(provider: FakeProvider, texts: list[str], answers: list[str]) -> list[threading.Thread]:
    askers = [
        threading.Thread(target=_ask, args=(provider.port, text, answers), daemon=True)
        for text in texts
    ]
    for asker in askers:
        asker.start()
    return askers


def test_held_requests_are_recorded_at_once_and_answered_only_after_release():
    provider = FakeProvider().start()
    try:
        provider.hold()
        answers: list[str] = []
        askers = _start(provider, ["a", "b"], answers)
        provider.wait_held(2, timeout=10)
        assert len(provider.requests) == 2 and answers == [], "recorded on arrival, not answered"
        provider.release()
        for asker in askers:
            asker.join(10)
        assert sorted(answers) == sorted(expected_answer(t) for t in "ab") and provider.held == 0
        later: list[str] = []
        for asker in _start(provider, ["c"], later):
            asker.join(10)
        assert later == [expected_answer("c")], "an open gate answers at once"
    finally:
        provider.release()
        provider.stop()


def test_let_through_answers_the_next_n_then_holds():
    provider = FakeProvider().start()
    try:
        provider.hold(let_through=2)
        answers: list[str] = []
        first = _start(provider, ["a", "b"], answers)
        for asker in first:
            asker.join(10)
        assert len(answers) == 2
        held = _start(provider, ["c"], answers)
        provider.wait_held(1, timeout=10)
        assert provider.wait_requests(3, timeout=10)[-1].status == 0 and len(answers) == 2
        provider.release()
        for asker in held:
            asker.join(10)
        assert answers[-1] == expected_answer("c")
    finally:
        provider.release()
        provider.stop()


def test_a_provider_stops_with_requests_held_at_its_gate():
    provider = FakeProvider().start()
    provider.hold()
    answers: list[str] = []
    askers = _start(provider, ["a"], answers)
    provider.wait_held(1, timeout=10)
    provider.stop()
    assert not provider._thread.is_alive(), "the server thread outlived stop()"
    for asker in askers:
        asker.join(10)
    assert answers == ["no answer"]


def _control(port: int, payload: dict) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(
            "POST",
            "/_control",
            body=json.dumps(payload),
            headers={"Content-Type": "application/json"},
        )
        assert conn.getresponse().status == 200
    finally:
        conn.close()


def test_the_gate_is_worked_from_another_process_through_control():
    provider = FakeProvider().start()
    try:
        _control(provider.port, {"gate": "hold", "let_through": 1})
        answers: list[str] = []
        for asker in _start(provider, ["a"], answers):
            asker.join(10)
        held = _start(provider, ["b"], answers)
        provider.wait_held(1, timeout=10)
        assert answers == [expected_answer("a")]
        _control(provider.port, {"gate": "release"})
        for asker in held:
            asker.join(10)
        assert answers == [expected_answer("a"), expected_answer("b")]
    finally:
        provider.release()
        provider.stop()
