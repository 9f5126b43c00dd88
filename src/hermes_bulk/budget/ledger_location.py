"""The ledger for a location: the one map from a ledger location to a ledger class.

Apart from ledger.py so that the protocol and records the ledgers import do not import them back.
"""

from __future__ import annotations

from ..config.backend_url import SqliteUrl, parse_ledger_url
from .ledger import RequestLedger


def ledger_file_missing(location: str) -> bool:
    """True for a SQLite ledger whose file is not there yet: nothing has been counted in it."""
    parsed = parse_ledger_url(location)
    return isinstance(parsed, SqliteUrl) and not parsed.path.exists()


def open_ledger(location: str) -> RequestLedger:
    """A ledger for a location: a redis:// or rediss:// URL, or a SQLite file path (or sqlite:///path)."""
    parsed = parse_ledger_url(location)
    if isinstance(parsed, SqliteUrl):
        from .sqlite_ledger import SqliteLedger

        return SqliteLedger(parsed.path)
    from .redis_ledger import RedisLedger  # imported here: a SQLite ledger never loads redis-py

    return RedisLedger(parsed)
