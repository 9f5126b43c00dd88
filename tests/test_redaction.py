"""Secrets kept out of what is shown: masking by value (a secret containing another is masked
whole), by shape, and in URLs.

Values here have no secret *shape* (no `sk-`, no long hex), so only masking by value can hide
them: a regex alternation tries its branches in order, and a shorter value listed first would
mask its part of a longer one and leave the rest of the longer one in the text.
"""

from __future__ import annotations

import pytest

from hermes_bulk import redact

SHORT = "plainpass.71"
LONG = "plainpass.71!tail.of.the.longer.secret"


@pytest.mark.parametrize("order", [(SHORT, LONG), (LONG, SHORT)])
def test_a_secret_that_contains_another_is_masked_whole_in_either_registration_order(order):
    for value in order:
        redact.register_secret(value)
    shown = redact.redact(f"refused key {LONG} and key {SHORT}.")
    assert shown == f"refused key {redact.MASK} and key {redact.MASK}."
    assert "tail" not in shown and "plainpass" not in shown


def test_a_secret_inside_a_word_is_still_masked():
    redact.register_secret("inner-9f3a")
    assert redact.redact("xxinner-9f3ayy") == f"xx{redact.MASK}yy"


# Each rule of redact.py on its own (the end-to-end leak tests are in tests/test_secrets.py) ----


def test_a_secret_as_short_as_the_minimum_is_masked_and_a_shorter_one_is_not():
    redact.register_secret("k9#x")
    redact.register_secret("q7%")  # too short to mask without masking ordinary words
    assert redact.redact("a k9#x b q7% c") == f"a {redact.MASK} b q7% c"


def test_registering_a_url_masks_its_password_wherever_it_is_written_later():
    redact.register_url("https://user:pw-5533-zz@host.example/v1")
    assert redact.redact("said pw-5533-zz once") == f"said {redact.MASK} once"


def test_a_url_that_cannot_be_parsed_registers_nothing_and_does_not_raise():
    assert redact.url_secrets("http://[::1") == []


@pytest.mark.parametrize(
    "url, shown",
    [
        (
            "redis://:pw@h:63x79/0",
            "redis://…",
        ),  # a port that is no number: where the password ends is unknown
        (
            "redis://:!early-sorting-pw@cache:6379/0",
            "redis://:***@cache:6379/0",
        ),  # '!' sorts before '*'
        (
            "https://u:p@ss@host.example/v1",
            "https://u:***@host.example/v1",
        ),  # an @ inside the password
        ("redis:///0?password=hunter22", "redis:///0?password=***"),  # no host: the // is kept
        (
            "https://host.example/v1?",
            "https://host.example/v1?",
        ),  # nothing to hide: the URL as given
        ("sqlite:////srv/bulk.db", "sqlite:////srv/bulk.db"),
    ],
)
def test_public_url_in_the_corners(url, shown):
    assert redact.public_url(url) == shown


def test_a_secret_found_by_its_shape_keeps_its_first_three_characters():
    assert redact.redact("key sk-abcdefgh123456 refused") == f"key sk-{redact.MASK} refused"


@pytest.mark.parametrize("user", ["", "u", "us", "user", "apikey"])
@pytest.mark.parametrize("after", ["", ":"])
def test_a_secret_in_base64_is_masked_whatever_comes_before_or_after_it(user, after):
    """Basic auth carries base64("user:KEY") (or "KEY:"): the key's bytes fall at any of three
    alignments; each is masked, leaving at most a group of four characters at either end
    beside the user name's own."""
    import base64

    redact.register_secret(LONG)
    raw = f"{user}:{LONG}{after}" if user else LONG + after
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        text = encode(raw.encode()).decode()
        shown = redact.redact(f"Authorization failed for {text}.")
        assert text not in shown and "***" in shown, shown
        left = shown.removeprefix("Authorization failed for ").removesuffix(".")
        users_own = (len(user) + 1) // 3 * 4 if user else 0  # groups of the user name alone
        assert len(left.replace("***", "").rstrip("=")) <= users_own + 8, shown
