"""Who may use the dashboard: the access token, and the rules each request is held to.

Every request needs the token, from one of three places: `?token=` in a page's URL (the URL
printed at start; the page then sets it as a cookie and drops it from the address bar), the
cookie, or an `Authorization: Bearer` header (scripts). An action (a POST: pause, resume,
retry) also needs proof that it comes from the dashboard's own page: an `Origin` header naming
this host (browsers send one with every POST), and `Sec-Fetch-Site: same-origin` where the
browser sends that header. A request without an Origin header is taken only with the Bearer header,
which no page of another site can add without a CORS preflight, and none is ever answered.
The cookie is HttpOnly and SameSite=Strict, so another site's page never carries it either.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from ...errors import UsageError

#: The shortest token accepted from HERMES_BULK_DASHBOARD_TOKEN (a short one can be guessed).
MIN_TOKEN_CHARS = 16
TOKEN_ENV = "HERMES_BULK_DASHBOARD_TOKEN"


def is_loopback(host: str) -> bool:
    """True for localhost and addresses of the loopback range (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def choose_token(configured: str | None, host: str) -> tuple[str, bool]:
    """(the token, whether it was made here). A new random one only on a loopback address:
    binding another address without HERMES_BULK_DASHBOARD_TOKEN is refused (UsageError)."""
    if configured is not None and configured.strip():
        token = configured.strip()
        if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
            raise UsageError(
                f"{TOKEN_ENV} must be at least {MIN_TOKEN_CHARS} characters without spaces; "
                "make one with: python3 -c 'import secrets; print(secrets.token_urlsafe(24))'"
            )
        return token, False
    if not is_loopback(host):
        raise UsageError(
            f"--host {host} is not a loopback address: set {TOKEN_ENV} (at least {MIN_TOKEN_CHARS} "
            "characters) to serve the dashboard beyond this machine."
        )
    return secrets.token_urlsafe(24), True


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    reason: str = ""
    #: the token came in the URL: set the cookie and send the browser to the URL without it
    from_query: bool = False


REFUSED = (
    "This dashboard needs its access token: open the URL it printed when it started "
    "(http://HOST:PORT/?token=…), or send the header Authorization: Bearer <token>."
)
CROSS_SITE = "Refused: an action must come from the dashboard's own page (same origin)."


class Access:
    """The token, and the check every request goes through (see the module docstring)."""

    def __init__(self, token: str, cookie_name: str) -> None:
        self.token, self.cookie_name = token, cookie_name

    def _matches(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def check(
        self,
        method: str,
        headers: Mapping[str, str],
        cookies: Mapping[str, str],
        query: Mapping[str, str],
    ) -> Verdict:
        auth = headers.get("authorization", "")
        by_header = auth[:7].lower() == "bearer " and self._matches(auth[7:].strip())
        by_cookie = self._matches(cookies.get(self.cookie_name))
        by_query = method == "GET" and self._matches(query.get("token"))
        if not (by_header or by_cookie or by_query):
            return Verdict(False, REFUSED)
        if method in ("GET", "HEAD"):
            return Verdict(True, from_query=by_query and not by_header)
        if not same_origin(headers, bearer=by_header):
            return Verdict(False, CROSS_SITE)
        return Verdict(True)


def same_origin(headers: Mapping[str, str], *, bearer: bool) -> bool:
    """The request comes from a page of this host, or from a client that is no browser page."""
    site = headers.get("sec-fetch-site")
    if site is not None and site != "same-origin":
        return False
    origin = headers.get("origin")
    if origin is None:
        return bearer
    # Host is what the browser addressed; a page elsewhere (another port, a name pointed at this
    # address) has another Origin. The scheme is not compared: behind a TLS proxy it differs.
    return origin != "null" and urlsplit(origin).netloc.lower() == headers.get("host", "").lower()
