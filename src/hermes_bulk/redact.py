"""Secrets kept out of what is logged, stored and shown: by value, and by shape.

By value: the keys and passwords this process was configured with are registered here when
settings load and a backend opens (`register_secret`, `register_url`), and every occurrence is
masked, whatever they look like: a provider echoing an arbitrary key in an error body cannot
be recognised by its shape. By shape: the token formats providers use (`sk-`, `gsk_`, `AIza`,
`xai-`, `hf_`, GitHub and Slack tokens, Bearer/Basic credentials, long hex strings, values after
`key=`/`token=`/`password=`), for secrets this process was never told about.

URLs are shown (and stored, e.g. an item's endpoint) through `public_url`: the password (or a
lone userinfo token) and secret-looking query values become ***.
"""

from __future__ import annotations

import base64
import re
import threading
from urllib.parse import parse_qsl, quote, unquote, unquote_plus, urlsplit, urlunsplit

MASK = "***"

#: Query parameters whose values are credentials (compared case-insensitively).
SECRET_QUERY_NAMES = frozenset(
    {
        "api-key",
        "api_key",
        "apikey",
        "key",
        "token",
        "access_token",
        "sig",
        "signature",
        "password",
        "secret",
        "code",
        "auth",
        "x-api-key",
        "client_secret",
    }
)

#: Parts of a query parameter's name that make its value a credential too (`subscription-key`,
#: `x-goog-api-key`, `access-token`, `sv_sig`...): a key can hide under any name.
SECRET_QUERY_PARTS = ("key", "token", "secret", "sig", "pass", "auth", "credential")


def secret_query_name(name: str) -> bool:
    """Whether a query parameter of this name carries a credential."""
    name = name.lower()
    return name in SECRET_QUERY_NAMES or any(part in name for part in SECRET_QUERY_PARTS)


#: The shortest value masked by value: masking every "ab" in a log would hide everything and
#: protect nothing (such a secret is guessed faster than read).
MIN_SECRET_LEN = 4

_SHAPES = re.compile(
    r"(?i)(\b(?:sk|rk|pk|ghp|gho|ghu|ghs|ghr|github_pat|xox[abp]|key|token)[-_][A-Za-z0-9_\-]{6,}"
    r"|\b(?:gsk|xai|hf)[-_][A-Za-z0-9_\-]{20,}"  # Groq, xAI, Hugging Face: long, unlike model names
    r"|\bAIza[0-9A-Za-z_\-]{20,}"
    r"|\b(?:bearer|basic)\s+[A-Za-z0-9._~+/\-]{8,}=*"
    r"|(?<![0-9a-f])[0-9a-f]{32,}(?![0-9a-f])"
    r"|(?:api[_-]?key|access[_-]?token|password|passwd|secret|token)[\"']?\s*[:=]\s*[\"']?[^\s\"'&,;}]{4,}"
    r"|\b(?:key|sig|signature|code)=[A-Za-z0-9+/_.~%\-]{8,})"  # URL query values: long ones only
)

_lock = threading.Lock()
_values: frozenset[str] = frozenset()
_by_value: re.Pattern[str] | None = None


#: The shortest base64 run masked for a secret (6 bytes of it): shorter runs would match text.
MIN_BASE64_LEN = 8


def base64_forms(value: str) -> list[str]:
    """The runs of base64 text that encode this value wherever it sits in what is encoded
    (alone, `user:KEY` as Basic auth carries it, `KEY:`): for each of the three alignments,
    the characters that depend on the value's bytes alone; standard and URL-safe alphabets."""
    raw = value.encode("utf-8")
    forms = []
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw).decode("ascii")
        # The first group mixes in what comes before (offset > 0); the last, partial one,
        # what comes after: the full groups between are the value's own.
        core = encoded[4 if offset else 0 : (offset + len(raw)) // 3 * 4]
        if len(core) >= MIN_BASE64_LEN:
            forms += [core, core.replace("+", "-").replace("/", "_")]
    return list(dict.fromkeys(forms))


def register_secret(value: str | None) -> None:
    """Mask this value wherever text is logged from now on (in this process), and its base64
    encodings (base64_forms)."""
    global _values, _by_value
    value = (value or "").strip()
    if len(value) < MIN_SECRET_LEN or value in _values:
        return
    with _lock:
        values = _values | {value, *base64_forms(value)}
        # Longest first, so a key that contains another is masked whole.
        _by_value = re.compile(
            "|".join(re.escape(v) for v in sorted(values, key=len, reverse=True))
        )
        _values = values


def register_url(url: str | None) -> None:
    """Mask the credentials a URL carries: its password (or lone userinfo token), secret query
    values."""
    for value in url_secrets(url or ""):
        register_secret(value)


def url_secrets(url: str) -> list[str]:
    """The credential values in a URL, raw and percent-decoded."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found = []
    if parts.password:
        found.append(parts.password)
    elif parts.username and "@" in parts.netloc:  # https://TOKEN@host: the user name is the secret
        found.append(parts.username)
    found += [
        value
        for name, value in parse_qsl(parts.query, keep_blank_values=True)
        if secret_query_name(name)
    ]
    found += [quote(value, safe="") for value in found] + [
        unquote(value) for value in found
    ]  # either spelling
    return [value for value in dict.fromkeys(found) if value]


def public_url(url: str) -> str:
    """A URL (or a path) fit to log, print and store: the password and secret query values
    replaced by ***. One that cannot be parsed shows no more than its scheme (or, without one,
    is masked as text): where its password ends cannot be told."""
    try:
        parts = urlsplit(url)
        if "," not in parts.netloc:  # redis+sentinel://h1:p1,h2:p2 names several hosts
            _ = parts.port  # raises on a malformed port
    except ValueError:
        return url.split("://", 1)[0] + "://…" if "://" in url else redact(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user, has_password, _ = userinfo.partition(":")
        netloc = f"{user}:{MASK}@{host}" if has_password else f"{MASK}@{host}"
    query = (
        "&".join(_public_param(param) for param in parts.query.split("&")) if parts.query else ""
    )
    if (netloc, query) == (parts.netloc, parts.query):
        return url  # nothing to hide; urlunsplit would also drop the // of sqlite:///path
    shown = urlunsplit(parts._replace(netloc=netloc, query=query))
    if not netloc and url.startswith(f"{parts.scheme}://"):
        shown = f"{parts.scheme}://{shown[len(parts.scheme) + 1 :]}"
    return shown


def _public_param(param: str) -> str:
    name, eq, _ = param.partition("=")
    return f"{name}={MASK}" if eq and secret_query_name(unquote_plus(name)) else param


def redact(text: str) -> str:
    """Text with every registered secret and every secret-looking token masked."""
    if _by_value is not None:
        text = _by_value.sub(MASK, text)
    return _SHAPES.sub(_mask_shape, text)


def _mask_shape(match: re.Match[str]) -> str:
    return match.group(0)[:3] + MASK  # the first three say which kind of secret it was
