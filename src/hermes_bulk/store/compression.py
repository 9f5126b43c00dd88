"""How the stores keep item contents and results: zstandard frames, or the text itself.

One format for both backends (docs/decisions.md, "The store at scale"). A stored value is either

- a zstandard frame of the UTF-8 text: it starts with the frame magic 28 B5 2F FD, which no
  UTF-8 text starts with (0xB5 is a continuation byte, never the second byte after "("), so
  the magic is the format tag; or
- the text as it was stored before this format existed (SQLite TEXT, Redis UTF-8 bytes), and
  what is still stored so for texts too short to gain (a frame costs about 10 bytes).

So every value written before compression existed reads back unchanged: no migration rewrites
a million rows. The scripts never look inside a value (Lua stores and returns bytes).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # loaded with the first value packed or unpacked: `list` and `status` never are
    import zstandard

MAGIC = b"\x28\xb5\x2f\xfd"
#: Texts shorter than this are stored as they are: a frame would not be smaller.
MIN_PACKED = 64
LEVEL = 3

_local = threading.local()  # zstandard's (de)compressor objects are not thread-safe


def _compressor() -> zstandard.ZstdCompressor:
    c = getattr(_local, "c", None)
    if c is None:
        # No checksum (the backends keep what they are given) and no dictionary id: 6 bytes less a
        # value.
        import zstandard

        c = _local.c = zstandard.ZstdCompressor(
            level=LEVEL, write_checksum=False, write_dict_id=False
        )
    return c


def _decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "d", None)
    if d is None:
        import zstandard

        d = _local.d = zstandard.ZstdDecompressor()
    return d


def pack(text: str) -> bytes | str:
    """What a store writes for text: a frame when it is smaller, else the text itself."""
    if len(text) < MIN_PACKED:
        return text
    raw = text.encode("utf-8")
    packed = _compressor().compress(raw)
    return packed if len(packed) < len(raw) else text


def unpack(value: bytes | str | None) -> str | None:
    """The text of a stored value (either form; None stays None)."""
    if value is None or isinstance(value, str):
        return value
    if value[:4] == MAGIC:
        return _decompressor().decompress(value).decode("utf-8")
    return value.decode("utf-8")
