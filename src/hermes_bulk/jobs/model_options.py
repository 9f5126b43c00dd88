"""What a job sends with every request besides the item: `create --temperature X`,
`--max-output-tokens N`, `--system FILE` and `-o KEY=VALUE`, checked at create and recorded on
the job. Each is part of the answer key (jobs/prompt.py), so an answer asked with other options
is never reused.

`-o` takes the request body's own field names (`-o top_p=0.9`, `-o seed=7`,
`-o reasoning_effort=low`, `-o 'stop=["\\n\\n"]'`): a VALUE that reads as JSON (a number, true,
false, null, an array, an object, a "quoted string") is that value, anything else is the text
itself, as `llm -o` takes it. Fields hermes-bulk writes itself are refused with the flag that sets
them. A job on Hermes' model (`/bulk` without --batch) has only what Hermes' `ctx.llm` passes on:
the temperature and the output limit.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from ..errors import UsageError

#: Request fields hermes-bulk writes itself, each with what sets it instead.
OWN_FIELDS = {
    "model": "--model",
    "messages": "the instruction, --system and the item",
    "max_tokens": "--max-output-tokens",
    "max_completion_tokens": "--max-output-tokens",
    "response_format": "--schema",
    "stream": "answers are read whole",
    "stream_options": "answers are read whole",
    "n": "one answer per item",
    "tools": "answers are text, or --schema",
    "tool_choice": "answers are text, or --schema",
    "functions": "answers are text, or --schema",
    "function_call": "answers are text, or --schema",
}
#: The highest temperature a provider takes (OpenAI's; others stop at 1 and say so).
MAX_TEMPERATURE = 2.0
#: The longest -o VALUE: a stop list or a logit bias is short; a long text belongs in --system.
MAX_VALUE_CHARS = 4096
#: The options a job on Hermes' model can have: what ctx.llm.complete passes on.
HERMES_OPTIONS = frozenset({"temperature"})
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")


def _refuse_constant(name: str) -> Any:
    raise ValueError(name)


def option_value(key: str, text: str) -> Any:
    """-o's VALUE: the JSON it reads as, else the text itself. A number JSON cannot carry (NaN,
    Infinity, 1e999) is refused: no provider takes one."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError:
        return text
    except ValueError:
        value = math.inf
    except RecursionError:
        raise UsageError(f"-o {key}: the value is nested too deeply.") from None
    if not _finite(value):
        raise UsageError(f"-o {key}={text}: not a number a provider takes; give a finite one.")
    return value


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(map(_finite, value))
    if isinstance(value, dict):
        return all(map(_finite, value.values()))
    return True


def parse_option(text: str) -> tuple[str, Any]:
    """One `-o KEY=VALUE` as (field, value)."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UsageError(f"-o {text}: give FIELD=VALUE, e.g. -o top_p=0.9.")
    if not _FIELD.match(key):
        raise UsageError(
            f"-o {key}: not a request field name (letters, digits and _, at most 64, e.g. top_p)."
        )
    if key in OWN_FIELDS:
        raise UsageError(f"-o {key}: hermes-bulk sets this field itself ({OWN_FIELDS[key]}).")
    if len(value) > MAX_VALUE_CHARS:
        raise UsageError(
            f"-o {key}: the value is {len(value):,} characters, more than {MAX_VALUE_CHARS:,}; "
            "put long text in --system FILE."
        )
    return key, option_value(key, value)


def request_options(
    temperature: float | None, options: list[str] | None, *, client: str
) -> dict[str, Any] | None:
    """The fields a job adds to every request: the -o options and --temperature, checked; None
    when there are none. client: the job's model client ("hermes": ctx.llm's few)."""
    chosen: dict[str, Any] = {}
    for text in options or []:
        key, value = parse_option(text)
        if key in chosen and chosen[key] != value:
            raise UsageError(f"-o {key} is given twice with different values; give it once.")
        chosen[key] = value
    if temperature is not None:
        if "temperature" in chosen and chosen["temperature"] != temperature:
            raise UsageError("Give the temperature once: --temperature or -o temperature=.")
        chosen["temperature"] = temperature
    if "temperature" in chosen:
        chosen["temperature"] = checked_temperature(chosen["temperature"])
    if client == "hermes" and (beyond := sorted(set(chosen) - HERMES_OPTIONS)):
        raise UsageError(
            f"-o {beyond[0]}: a job on Hermes' model takes --temperature and "
            "--max-output-tokens only (what Hermes passes on); for other fields add --batch, "
            "or create the job with hermes-bulk against an endpoint."
        )
    return chosen or None


def checked_temperature(value: Any) -> float | int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 <= value <= MAX_TEMPERATURE
    ):
        raise UsageError(
            f"--temperature {value}: give a number from 0 to {MAX_TEMPERATURE:g} "
            "(0 the most predictable)."
        )
    return value


def describe(options: dict[str, Any] | None) -> str:
    """The options as `status` shows them: "temperature 0.2, top_p 0.9"."""
    return ", ".join(
        f"{key} {json.dumps(value, ensure_ascii=False)}" for key, value in (options or {}).items()
    )
