"""A job request: what a job is asked to be, as one validated object.

Each front end builds one (`hermes-bulk create`, `/bulk`, tests) and `Jobs.create` takes it whole,
through to the store's JobSpec. Its fields are named as the grammar's options
(frontends/parser.py: `--max-tokens` is max_tokens), so `JobRequest.from_options` picks them from
a parse; where a good field name differs from the option's, the option's name is the field's
alias. The checks here need the request alone; those that need the settings (max_concurrency, a
configured model) or the source (--template on a CSV) are made where the job is created.

Importing this module loads pydantic: `path`, `list` and `status` start without it, so it is
imported where a job is created.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..errors import InputError, UsageError
from . import model_options


class JobRequest(BaseModel):
    """What a job is asked to be. Limits and settings left None take the settings' values."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_by_name=True)

    instruction: str
    #: The directory or file the items come from (as the jobs API takes it: resolved by the place
    #: the command was typed in).
    over: str

    # Limits.
    concurrency: int | None = None
    retries: int | None = None
    max_tokens: int | None = None
    max_cost: int | None = None  #: --max-cost in nano-USD (the job needs a price)
    rpm: int | None = None
    tpm: int | None = None

    # Who answers. client "hermes": Hermes' ctx.llm; "http": an endpoint. bind_endpoint=False: any
    # worker's endpoint serves the job (a `/bulk … --batch` job, made where no endpoint of its own
    # is configured), one that speaks `protocol` (by default this process's endpoint's).
    model: str | None = None
    client: str = "http"
    provider: str | None = None
    protocol: str | None = None
    bind_endpoint: bool = True

    # What every request carries besides the item (jobs/model_options.py, jobs/templates.py).
    json_schema: str | None = Field(None, alias="schema")  #: the JSON schema's text
    temperature: float | None = None
    max_output_tokens: int | None = None  #: else the setting
    system: str | None = None  #: the system prompt's text
    options: list[str] | None = Field(None, alias="option")  #: `-o KEY=VALUE` texts
    template: str | None = None
    fields: str | None = None  #: --fields `a,b`

    fresh: bool = False  #: reuse no earlier answer

    # batch: the job runs through the provider's Batch API (runtime/batch_driver.py), the rest
    # left live after batch_deadline_s; its batches are polled every batch_poll_s.
    batch: bool = False
    batch_deadline_s: float | None = Field(None, alias="batch_deadline")
    batch_poll_s: float | None = Field(None, alias="poll")

    @classmethod
    def option_names(cls) -> frozenset[str]:
        """Its fields by the grammar's names (an alias where it has one)."""
        return frozenset(f.alias or name for name, f in cls.model_fields.items())

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> JobRequest:
        """The request from a parse's options (`vars(args)`, by the grammar's names), taking the
        ones it declares and leaving the rest (`--json`, `--dry-run`) to the front end."""
        names = cls.option_names()
        return cls.model_validate({k: v for k, v in options.items() if k in names})

    @model_validator(mode="after")
    def _check(self) -> JobRequest:
        if not self.instruction.strip():
            raise InputError("The instruction is empty; say what to do with each item.")
        self._check_batch_flags()
        self.request_options()
        if self.system is not None and not self.system.strip():
            raise UsageError("--system: the text is empty; write the system prompt in the file.")
        return self

    def _check_batch_flags(self) -> None:
        """The batch flags make sense together, or a UsageError says which does not."""
        if self.batch_deadline_s is not None and not self.batch:
            raise UsageError("--batch-deadline is for batch jobs; add --batch.")
        if self.batch_poll_s is not None and not self.batch:
            raise UsageError("--poll is for batch jobs; add --batch.")
        if self.batch and self.client != "http":
            raise UsageError(
                "A batch job needs an OpenAI-compatible endpoint with a Batch API (a hermes-bulk "
                "worker's)."
            )

    def request_options(self) -> dict[str, Any] | None:
        """The fields every request carries besides the item: -o and --temperature, checked."""
        return model_options.request_options(self.temperature, self.options, client=self.client)
