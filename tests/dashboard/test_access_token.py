"""The dashboard's token is compared whole: no prefix, no extension, no empty token, no case fold.

`Access.check` is the one gate every request passes (the HTTP tests drive it through a real
dashboard process; here every near miss of the token is tried against it directly, for each of
the three places a token can come from).
"""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx
import pytest

from hermes_bulk.dashboard.access import REFUSED, Access

TOKEN = "a-dashboard-token-for-tests-0123456789"
COOKIE = "hermes_bulk_dashboard_8000"

NEAR_MISSES = ["", " ", TOKEN[:1], TOKEN[:-1], TOKEN + "x", TOKEN.upper(), TOKEN[1:], TOKEN[:8] + " " + TOKEN[8:],
               TOKEN + "\x00"]


def _by(place: str, given: str) -> dict:
    headers, cookies, query = {}, {}, {}
    if place == "header":
        headers["authorization"] = f"Bearer {given}"
    elif place == "cookie":
        cookies[COOKIE] = given
    else:
        query["token"] = given
    return {"headers": headers, "cookies": cookies, "query": query}


@pytest.mark.parametrize("place", ["header", "cookie", "query"])
@pytest.mark.parametrize("given", NEAR_MISSES, ids=repr)
def test_a_near_miss_of_the_token_is_refused(place, given):
    verdict = Access(TOKEN, COOKIE).check("GET", **_by(place, given))
    assert not verdict.allowed and verdict.reason == REFUSED


@pytest.mark.parametrize("place", ["header", "cookie", "query"])
def test_the_token_itself_is_let_in(place):
    assert Access(TOKEN, COOKIE).check("GET", **_by(place, TOKEN)).allowed


@pytest.mark.parametrize("path", ["//evil.example/x", "///evil.example/x", "/\\evil.example/x",
                                  "//evil.example"])
def test_the_token_redirect_stays_on_this_dashboard(dashboard, path):
    """A token in the URL is swapped for a cookie by a redirect to the same path: a path that
    starts with two slashes (or a slash and a backslash) would be an address elsewhere."""
    d = dashboard(HERMES_BULK_DASHBOARD_TOKEN=TOKEN)
    with httpx.Client(timeout=10) as c:
        answer = c.get(f"{d.base}{path}?token={TOKEN}&page=2")
    location = answer.headers["location"]
    assert answer.status_code == 303 and location.startswith("/"), location
    assert not location.startswith(("//", "/\\")), location
    assert urlsplit(location).netloc == "" and location.endswith("?page=2"), location
