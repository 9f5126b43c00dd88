"""Price parsing and a request's cost at their edges (config/fields.parse_price, names_a_price,
jobs/prices.Price.cost_nusd): each bound at equality and one step over, each count of figures,
cached and written input clamped to what was sent."""

from __future__ import annotations

import pytest

from hermes_bulk.config.fields import MAX_PRICE_PER_MTOK, names_a_price, parse_price
from hermes_bulk.jobs.prices import Price


@pytest.mark.parametrize(
    ("text", "read"),
    [
        ("0,0", (0.0, 0.0, 0.0, None)),  # the lowest price: free
        ("10000,10000", (MAX_PRICE_PER_MTOK, MAX_PRICE_PER_MTOK, MAX_PRICE_PER_MTOK, None)),
        ("1,2,10000,10000", (1.0, 2.0, MAX_PRICE_PER_MTOK, MAX_PRICE_PER_MTOK)),
        ("1,2", (1.0, 2.0, 1.0, None)),  # cached input defaults to input
        ("1,2,0.5", (1.0, 2.0, 0.5, None)),
        ("1,2,0.5,1.25", (1.0, 2.0, 0.5, 1.25)),
        ("1.,.5", (1.0, 0.5, 1.0, None)),
    ],
)
def test_a_price_at_each_bound_and_of_each_length_is_read(text, read):
    assert parse_price(text) == read


@pytest.mark.parametrize(
    "text",
    [
        "10000.01,1",  # one cent over the largest, in each place
        "1,10000.01",
        "1,2,10000.01",
        "1,2,3,10000.01",
        "1",
        "1,2,3,4,5",
        "1,,2",
        ",1,2",
    ],
)
def test_a_price_one_step_past_a_bound_is_refused(text):
    with pytest.raises(ValueError, match="is not a price"):
        parse_price(text)


@pytest.mark.parametrize(
    ("value", "is_price"),
    [
        ("0.15,0.60", True),
        ("1", True),  # a price (refused as one: it has one figure), not a file named 1
        ("1.5", True),
        ("1.5.2", False),
        ("prices.json", False),
        ("~/prices.json", False),
        ("", False),
    ],
)
def test_a_setting_names_a_price_or_a_file(value, is_price):
    assert names_a_price(value) is is_price


PRICE = Price(3.0, 15.0, 0.3, "s", cache_write_input=3.75)


def test_cached_and_written_input_are_never_more_than_the_input_sent():
    exact = PRICE.cost_nusd(1000, 0, 400, 600)  # every input token read or written
    assert exact == round((400 * 0.3 + 600 * 3.75) * 1000)
    assert PRICE.cost_nusd(1000, 0, 400, 601) == exact, "one written token over: clamped"
    assert PRICE.cost_nusd(1000, 0, 1000, 1) == PRICE.cost_nusd(1000, 0, 1000, 0)
    assert PRICE.cost_nusd(1000, 0, 1001, 0) == PRICE.cost_nusd(1000, 0, 1000, 0)
    assert PRICE.cost_nusd(1000, 0, 0, 999) == round((1 * 3 + 999 * 3.75) * 1000)
