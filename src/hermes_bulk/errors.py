"""Every error hermes-bulk raises on purpose, in one small hierarchy.

User-facing errors carry a message that says what is wrong and what to do; the CLI and the `/bulk`
command print `str(exc)` of these and nothing else. Model errors are classified once, at the client
boundary (`providers/client.py`), and never carry provider text: a provider's error body can echo
credentials, so it goes to the log only."""

from __future__ import annotations


class HermesBulkError(Exception):
    """Base class: a failure hermes-bulk understands and can explain in one line."""


class InputError(HermesBulkError):
    """The source given to `create` (or a flag) cannot be used; nothing was created."""


class UsageError(InputError):
    """The command line (or a value on it) is not usable as given: exit 2, or /bulk's usage reply.

    `usage` is the command's usage line when the parser knows it, else "".
    """

    def __init__(self, message: str, usage: str = "") -> None:
        super().__init__(message)
        self.usage = usage


class ConfigError(HermesBulkError):
    """A setting has a bad value; the message names the setting."""


class BackendUnavailable(HermesBulkError):
    """The configured backend (Redis, or the SQLite file) cannot be reached or opened."""


class NoDatabase(HermesBulkError):
    """A command that only reads was pointed at a SQLite file that does not exist; nothing was
    made."""


class JobNotFound(HermesBulkError):
    """No job matches the id (or id prefix) given."""


class InvalidTransition(HermesBulkError):
    """The job is not in a state that allows the requested command."""


class ClientUnavailable(HermesBulkError):
    """This worker cannot make the model calls a job needs; it leaves the job to workers that can.

    A job created in Hermes calls Hermes' model (`ctx.llm`), a job created by `hermes-bulk
    create` calls the endpoint in HERMES_BULK_*: a worker never sends one kind to the other.
    """


# Model errors ---------------------------------------------------------------------------------


class ModelError(HermesBulkError):
    """A model call failed. `error_type` and `http_status` are what job records keep."""

    error_type = "ModelError"
    #: Whether the request reached the provider, which may then bill it or count it against a
    #: rate limit: what the request budget counts. False for a connection never made and a call
    #: refused before it was sent (not_sent()).
    reached_provider = True
    #: What the provider reported it billed for the answer this error refuses (a truncated,
    #: invalid or refused answer): a store.records.Usage, charged to the job though the answer is
    #: not kept; None when nothing was answered or no usage came with it (billed()).
    usage = None

    def __init__(self, message: str, *, http_status: int | None = None) -> None:
        super().__init__(message)
        self.http_status = http_status

    @property
    def billed(self) -> bool:
        """The provider reported usage for this attempt: it is charged, and ends its claim."""
        return self.usage is not None and self.usage.reported


def with_usage(exc: ModelError, usage) -> ModelError:
    """exc, carrying the usage the provider reported with the refused answer (the first one
    given: the answer's own, before a caller's guess)."""
    if exc.usage is None and usage is not None and usage.reported:
        exc.usage = usage
    return exc


def not_sent(exc: ModelError) -> ModelError:
    """exc, marked as a failure of a request that never reached the provider."""
    exc.reached_provider = False
    return exc


class RateLimited(ModelError):
    """HTTP 429: every worker sharing the provider key waits; does not use up retries."""

    error_type = "RateLimitError"

    def __init__(
        self,
        message: str = "rate limited by the provider (HTTP 429)",
        *,
        retry_after_s: float | None = None,
        http_status: int | None = 429,
    ) -> None:
        super().__init__(message, http_status=http_status)
        self.retry_after_s = retry_after_s


class TransientModelError(ModelError):
    """Timeouts, connection errors, empty answers, HTTP 408/409/425/5xx: retried with backoff."""

    error_type = "TransientError"


class EndpointUnreachable(TransientModelError):
    """No connection to the endpoint could be made (refused, no route, DNS, a connect timeout):
    nothing was sent, so it says nothing about the item; runtime/breaker.py counts it for the
    endpoint."""

    reached_provider = False


class EndpointRedirects(EndpointUnreachable):
    """The endpoint answered with a redirect (HTTP 3xx), which is never followed (the key would
    go to the host it names): the request was not served there, so, as a failure to connect, it
    says nothing about the item and the breaker counts it for the endpoint. The request itself
    did reach a host the endpoint's URL names (with its key), so the budget counts it."""

    reached_provider = True


class PermanentModelError(ModelError):
    """Authentication, other 4xx, content filters: the item fails at once."""

    error_type = "PermanentError"


class InvalidAnswer(TransientModelError):
    """An answer that is not what was asked (a malformed body, not JSON, not valid under
    --schema): an attempt that failed, counted against the retries as transient errors are;
    never kept or reused. When the provider billed it (`usage`), it is charged and ends its
    claim: the item goes back to pending for a claim of its own (runtime/pipeline.py)."""

    error_type = "InvalidAnswer"


class TruncatedAnswer(PermanentModelError):
    """The answer stopped at the output limit: the item fails at once, since each request already
    carries the whole allowance and the same request stops at the same place, paid again. What
    the cut answer was billed (`usage`) is charged to the job."""

    error_type = "Truncated"


class SourceUnusable(HermesBulkError):
    """Something other than a regular file is now where the item's source was (DESIGN.md
    invariant 11): it is not read, and the item fails with this reason."""

    error_type = "SourceUnusable"
