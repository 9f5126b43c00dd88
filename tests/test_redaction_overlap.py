"""Masking by value when one secret contains another: the longer is masked whole.

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
