"""The fields of an item's state on Redis have one legend (store/redis/item_state.py): the Lua
scripts read and write no field it does not name."""

from __future__ import annotations

import re
from pathlib import Path

from hermes_bulk.store.redis import item_state

LUA = Path(item_state.__file__).parent / "lua"
#: st.x / dst.x / stored.x, and the fields of a state built whole (save_state(idx, {s = ...})).
FIELD = re.compile(r"\b(?:st|dst|stored)\.([a-z]{1,2})\b")
BUILT = re.compile(r"save_state\([^,]+, \{([^}]*)\}\)")


def fields_used(text: str) -> set[str]:
    used = set(FIELD.findall(text))
    for body in BUILT.findall(text):
        used |= set(re.findall(r"\b([a-z]{1,2}) =", body))
    return used


def test_every_state_field_the_scripts_use_is_in_the_legend():
    used = set().union(*(fields_used(p.read_text()) for p in LUA.glob("*.lua")))
    assert used - set(item_state.FIELDS) == set()
    assert {"s", "a", "w", "rj", "d"} <= used, "the patterns still find the fields"


def test_a_field_outside_the_legend_is_caught():
    planted = "st.s, st.zz = S_PENDING, 1\nsave_state(idx, {s = S_WAITING, qq = 2})\n"
    assert fields_used(planted) - set(item_state.FIELDS) == {"zz", "qq"}


def test_the_legend_names_each_field_once():
    assert len(set(item_state.FIELDS)) == len(item_state.FIELDS)
