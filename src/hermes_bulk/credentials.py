"""Every credential an endpoint sends, and its fingerprint: what binds a job to an account.

A request carries credentials in three places: the key header, the base URL's userinfo
(`https://user:pass@host`) and its query (`…/v1?api-key=A`, as Azure-style gateways take it;
any parameter may be one, whatever its name). `credentials` joins all three into one string, and
`fingerprint` hashes it with scrypt, salted with a value stored once per store: reading the store
gives an attacker the salt, but each guessed key then costs one scrypt (tens of milliseconds and
32 MiB), not one HMAC. The parameters travel with the salt (`new_salt_record`), so every process
sharing a store computes the same fingerprint; each process computes it once per (credential,
salt) and keeps it.

Jobs recorded before this carry `legacy_fingerprint` (an HMAC keyed by the header key alone):
see fleet/endpoints.legacy_route for which of them a worker still serves.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import threading
import time
from urllib.parse import parse_qsl, urlsplit

log = logging.getLogger(__name__)

#: scrypt's cost for a new store: N = 2**15, r = 8, p = 1 (32 MiB; docs/decisions.md).
LOG2_N, BLOCK, PARALLEL = 15, 8, 1
#: log2 N for stores made from now on in this environment (the test suite lowers it; the cost
#: of a store already made is the one recorded with its salt).
COST_ENV = "HERMES_BULK_FINGERPRINT_COST"
#: A fingerprint made by `fingerprint` (a legacy one is 16 hex digits, without it).
PREFIX = "s1:"
_FIXED_SALT = b"hermes-bulk fixed salt v1".hex()

_LEGACY_LABEL = b"hermes-bulk endpoint key fingerprint v1"
_cache: dict[tuple[str, str], str] = {}
_cache_lock = threading.Lock()


def credentials(base_url: str, api_key: str | None) -> str:
    """Every credential requests to this endpoint carry, as one canonical string ("" when there
    is none): the key header, the URL's userinfo, and every query parameter."""
    try:
        parts = urlsplit(base_url)
    except ValueError:
        return json.dumps([api_key or "", base_url, []])
    userinfo = parts.netloc.rpartition("@")[0]
    query = sorted(parse_qsl(parts.query, keep_blank_values=True))
    if not (api_key or userinfo or query):
        return ""
    return json.dumps([api_key or "", userinfo, query])


def new_salt_record() -> str:
    """A store's fingerprint salt with the scrypt parameters it is used with."""
    return f"scrypt${_log2_n()}${BLOCK}${PARALLEL}${secrets.token_hex(16)}"


def fixed_salt_record() -> str:
    """The salt of what has no store to take one from (a client made outside a worker, a dry
    run before the store has one): fixed, so as slow to guess against, only not per store.
    Never stored by a worker or `create`, so its cost may follow the environment."""
    return f"scrypt${_log2_n()}${BLOCK}${PARALLEL}${_FIXED_SALT}"


def _log2_n() -> int:
    log2_n = int(os.environ.get(COST_ENV) or LOG2_N)
    if not 1 <= log2_n <= 20:
        raise ValueError(f"{COST_ENV} must be from 1 to 20 (log2 of scrypt's N)")
    return log2_n


def fingerprint(material: str, salt_record: str) -> str:
    """A slow salted hash of `credentials` ("" for none): equal credentials, equal
    fingerprints within one store. Computed once per process per (credentials, salt)."""
    if not material:
        return ""
    key = (material, salt_record)
    with _cache_lock:  # held while computing: a second thread waits rather than pays twice
        found = _cache.get(key)
        if found is None:
            found = _cache[key] = _scrypt(material, salt_record)
        return found


def _scrypt(material: str, salt_record: str) -> str:
    name, log2_n, block, parallel, salt = salt_record.split("$")
    if name != "scrypt":
        raise ValueError(f"unknown fingerprint function {name!r} in the store")
    n, r, p = 1 << int(log2_n), int(block), int(parallel)
    started = time.perf_counter()
    digest = hashlib.scrypt(
        material.encode("utf-8"),
        salt=bytes.fromhex(salt),
        n=n,
        r=r,
        p=p,
        maxmem=256 * r * n,  # twice the 128*r*N it needs: OpenSSL's own margin
        dklen=8,
    )
    log.debug(
        "credential fingerprint: scrypt N=2^%s r=%s p=%s took %.3f s",
        log2_n,
        r,
        p,
        time.perf_counter() - started,
    )
    return PREFIX + digest.hex()


def legacy_fingerprint(api_key: str | None) -> str:
    """The fingerprint jobs recorded before `fingerprint` (the header key only; "" for none)."""
    if not api_key:
        return ""
    return hmac.new(api_key.encode("utf-8"), _LEGACY_LABEL, hashlib.sha256).hexdigest()[:16]
