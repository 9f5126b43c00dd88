"""Who may use the dashboard: the token compared whole (no prefix, no extension, no empty token,
no case fold), the redirect that swaps a URL token for a cookie, and every other rule of access.py.

`Access.check` is the one gate every request passes (the HTTP tests drive it through a real
dashboard process; here every near miss of the token is tried against it directly, for each of
the three places a token can come from).
"""

from __future__ import annotations

import dataclasses
from urllib.parse import urlsplit

import httpx
import pytest

from hermes_bulk.errors import UsageError
from hermes_bulk.frontends.dashboard.access import (
    CROSS_SITE,
    MIN_TOKEN_CHARS,
    REFUSED,
    Access,
    Verdict,
    choose_token,
    is_loopback,
    same_origin,
)

TOKEN = "a-dashboard-token-for-tests-0123456789"
COOKIE = "hermes_bulk_dashboard_8000"

NEAR_MISSES = [
    "",
    " ",
    TOKEN[:1],
    TOKEN[:-1],
    TOKEN + "x",
    TOKEN.upper(),
    TOKEN[1:],
    TOKEN[:8] + " " + TOKEN[8:],
    TOKEN + "\x00",
]


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


@pytest.mark.parametrize(
    "path", ["//evil.example/x", "///evil.example/x", "/\\evil.example/x", "//evil.example"]
)
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


# Every rule of access.py, one by one (the HTTP tests drive them through a real dashboard) ----


@pytest.mark.parametrize(
    "host, loopback",
    [
        ("localhost", True),
        ("LOCALHOST", True),
        ("127.0.0.1", True),
        ("127.9.8.7", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("10.0.0.1", False),
        ("example.com", False),
        ("localhost.example.com", False),
        ("", False),
    ],
)
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_choose_token_makes_a_random_one_only_on_loopback():
    token, made = choose_token(None, "127.0.0.1")
    assert (
        made is True
        and len(token) >= MIN_TOKEN_CHARS
        and choose_token(None, "127.0.0.1")[0] != token
    )
    assert choose_token("   ", "localhost")[1] is True, "a blank setting is no setting"
    with pytest.raises(UsageError, match="not a loopback address"):
        choose_token(None, "0.0.0.0")
    with pytest.raises(UsageError, match="not a loopback address"):
        choose_token("  ", "10.0.0.1")


def test_choose_token_takes_a_configured_one_of_the_minimum_length_without_spaces():
    exact = "t" * MIN_TOKEN_CHARS
    assert choose_token(exact, "0.0.0.0") == (exact, False)
    assert choose_token(f"  {exact}\n", "127.0.0.1") == (exact, False)
    for bad in ("t" * (MIN_TOKEN_CHARS - 1), "t" * 8 + " " + "t" * 8, "t" * 8 + "\t" + "t" * 8):
        with pytest.raises(UsageError, match=f"at least {MIN_TOKEN_CHARS} characters"):
            choose_token(bad, "127.0.0.1")


def test_a_token_in_the_query_is_only_for_get_and_becomes_a_cookie():
    access = Access(TOKEN, COOKIE)
    by_query = access.check("GET", {}, {}, {"token": TOKEN})
    assert by_query.allowed and by_query.from_query
    assert not access.check(
        "GET", {"authorization": f"Bearer {TOKEN}"}, {}, {"token": TOKEN}
    ).from_query
    assert not access.check("GET", {}, {COOKIE: TOKEN}, {}).from_query
    assert not access.check("POST", {"host": "h"}, {}, {"token": TOKEN}).allowed, (
        "an action never by URL"
    )
    assert not access.check("GET", {"authorization": f"Basic {TOKEN}"}, {}, {}).allowed


HOST = "127.0.0.1:8000"


@pytest.mark.parametrize(
    "headers, bearer, same",
    [
        ({"host": HOST, "origin": f"http://{HOST}"}, False, True),
        ({"host": HOST, "origin": f"https://{HOST}"}, False, True),  # behind a TLS proxy
        ({"host": HOST, "origin": "http://127.0.0.1:8001"}, False, False),
        ({"host": HOST, "origin": "http://evil.example"}, True, False),
        ({"host": HOST, "origin": "null"}, False, False),
        ({"host": HOST, "origin": "null"}, True, False),
        (
            {"host": HOST},
            False,
            False,
        ),  # no Origin: a browser form would have one; only a bearer client
        ({"host": HOST}, True, True),
        ({"host": HOST, "origin": f"http://{HOST}", "sec-fetch-site": "same-origin"}, False, True),
        ({"host": HOST, "origin": f"http://{HOST}", "sec-fetch-site": "cross-site"}, False, False),
        ({"host": HOST, "sec-fetch-site": "same-site"}, True, False),
        ({"host": HOST.upper(), "origin": f"http://{HOST}"}, False, True),
    ],
)
def test_same_origin(headers, bearer, same):
    assert same_origin(headers, bearer=bearer) is same


def test_an_action_needs_the_token_and_the_same_origin():
    access = Access(TOKEN, COOKIE)
    own = {"host": HOST, "origin": f"http://{HOST}"}
    assert access.check("POST", own, {COOKIE: TOKEN}, {}) == Verdict(True)
    assert access.check(
        "POST", {**own, "origin": "http://evil.example"}, {COOKIE: TOKEN}, {}
    ) == Verdict(False, CROSS_SITE)
    assert access.check(
        "POST", {"host": HOST, "authorization": f"Bearer {TOKEN}"}, {}, {}
    ) == Verdict(True)
    assert access.check("POST", {"host": HOST}, {COOKIE: TOKEN}, {}) == Verdict(False, CROSS_SITE)
    assert access.check("HEAD", {}, {COOKIE: TOKEN}, {}).allowed


def test_the_token_rules_are_the_documented_ones():
    """docs/configuration.md: a configured token has at least 16 characters; a made one is 24
    random bytes."""
    assert choose_token("t" * 16, "0.0.0.0") == ("t" * 16, False)
    with pytest.raises(UsageError):
        choose_token("t" * 15, "127.0.0.1")
    assert len(choose_token(None, "127.0.0.1")[0]) == 32  # token_urlsafe(24): 24 bytes, 192 bits


@pytest.mark.parametrize("method", ["POST", "DELETE", "PUT", "PATCH"])
def test_a_token_in_the_url_never_allows_an_action_even_from_the_page_itself(method):
    own = {"host": HOST, "origin": f"http://{HOST}"}
    assert Access(TOKEN, COOKIE).check(method, own, {}, {"token": TOKEN}) == Verdict(False, REFUSED)


@pytest.mark.parametrize("scheme", ["Aearer", "Zearer", "Bearerx", "Token "])
def test_only_the_bearer_scheme_carries_the_token(scheme):
    assert (
        not Access(TOKEN, COOKIE)
        .check("GET", {"authorization": f"{scheme} {TOKEN}"}, {}, {})
        .allowed
    )


@pytest.mark.parametrize(
    "origin",
    [
        "http://127.0.0.1:800",
        "http://127.0.0.1:80000",
        "http://127.0.0.1",
        "http://127.0.0.1:8000.evil.example",
    ],
)
def test_an_origin_that_only_begins_or_ends_like_this_host_is_another_site(origin):
    assert same_origin({"host": HOST, "origin": origin}, bearer=True) is False


def test_the_scheme_of_the_origin_is_not_compared():
    """Behind a TLS proxy (or in an embedding app) the page's scheme differs; the host decides."""
    assert same_origin({"host": HOST, "origin": f"vscode-webview://{HOST}"}, bearer=False) is True


def test_a_verdict_is_fixed_once_made_and_an_action_never_redirects():
    access = Access(TOKEN, COOKIE)
    verdict = access.check("POST", {"host": HOST, "origin": f"http://{HOST}"}, {COOKIE: TOKEN}, {})
    assert verdict.allowed and verdict.from_query is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        verdict.allowed = False  # type: ignore[misc]
