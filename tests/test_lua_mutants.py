"""scripts/mutate.py mutates the Redis store's Lua itself (cosmic-ray reads only Python): each
mutant is one change to the code of a script, never to a comment or a string, and a script
read back after each mutant is the script as it was."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

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


def test_only_keeps_the_named_functions_of_a_script_and_whole_scripts_by_file_name():
    text = (ROOT / "src/hermes_bulk/store/redis/lua/_job.lua").read_text()
    lines = text.splitlines()
    ranges = mutate.lua_ranges(text, ["reserved_cost", "usd_text", "no_such_function"])
    assert set(ranges) == {"reserved_cost", "usd_text"}
    for first, last in ranges.values():
        assert lines[first - 1].startswith("local function ") and lines[last - 1] == "end"
        assert not any(line == "end" for line in lines[first : last - 1]), "the first end"
    target = {
        "module": [
            "src/hermes_bulk/store/redis/lua/_job.lua",
            "src/hermes_bulk/store/redis/lua/set_sample.lua",
        ],
        "only": ["reserved_cost", "set_sample.lua"],
    }
    kept, outside = mutate.lua_in_only(target)
    (first, last) = mutate.lua_ranges(text, ["reserved_cost"])["reserved_cost"]
    sample = ROOT / "src/hermes_bulk/store/redis/lua/set_sample.lua"
    assert {m for m in kept if m[0].endswith("set_sample.lua")} == {
        ("src/hermes_bulk/store/redis/lua/set_sample.lua", *m)
        for m in mutate.lua_mutants(sample.read_text())
    }
    in_job = [m for m in kept if m[0].endswith("_job.lua")]
    assert in_job and all(first <= m[1] <= last for m in in_job)
    assert outside == len(mutate.lua_mutants(text)) - len(in_job)
    target["only"] = ["reserved_cost", "not_a_function"]
    with pytest.raises(SystemExit, match="not_a_function"):
        mutate.lua_in_only(target)


def test_every_target_names_modules_tests_and_definitions_that_exist():
    """A target whose module moved, whose test file was renamed or whose `only` names a function
    that is gone fails here, not an hour into a mutation run."""
    for name, target in mutate.load_targets().items():
        modules = mutate.modules_of(target)
        for path in [*modules, *target["tests"]]:
            assert (ROOT / path).is_file(), (name, path)
        if all(m.endswith(".lua") for m in modules):
            mutate.lua_in_only(target)  # raises on a name no script defines
            continue
        names = set(target.get("only") or [])
        found = set()
        for module in modules:
            found |= set(mutate.line_ranges((ROOT / module).read_text(), list(names)))
        assert names <= found, (name, sorted(names - found))
