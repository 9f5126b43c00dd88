"""What a provider's answer says of its rate limits, read before the provider has to answer 429.

OpenAI (and the compatible servers that copy it) send `x-ratelimit-{limit,remaining,reset}-
{requests,tokens}`, the resets as Go durations (`1s`, `6m0s`, `20ms`); Anthropic sends
`anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}`,
the resets as RFC 3339 times. Both limits are per minute, and both providers refill their
buckets continuously, so a request's share of a limit comes back in 60/limit seconds.

How the worker uses them (runtime/pipeline.py, through providers/pacing.ProviderGate):
  - while less than half of a limit is left, requests are paced at that limit by the shared
    GCRA (as --rpm/--tpm would pace them, and never faster than those), so a job settles at
    the provider's rate instead of emptying the bucket and bouncing off 429s;
  - when an answer says not enough is left for the next request (nothing, or fewer tokens than
    its estimate), every worker of the key waits until that much has come back (a shared wait
    that is not a 429: it neither slows the adaptive rate nor grows the backoff).
A provider that sends none of these headers is paced as before (--rpm/--tpm, and 429s).

Every value is untrusted: a count that is not plain digits, a limit of 0, a reset that is not a
duration or a time, or one past a day, is left out, and a dimension without a limit and a
remaining count is not read at all.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from dataclasses import dataclass

#: The largest limit or count taken (a provider's tier is far below; 10**30 is not a limit).
MAX_COUNT = 10**12
#: The longest reset taken, and the longest shared wait an answer's headers can start.
MAX_RESET_S = 86_400.0
MAX_HOLD_S = 60.0

_GO_DURATION = re.compile(
    r"(?:(?P<h>\d+(?:\.\d+)?)h)?(?:(?P<m>\d+(?:\.\d+)?)m(?!s))?(?:(?P<s>\d+(?:\.\d+)?)s)?"
    r"(?:(?P<ms>\d+(?:\.\d+)?)ms)?"
)
_DIGITS = re.compile(r"[0-9]{1,13}")


@dataclass(frozen=True, slots=True)
class Window:
    """One limit as the answer saw it: per minute, what is left, when it is full again."""

    limit: int
    remaining: int
    reset_s: float | None = None

    @property
    def low(self) -> bool:
        """Less than half of it is left: pace at the limit."""
        return self.remaining * 2 < self.limit

    def wait_for(self, need: int) -> float:
        """Seconds until `need` is available: the deficit at the limit's refill rate, no later
        than the reset the provider gave."""
        if self.remaining >= need:
            return 0.0
        refill_s = (need - self.remaining) * 60.0 / self.limit
        return refill_s if self.reset_s is None else min(refill_s, self.reset_s)


@dataclass(frozen=True, slots=True)
class RateHeaders:
    """An answer's rate-limit headers: requests and tokens, each None when not sent."""

    requests: Window | None = None
    tokens: Window | None = None

    def pace(self, rpm: int | None, tpm: int | None) -> tuple[int | None, int | None]:
        """The rpm and tpm to pace at: the job's, lowered to each limit that is running low."""
        return (
            _lowest(rpm, self.requests.limit if self.requests and self.requests.low else None),
            _lowest(tpm, self.tokens.limit if self.tokens and self.tokens.low else None),
        )

    def hold_s(self, tokens: int) -> float:
        """How long every worker should wait before the next request (of about `tokens`)."""
        waits = [0.0]
        if self.requests:
            waits.append(self.requests.wait_for(1))
        if self.tokens:
            waits.append(self.tokens.wait_for(min(tokens, self.tokens.limit)))
        return min(MAX_HOLD_S, max(waits))


def _lowest(a: int | None, b: int | None) -> int | None:
    return min(x for x in (a, b) if x) if a or b else None


def read(headers: Mapping[str, str], now: datetime.datetime | None = None) -> RateHeaders | None:
    """The rate-limit headers of an answer (either provider's spelling), or None when it sent
    none that can be read."""
    lowered = {k.lower(): v for k, v in headers.items()}
    requests = _window(lowered, "x-ratelimit-{}-requests", now) or _window(
        lowered, "anthropic-ratelimit-requests-{}", now
    )
    tokens = (
        _window(lowered, "x-ratelimit-{}-tokens", now)
        or _window(lowered, "anthropic-ratelimit-tokens-{}", now)
        or _window(lowered, "anthropic-ratelimit-input-tokens-{}", now)
    )
    return RateHeaders(requests, tokens) if requests or tokens else None


def _window(headers: dict[str, str], pattern: str, now: datetime.datetime | None) -> Window | None:
    limit = _count(headers.get(pattern.format("limit")))
    remaining = _count(headers.get(pattern.format("remaining")))
    if not limit or remaining is None:
        return None
    return Window(limit, min(remaining, limit), _reset_s(headers.get(pattern.format("reset")), now))


def _count(value: str | None) -> int | None:
    if value is None or not _DIGITS.fullmatch(value.strip()):
        return None
    number = int(value)
    return number if number <= MAX_COUNT else None


def _reset_s(value: str | None, now: datetime.datetime | None) -> float | None:
    """A reset as seconds from now: a Go duration (OpenAI), plain seconds, or an RFC 3339 time
    (Anthropic); None for anything else or past MAX_RESET_S."""
    if not value or len(value) > 64:
        return None
    value = value.strip()
    seconds = go_duration_s(value)
    if seconds is None:
        try:
            when = datetime.datetime.fromisoformat(value)
        except ValueError:
            return None
        if when.tzinfo is None:
            return None
        now = now or datetime.datetime.now(datetime.UTC)
        seconds = max(0.0, (when - now).total_seconds())
    return seconds if seconds <= MAX_RESET_S else None


def go_duration_s(text: str) -> float | None:
    """`6m0s`, `1.5s`, `20ms`, `1h2m`, or plain seconds (`0.5`), as seconds; None otherwise."""
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return float(text)
    match = _GO_DURATION.fullmatch(text)
    if not match or not any(match.groupdict().values()):
        return None
    parts = {k: float(v) for k, v in match.groupdict().items() if v}
    return (
        parts.get("h", 0) * 3600
        + parts.get("m", 0) * 60
        + parts.get("s", 0)
        + parts.get("ms", 0) / 1000
    )
