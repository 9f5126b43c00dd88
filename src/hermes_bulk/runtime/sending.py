"""An item's request: through the shared limits (pacing, the 429 pause), the request gate and
the endpoint's breaker, retried while it fails for a passing reason; its answer checked against
the job's --schema."""

from __future__ import annotations

import json
import logging

from tenacity import RetryCallState, Retrying, retry_if_exception, wait_exponential

from ..durations import zoned_clock
from ..errors import (
    EndpointUnreachable,
    InvalidAnswer,
    ModelError,
    RateLimited,
    TransientModelError,
    with_usage,
)
from ..jobs import prompt
from ..providers import answers
from ..providers.client import Completion, ModelClient
from ..providers.pacing import MAX_RATE_LIMIT_WAITS, LongWait, ProviderGate
from ..store.protocol import Claim, Event, ItemError
from ..words import count
from .breaker import SPACING_S, EndpointBroken, pause_reason, trips
from .saving import LostClaim, item_error

log = logging.getLogger("hermes_bulk.runtime.pipeline")

RETRY_WAIT = wait_exponential(multiplier=2, max=30)  # 2, 4, 8, 16, 30, 30 … seconds
#: How soon a request that could not connect is tried again (nothing reached the endpoint, nothing
#: was billed): as often as the breaker counts such failures, which pauses the job after its count.
CONNECT_RETRY_S = SPACING_S


class _NotConnected(TransientModelError):
    """A failure to connect while the endpoint answers nobody: the endpoint's failure, not the
    item's, so it does not use up the item's retries (the breaker bounds it)."""

    def __init__(self, cause: EndpointUnreachable) -> None:
        super().__init__(str(cause))
        self.cause = cause


class Sending:
    """An item's request sent (a part of ItemProcessor, pipeline.py, whose state it uses)."""

    def _call_with_retries(self, claim: Claim, client: ModelClient) -> Completion:
        """Transient errors: tenacity, waiting 2, 4, 8 … 30 s, at most the job's retries. A failure
        to connect while the endpoint answers nobody is retried every CONNECT_RETRY_S without using
        up retries, until the breaker pauses the job (EndpointBroken) or a request goes through.
        An answer the provider billed (ModelError.billed) is never retried here: it ends the
        claim (_settle_billed), whose reservation covered one attempt."""
        retries = claim.job.spec.retries
        # attempts charged to the item (a failure to connect while nobody is answered is not)
        counted = [0]

        def record(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            if isinstance(exc, _NotConnected):  # an event, not an attempt of the item
                self.store.add_events(
                    claim.job.job_id,
                    [
                        Event(
                            "attempt_failed",
                            f"{exc} (not counted against retries: the endpoint answers nobody)",
                            claim.index,
                            exc.error_type,
                        )
                    ],
                )
                return
            counted[0] += 1
            if (
                isinstance(exc, ModelError)
                and self.store.record_attempt(
                    claim.job.job_id,
                    claim.index,
                    self.worker_id,
                    item_error(exc),
                    rate_limited=False,
                )
                < 0
            ):
                raise LostClaim()

        def stop(state: RetryCallState) -> bool:
            return claim.attempts + counted[0] > retries

        def wait(state: RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            return CONNECT_RETRY_S if isinstance(exc, _NotConnected) else RETRY_WAIT(state)

        retrying = Retrying(
            retry=retry_if_exception(_retried_in_claim),
            stop=stop,
            wait=wait,
            after=record,
            sleep=self._wait_before_sending,
            reraise=True,
        )
        return retrying(self._call_through_limits, claim, client)

    def _call_through_limits(self, claim: Claim, client: ModelClient) -> Completion:
        """One attempt: wait for the shared limiter, call; a 429 pauses everyone and loops."""
        spec = claim.job.spec
        gate = ProviderGate(
            self.limits,
            client.provider_key,
            rpm=spec.rpm,
            tpm=spec.tpm,
            sleep=self._wait_before_sending,
            # Hermes' ctx.llm reads no headers: its client has no announced()
            announced=getattr(client, "announced", lambda: None),
        )
        text, digest = prompt.item_text(spec, claim.content, claim.content_hash)
        messages = prompt.build_messages(spec.instruction, claim.name, text, digest, spec.system)
        estimate = prompt.estimate_tokens(
            text, spec.instruction, claim.job.output_allowance, spec.system
        )
        schema = json.loads(spec.schema) if spec.schema else None
        taken = claim.turn  # taken with the claim, for the first request only
        try:
            while True:
                gate.wait_for_turn(estimate, taken=taken)
                taken = None
                try:
                    completion = self._send(claim, client, messages, schema)
                except RateLimited as exc:
                    self.counters.add(rate_limit_waits=1)
                    until = gate.rate_limited(exc.retry_after_s)
                    waits = self.store.record_attempt(
                        spec.job_id,
                        claim.index,
                        self.worker_id,
                        ItemError(
                            "RateLimitError",
                            f"rate limited (HTTP 429); all workers wait until {zoned_clock(until)}",
                            429,
                        ),
                        rate_limited=True,
                    )
                    if waits < 0:
                        raise LostClaim() from None
                    if spec.retries == 0 or waits >= MAX_RATE_LIMIT_WAITS:
                        raise RateLimited(
                            f"rate limited (HTTP 429) {count(waits, 'time')} in a row; run retry "
                            "later or lower --concurrency"
                        ) from None
                    continue
                gate.succeeded(estimate)
                return structured(completion, spec.schema) if spec.schema else completion
        finally:
            gate.answered()  # a first request that failed otherwise lets the others go too

    def _send(self, claim: Claim, client: ModelClient, messages, schema) -> Completion:
        """One request: on its way from here (unless this worker stopped sending, _NotSent),
        admitted by the request gate, sent; no longer on its way if it ends without an answer
        to save."""
        self._sending(claim)  # first: a worker that stopped sending charges no budget
        try:
            held_s = self.request_gate.admit(claim.job)
            if held_s > 0:
                raise LongWait(held_s)  # the budget window is spent: back until it reopens
            self.counters.add(requests=1)
            attempt = self.breaker.attempt(client.provider_key)
            return self._call_once(claim, client, attempt, messages, schema)
        except BaseException:
            self._not_sending(claim)
            raise

    def _call_once(
        self, claim: Claim, client: ModelClient, attempt, messages, schema
    ) -> Completion:
        """client.complete, told to the breaker: an HTTP answer resets it; a refused key or an
        unknown model trips it (EndpointBroken), so does the last of its count of failures to
        connect."""
        spec = claim.job.spec
        try:
            completion = client.complete(
                messages,
                max_tokens=spec.max_output_tokens,
                json_schema=schema,
                options=spec.options,
            )
        except EndpointUnreachable as exc:
            self._uncharge(claim, exc)
            verdict = self.breaker.unreachable(attempt)
            if verdict.tripped:
                raise EndpointBroken(self._reason(claim, client, exc, verdict.streak)) from None
            if verdict.answered_since:  # the endpoint is up: this counts as any transient failure
                raise
            raise _NotConnected(exc) from None
        except ModelError as exc:
            self._uncharge(claim, exc)
            if exc.http_status is not None:
                self.breaker.answered(attempt.key)
            if trips(exc):
                raise EndpointBroken(self._reason(claim, client, exc)) from None
            raise
        self.breaker.answered(attempt.key)
        return completion

    def _uncharge(self, claim: Claim, exc: ModelError) -> None:
        """A request that never reached the provider is taken back from the request budget,
        which counts what a provider could bill or rate-limit."""
        if not exc.reached_provider:
            self.request_gate.not_sent(claim.job)

    def _reason(self, claim: Claim, client: ModelClient, exc: ModelError, streak: int = 0) -> str:
        spec = claim.job.spec
        return pause_reason(
            exc,
            endpoint=getattr(client, "endpoint", None),
            model=spec.model,
            streak=streak,
            http_client=spec.client == "http",
        )


def unpaced_key(client: ModelClient, spec) -> str | None:
    """The client's provider key when its next request needs no pacing: no --rpm or --tpm, and
    no rate-limit headers running low (ProviderGate.wait_for_turn would acquire with neither)."""
    if spec.rpm or spec.tpm:
        return None
    seen = getattr(client, "announced", lambda: None)()
    if seen is not None and any(seen.pace(None, None)):
        return None
    return client.provider_key


def structured(completion: Completion, schema: str) -> Completion:
    """A --schema answer as canonical JSON, once it is a JSON object valid under the job's
    schema (its JSON text); else InvalidAnswer, carrying the answer's usage (it was billed)."""
    try:
        return _structured(completion, schema)
    except ModelError as exc:
        raise with_usage(exc, completion.usage) from None


def _structured(completion: Completion, schema: str) -> Completion:
    text = completion.text.strip()
    if text.startswith("```"):  # some models fence JSON even when asked not to
        text = text.strip("`").removeprefix("json").strip()
    data = answers.loads(text, "the answer to a --schema request")
    if not isinstance(data, dict):
        raise InvalidAnswer("the answer is not a JSON object as --schema asks", http_status=200)
    answers.check_answer(data, schema)
    return Completion(
        json.dumps(data, ensure_ascii=False),
        completion.usage,
        completion.provider,
        completion.model,
    )


def _retried_in_claim(exc: BaseException) -> bool:
    """A transient failure the provider billed nothing for (a timeout, a 5xx, a connection)."""
    return isinstance(exc, TransientModelError) and not exc.billed
