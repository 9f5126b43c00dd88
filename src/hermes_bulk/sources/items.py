"""What discovery finds: an item with what is needed to find it again, or an entry left out."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

WHOLE_FILE = -1  # offset of an item that is a whole file
DEFAULT_MAX_ITEM_BYTES = 4 * 1024 * 1024  # the max_item_bytes setting's default


@dataclass(frozen=True, slots=True)
class SourceItem:
    """One item found at create time, with what is needed to find it again."""

    name: str
    content: str
    origin: str  # path relative to a directory source; "" when the source is one file
    offset: int  # byte offset of the record in its file; WHOLE_FILE for whole files
    stat_sig: str  # "size:mtime_ns" of the file when the item was read


@dataclass(frozen=True, slots=True)
class Skipped:
    """An entry left out of a directory source, with the reason (recorded as a job event)."""

    name: str
    reason: str


def content_hash(text: str) -> str:
    """The content-address of an item: `b2:` + BLAKE2b-128 of its UTF-8 bytes, in hex."""
    return "b2:" + hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def stat_sig(st: os.stat_result) -> str:
    return f"{st.st_size}:{st.st_mtime_ns}"
