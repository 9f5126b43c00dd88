"""The dashboard's token is compared whole: no prefix, no extension, no empty token, no case fold.

`Access.check` is the one gate every request passes (the HTTP tests drive it through a real
dashboard process; here every near miss of the token is tried against it directly, for each of
the three places a token can come from).
"""

from __future__ import annotations

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
