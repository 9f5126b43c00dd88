"""A provider's rate-limit headers (providers/rate_headers.py), both spellings, read as an
attacker would send them; and the gate's use of them against the real shared limiter."""

from __future__ import annotations

import datetime
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hermes_bulk.providers import pacing, rate_headers
from hermes_bulk.providers.pacing import ProviderGate
from hermes_bulk.providers.rate_headers import RateHeaders, Window, go_duration_s

NOW = datetime.datetime(2026, 12, 5, 12, 0, 0, tzinfo=datetime.UTC)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("6m0s", 360.0), ("20ms", 0.02), ("1h2m3.5s", 3723.5), ("0.5", 0.5),
     ("1m", 60.0), ("2h", 7200.0), ("0s", 0.0)],
)  # fmt: skip
def test_go_durations_are_read(text, seconds):
    assert go_duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "1x", "-1s", "1s1h", "ms", "1e3s", "1.s", "nan"])
def test_what_is_no_duration_is_none(text):
    assert go_duration_s(text) is None


def test_openai_headers_are_read():
    seen = rate_headers.read(
        {
            "X-RateLimit-Limit-Requests": "1200",
            "x-ratelimit-remaining-requests": "1190",
            "x-ratelimit-reset-requests": "500ms",
            "x-ratelimit-limit-tokens": "150000",
            "x-ratelimit-remaining-tokens": "20000",
            "x-ratelimit-reset-tokens": "6m0s",
        }
    )
    assert seen == RateHeaders(Window(1200, 1190, 0.5), Window(150000, 20000, 360.0))


def test_anthropic_headers_are_read_with_their_times():
    seen = rate_headers.read(
        {
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": "2026-12-05T12:00:01.500Z",
            "anthropic-ratelimit-input-tokens-limit": "30000",
            "anthropic-ratelimit-input-tokens-remaining": "29000",
            "anthropic-ratelimit-input-tokens-reset": "2026-12-05T12:00:02+00:00",
        },
        now=NOW,
    )
    assert seen == RateHeaders(Window(50, 0, 1.5), Window(30000, 29000, 2.0))
    # the combined tokens limit, when sent, is the one paced at (the most restrictive)
    both = rate_headers.read(
        {
            "anthropic-ratelimit-tokens-limit": "8000",
            "anthropic-ratelimit-tokens-remaining": "10",
            "anthropic-ratelimit-input-tokens-limit": "30000",
            "anthropic-ratelimit-input-tokens-remaining": "29000",
        }
    )
    assert both.tokens == Window(8000, 10, None)


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"x-ratelimit-limit-requests": "0", "x-ratelimit-remaining-requests": "0"},
        {"x-ratelimit-limit-requests": "-5", "x-ratelimit-remaining-requests": "1"},
        {"x-ratelimit-limit-requests": "1e3", "x-ratelimit-remaining-requests": "1"},
        {"x-ratelimit-limit-requests": "10" * 20, "x-ratelimit-remaining-requests": "1"},
        {"x-ratelimit-limit-requests": "60"},  # a limit without what is left says nothing
        {"x-ratelimit-remaining-requests": "5"},
        {"x-ratelimit-limit-requests": "٣", "x-ratelimit-remaining-requests": "1"},  # not ASCII
    ],
)
def test_headers_that_cannot_be_read_are_none(headers):
    assert rate_headers.read(headers) is None


def test_a_reset_of_another_shape_is_left_out_and_the_rest_is_kept():
    base = {"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "99"}
    for reset in ("soon", "2026-12-05T12:00:00", "9999999s", "x" * 500, "1s; evil=1"):
        seen = rate_headers.read({**base, "x-ratelimit-reset-requests": reset}, now=NOW)
        assert seen.requests == Window(60, 60, None), reset  # remaining capped at the limit
    past = rate_headers.read(
        {**base, "x-ratelimit-reset-requests": "2026-12-05T11:00:00Z"}, now=NOW
    )
    assert past.requests.reset_s == 0.0


@given(st.dictionaries(st.sampled_from([
    "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests",
    "anthropic-ratelimit-tokens-limit", "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-tokens-reset"]), st.text(max_size=40)))  # fmt: skip
def test_any_text_in_any_header_is_read_or_refused_never_raised(headers):
    seen = rate_headers.read(headers, now=NOW)
    if seen is not None:
        for window in (seen.requests, seen.tokens):
            if window:
                assert 0 < window.limit <= rate_headers.MAX_COUNT
                assert 0 <= window.remaining <= window.limit
                assert window.reset_s is None or 0 <= window.reset_s <= rate_headers.MAX_RESET_S
        assert 0 <= seen.hold_s(1000) <= rate_headers.MAX_HOLD_S


def test_a_limit_is_paced_at_only_while_it_runs_low_and_never_above_the_jobs():
    plenty = RateHeaders(Window(1200, 1000), Window(100_000, 90_000))
    assert plenty.pace(None, None) == (None, None)
    assert plenty.pace(600, None) == (600, None)
    low = RateHeaders(Window(1200, 10), Window(100_000, 1_000))
    assert low.pace(None, None) == (1200, 100_000)
    assert low.pace(600, 200_000) == (600, 100_000), "the lower of the job's and the provider's"


def test_the_hold_is_what_the_next_request_lacks_at_the_refill_rate():
    assert RateHeaders(Window(1200, 1)).hold_s(500) == 0
    assert RateHeaders(Window(1200, 0)).hold_s(500) == pytest.approx(0.05)  # 60 / 1200
    assert RateHeaders(Window(1200, 0, 0.01)).hold_s(500) == pytest.approx(0.01), "no past reset"
    tokens = RateHeaders(None, Window(60_000, 100))
    assert tokens.hold_s(600) == pytest.approx(0.5)  # 500 short at 1,000 a second
    assert tokens.hold_s(10**9) == pytest.approx(59.9), "a request above the limit waits for all"
    assert RateHeaders(Window(1, 0, 3600.0)).hold_s(1) == rate_headers.MAX_HOLD_S


def test_the_gate_paces_at_an_announced_limit_and_holds_every_worker(settings):
    """Against the real shared limiter (SQLite): a low limit spaces requests; an answer that
    leaves nothing holds the key, without slowing the adaptive rate or growing the backoff."""
    from hermes_bulk.fleet.broker import open_backend

    backend = open_backend(settings)
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        time.sleep(seconds)

    seen: list[RateHeaders | None] = [None]
    gate = ProviderGate(
        backend.limits, "p:test", rpm=None, tpm=None, sleep=sleep, announced=lambda: seen[0]
    )
    gate.wait_for_turn(10)
    gate.wait_for_turn(10)
    assert slept == [], "nothing announced: unpaced"
    seen[0] = RateHeaders(Window(600, 5))  # ten a second, running low
    gate.wait_for_turn(10)
    gate.wait_for_turn(10)
    assert slept and 0.05 < sum(slept) <= 0.1, "the second paced request waits a tenth"
    seen[0] = RateHeaders(Window(600, 0, 30.0))
    gate.succeeded(10)
    state = backend.limits.pause_state("p:test")
    assert state is not None and state.backoff_step == 0, "a hold is no 429"
    assert 0.05 < state.until - backend.store.now() <= 0.1, "one request's refill, not the reset"


def test_the_edges_of_a_window():
    assert not Window(100, 50).low and Window(100, 49).low, "half left is not yet low"
    assert Window(1200, 5).wait_for(1) == 0.0, "more than enough left waits nothing"
    top = {"x-ratelimit-limit-requests": str(10**12), "x-ratelimit-remaining-requests": "0"}
    assert rate_headers.read(top).requests == Window(10**12, 0)
    assert rate_headers.read({**top, "x-ratelimit-limit-requests": str(10**12 + 1)}) is None
    seen = rate_headers.read(top)
    with pytest.raises(AttributeError):  # shared by every thread of a worker: never changed
        seen.requests = None  # type: ignore[misc]


def test_a_reset_is_taken_up_to_a_day_and_64_characters():
    base = {"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "1"}

    def reset(text: str) -> float | None:
        return rate_headers.read({**base, "x-ratelimit-reset-requests": text}).requests.reset_s

    assert reset("86400s") == 86_400.0 and reset("86401s") is None
    assert reset("0" * 62 + "1s") == 1.0 and reset("0" * 63 + "1s") is None
    with pytest.raises(AttributeError):
        Window(1, 1).limit = 2  # type: ignore[misc]


def test_a_workers_first_request_goes_alone_and_its_429_teaches_nothing(settings, monkeypatch):
    """Against the real shared limiter (SQLite): before the key's first answer in this process,
    one gate's request goes and the others wait for its answer; a 429 to that lone request is a
    wait that halves no rate (the epoch stays), where the next 429 does halve it."""
    import threading

    from hermes_bulk.fleet.broker import open_backend

    backend = open_backend(settings)

    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        time.sleep(seconds)

    def gate() -> ProviderGate:
        return ProviderGate(
            backend.limits, "p:first", rpm=None, tpm=None, sleep=sleep, announced=lambda: None
        )

    first, second = gate(), gate()
    first.wait_for_turn(10)
    waiting, waited = threading.Event(), []
    real_turn = pacing.FIRST_ANSWERS.turn

    class Watched:  # the first answer's event, telling the test when it is waited on
        def __init__(self, event: threading.Event) -> None:
            self.event = event

        def wait(self, timeout: float) -> bool:
            waiting.set()
            waited.append(self.event.wait(timeout))
            return waited[-1]

    def turn(key: str):
        seen = real_turn(key)
        return Watched(seen) if isinstance(seen, threading.Event) else seen

    monkeypatch.setattr(pacing.FIRST_ANSWERS, "turn", turn)
    monkeypatch.setattr(pacing, "FIRST_ANSWER_WAIT_S", 60.0)
    answered = threading.Event()
    went: list[bool] = []

    def other() -> None:
        second.wait_for_turn(10)
        went.append(answered.is_set())

    thread = threading.Thread(target=other)
    thread.start()
    assert waiting.wait(10) and not second.first and first.first
    answered.set()
    first.rate_limited(0.2)  # the lone request's 429
    thread.join(10)
    assert went == [True] and waited == [True], "the other went only after the first's answer"
    assert sum(slept) > 0.1 and second.epoch == 0, "it waited out the 429, and learnt nothing"
    assert not first.first, "answered: the next request of that gate is like any other"
    second.rate_limited(0.2)  # a 429 to a request among others: the rate is halved
    third = gate()
    third.wait_for_turn(10)
    assert third.epoch == 1


def test_a_first_request_that_fails_without_an_answer_lets_the_others_go(settings):
    from hermes_bulk.fleet.broker import open_backend

    backend = open_backend(settings)
    first = ProviderGate(backend.limits, "p:fails", rpm=None, tpm=None, announced=lambda: None)
    first.wait_for_turn(10)
    first.answered()  # what the pipeline does whatever ended the attempt
    started = time.monotonic()
    ProviderGate(
        backend.limits, "p:fails", rpm=None, tpm=None, announced=lambda: None
    ).wait_for_turn(10)
    assert time.monotonic() - started < 1, "not the FIRST_ANSWER_WAIT_S of a first still out"


def test_a_hold_after_a_halving_halves_nothing_more(settings):
    """The hold's epoch is one no grant carries: even after a 429 has halved the rate once
    (epoch 1), a hold leaves the count of decreases where it was."""
    from hermes_bulk.fleet.broker import open_backend

    backend = open_backend(settings)
    gate = ProviderGate(backend.limits, "p:halved", rpm=None, tpm=None)
    gate.wait_for_turn(10)
    gate.rate_limited(0.05)  # the first 429 of its generation: decreases 0 -> 1
    gate.hold(0.05)
    after = ProviderGate(backend.limits, "p:halved", rpm=None, tpm=None)
    after.wait_for_turn(10, max_block_s=60)  # the turn after both waits: its count of decreases
    assert after.epoch == 1


def test_each_endpoint_and_key_is_a_quota_of_its_own():
    from hermes_bulk.providers.pacing import provider_key

    one = provider_key("https://api.example/v1/", "sk-a")
    assert one == provider_key("https://api.example/v1", "sk-a"), "a trailing slash is the same"
    assert one != provider_key("https://api.example/v1", "sk-b")
    assert one != provider_key("https://other.example/v1", "sk-a")
    assert provider_key("https://api.example/v1", None) == provider_key(
        "https://api.example/v1", ""
    )
    assert one.startswith("p:") and len(one) == 22
