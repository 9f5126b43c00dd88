"""An item's state record on Redis (the states:<B> buckets, keys.py): the legend of its short
field names, and the record read back.

A state is JSON kept short (under 64 bytes, the listpack's value limit: keys.py), so its fields
have one- and two-letter names. This module is their one legend: the Python code names them by
these constants, and each Lua script that reads or writes a state (store/redis/lua/_job.lua:
item_state, save_state) points here. An absent state is a fresh pending item; counts of 0
(ZERO_OMITTED) are left out.
"""

from __future__ import annotations

import json

from ..protocol import CLAIMED, COMPLETED, FAILED, PENDING, WAITING, ItemRecord

# The fields of an item's state, one line each: what it holds, and who writes it.
STATUS = "s"  #: its status as a digit (STATUS_CODES), a word again once read (parse_state)
ATTEMPTS = "a"  #: failed attempts counted (record_attempt, not rate limited); 0 on a retry
WAITS = "w"  #: consecutive 429s (record_attempt, rate limited); 0 after any other outcome
RESERVED = "r"  #: tokens its claim reserved, while it runs (claim_item, open_batch)
RESERVED_COST = "rc"  #: nano-USD its claim reserved under --max-cost, as digits, while it runs
TOKENS_IN = "ti"  #: input tokens billed, across its attempts (complete_item, charge_unkept)
TOKENS_OUT = "to"  #: output tokens billed, across its attempts
TOKENS_CACHED = "tc"  #: input tokens read from the prompt cache by its kept answer
TOKENS_WRITTEN = "tw"  #: input tokens written to the prompt cache by its kept answer
COST = "c"  #: nano-USD billed across its attempts, as digits (exact past 2^53)
ERROR_TYPE = "et"  #: the error class of its failure (fail_item), cleared on a retry
HTTP_STATUS = "hs"  #: the HTTP status of its failure, or absent
ERROR_MESSAGE = "em"  #: our message for its failure (never the provider's text)
PROVIDER = "pv"  #: the provider that answered, a number META's "n:<id>" names (_job.lua intern)
MODEL = "md"  #: the model that answered, a number as PROVIDER
REUSED_JOB = "rj"  #: the job whose answer it reused at create (add_items)
REUSED_INDEX = "ri"  #: the index of that answer's item in REUSED_JOB
TOKENS_SAVED = "ts"  #: the tokens that reused answer cost when it was asked
DUP_OF = "d"  #: the index of the earlier item of the job it waits on (a duplicate: WAITING)

#: Every field above, for a check that the scripts use no other.
FIELDS = (
    STATUS,
    ATTEMPTS,
    WAITS,
    RESERVED,
    RESERVED_COST,
    TOKENS_IN,
    TOKENS_OUT,
    TOKENS_CACHED,
    TOKENS_WRITTEN,
    COST,
    ERROR_TYPE,
    HTTP_STATUS,
    ERROR_MESSAGE,
    PROVIDER,
    MODEL,
    REUSED_JOB,
    REUSED_INDEX,
    TOKENS_SAVED,
    DUP_OF,
)
#: The counts a state leaves out when they are 0 (_job.lua save_state; scripts.py passes it).
ZERO_OMITTED = (ATTEMPTS, WAITS, RESERVED, TOKENS_IN, TOKENS_OUT)
#: An item's status in its stored state: a digit, not the word (a state stays short).
STATUS_CODES = {PENDING: 0, CLAIMED: 1, COMPLETED: 2, FAILED: 3, WAITING: 4}
_STATUS_NAMES = {v: k for k, v in STATUS_CODES.items()}


def parse_state(raw: bytes | None, meta: dict[str, str]) -> dict:
    """An item's state (absent: a fresh pending item), its status a word again and provider
    and model names again: a state holds them as numbers that META's "n:<id>" fields name
    (_job.lua: intern)."""
    st = json.loads(raw) if raw else {}
    if isinstance(st.get(STATUS), int):
        st[STATUS] = _STATUS_NAMES[st[STATUS]]
    for k in (PROVIDER, MODEL):
        if isinstance(st.get(k), int):
            st[k] = meta.get(f"n:{st[k]}")
    return st


def item_record(index: int, name: str, st: dict, result: str | None) -> ItemRecord:
    """The ItemRecord of an item's parsed state (parse_state) and its result text."""
    return ItemRecord(
        index=index,
        name=name,
        status=st.get(STATUS, PENDING),
        result=result,
        error_type=st.get(ERROR_TYPE),
        http_status=st.get(HTTP_STATUS),
        error_message=st.get(ERROR_MESSAGE),
        tokens_in=st.get(TOKENS_IN, 0),
        tokens_out=st.get(TOKENS_OUT, 0),
        attempts=st.get(ATTEMPTS, 0),
        provider=st.get(PROVIDER),
        model=st.get(MODEL),
        reused_from=(st[REUSED_JOB], st[REUSED_INDEX]) if REUSED_JOB in st else None,
        cost_nusd=int(st.get(COST) or 0),
    )
