"""scripts/mutate.py mutates the Redis store's Lua itself (cosmic-ray reads only Python): each
mutant is one change to the code of a script, never to a comment or a string, and a script
read back after each mutant is the script as it was."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _mutate_module():
    spec = importlib.util.spec_from_file_location("mutate_script", ROOT / "scripts" / "mutate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mutate = _mutate_module()


def _applied(line: str, mutant) -> str:
    _number, column, before, after = mutant
    assert line[column : column + len(before)] == before
    return line[:column] + after + line[column + len(before) :]


def test_every_operator_of_the_code_is_changed_once_and_comments_and_strings_never():
    line = "if a <= b and not c or x == 'a < b -- no' then n = n + 1 end -- not this < one"
    found = mutate.lua_mutants(line)
    assert sorted(_applied(line, m) for m in found) == sorted(
        [
            "if a < b and not c or x == 'a < b -- no' then n = n + 1 end -- not this < one",
            "if a <= b or not c or x == 'a < b -- no' then n = n + 1 end -- not this < one",
            "if a <= b and c or x == 'a < b -- no' then n = n + 1 end -- not this < one",
            "if a <= b and not c and x == 'a < b -- no' then n = n + 1 end -- not this < one",
            "if a <= b and not c or x ~= 'a < b -- no' then n = n + 1 end -- not this < one",
            "if a <= b and not c or x == 'a < b -- no' then n = n - 1 end -- not this < one",
            "if a <= b and not c or x == 'a < b -- no' then n = n + 2 end -- not this < one",
            "if a <= b and not c or x == 'a < b -- no' then n = n + 0 end -- not this < one",
        ]
    )


def test_an_index_into_keys_or_argv_and_a_name_with_a_digit_are_left_alone():
    line = "local limit = tonumber(ARGV[4]) + KEYS[1] .. s3 .. math.min(x, 0) -- 7"
    changed = {(before, after) for _n, _c, before, after in mutate.lua_mutants(line)}
    assert changed == {(" + ", " - "), ("math.min", "math.max"), ("0", "1")}


def test_a_string_with_an_escaped_quote_ends_where_lua_ends_it():
    line = r"local s = 'it\'s < 2' if n > 2 then"
    assert [(b, a) for _n, _c, b, a in mutate.lua_mutants(line)] == [
        (">", ">="),
        ("2", "3"),
        ("2", "1"),
    ]


def test_no_script_has_a_long_string_or_comment_the_mutator_would_read_as_code():
    scripts = sorted((ROOT / "src/hermes_bulk").rglob("*.lua"))
    assert scripts
    for script in scripts:
        assert "[[" not in script.read_text() and "[=" not in script.read_text(), script


def test_the_store_scripts_have_mutants_and_each_names_its_place_exactly():
    script = ROOT / "src/hermes_bulk/store/redis/lua/claim_item.lua"
    lines = script.read_text().splitlines()
    found = mutate.lua_mutants(script.read_text())
    assert len(found) > 20
    for mutant in found:
        number = mutant[0]
        assert not lines[number - 1].lstrip().startswith("--")
        assert _applied(lines[number - 1], mutant) != lines[number - 1]
