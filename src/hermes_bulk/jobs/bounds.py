"""What one item may cost at most: the worst case a claim reserves (DESIGN.md invariant 6).

A cap (--max-tokens, --max-cost) is a bound only if every claim reserves what an honest
provider may bill for the request, not what it usually bills:

- Input: no tokenizer makes more tokens of a text than it has UTF-8 bytes (the byte-level BPE
  tokenizers of OpenAI's and Anthropic's models start from one token a byte and only merge), so
  the bytes of every text the request carries bound its text tokens. What a provider adds around
  them, which no byte of ours stands for, is counted by the constants below.
- Output: the request's max_tokens, which every request therefore carries (JobSpec.output_bound).

The constants are generous on purpose: each costs a claim a few tokens, while one too small
lets a job pass its cap.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING

from ..providers import answers
from . import prompt

if TYPE_CHECKING:
    from ..store.records import JobSpec, Usage

#: Tokens a provider adds to every request: OpenAI's cookbook counts 3 to prime the reply
#: ("How to count tokens with tiktoken"); Anthropic documents none. Five times that, rounded up.
PER_REQUEST_TOKENS = 16
#: Tokens a provider adds around each message (its role and delimiters): 3 by OpenAI's cookbook,
#: 4 for its older models. Twice that.
PER_MESSAGE_TOKENS = 8
#: A --schema request on Anthropic goes as a forced tool call: the tool-use system prompt that
#: Anthropic's "Tool use" docs list per model is at most 530 tokens (Claude 3 Opus, auto), and the
#: tool's name and description are ours (counted as bytes). Twice the largest listed, rounded up.
TOOL_USE_TOKENS = 1_100
#: A --schema request on OpenAI (response_format json_schema): the schema is sent as text (counted
#: as bytes) and framed by a few tokens OpenAI does not list; this bounds that framing.
RESPONSE_FORMAT_TOKENS = 64


def input_bound(spec: JobSpec, messages: list[dict[str, str]]) -> int:
    """The most input tokens a provider can count for the request of these messages."""
    total = PER_REQUEST_TOKENS + PER_MESSAGE_TOKENS * len(messages)
    total += sum(len(str(m["content"]).encode("utf-8")) for m in messages)
    if spec.schema:
        total += _schema_tokens(spec.schema, spec.protocol)
    return total


@functools.lru_cache(maxsize=64)
def _schema_tokens(schema: str, protocol: str) -> int:
    """A --schema's share of the bound: the bytes of the schema as it is sent (OpenAI's strict
    form can be longer than the user's), plus the protocol's framing of it."""
    if protocol == "anthropic":
        return len(schema.encode("utf-8")) + TOOL_USE_TOKENS
    sent = json.dumps(answers.response_format(json.loads(schema)), ensure_ascii=False)
    return len(sent.encode("utf-8")) + RESPONSE_FORMAT_TOKENS


def worst_case_tokens(spec: JobSpec, name: str, text: str, digest: str) -> int:
    """What a claim of this item reserves: its input bound plus the request's max_tokens.
    text, digest: what prompt.item_text makes of the item (what is sent)."""
    messages = prompt.build_messages(spec.instruction, name, text, digest, spec.system)
    return input_bound(spec, messages) + spec.output_bound


def beyond_bound(
    spec: JobSpec, name: str, content: str, content_hash: str, usage: Usage
) -> str | None:
    """Why the usage a provider reported for this item is more than its request could bill (the
    job pauses with it: a cap proven against an honest provider no longer holds), or None.
    A job made before every request carried max_tokens has no output bound to hold it to."""
    if not usage.reported:
        return None
    out = usage.tokens_out or 0
    if spec.max_output_tokens is not None and out > spec.max_output_tokens:
        return (
            f"the provider billed {out:,} output tokens for item {name}, above the request's "
            f"max_tokens of {spec.max_output_tokens:,}: the job's limits assume it does not"
        )
    if content is None:
        return None
    text, digest = prompt.item_text(spec, content, content_hash)
    bound = input_bound(
        spec, prompt.build_messages(spec.instruction, name, text, digest, spec.system)
    )
    got = usage.tokens_in or 0
    if got > bound:
        return (
            f"the provider billed {got:,} input tokens for item {name}, above the {bound:,} that "
            "its bytes allow: the job's limits assume it does not"
        )
    return None
