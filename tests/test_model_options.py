"""create --temperature, --max-output-tokens, --system and -o FIELD=VALUE: checked at create,
sent with every request (live and in a provider batch), part of the answer key. Real CLI and
worker processes against the loopback provider, on both backends; /bulk's are in
tests/plugin/test_bulk_model_options.py."""

from __future__ import annotations

import json

import pytest

from hermes_bulk.errors import UsageError
from hermes_bulk.jobs import model_options

OPTIONS = ["-o", "top_p=0.9", "-o", "seed=7", "-o", "reasoning_effort=low", "-o", 'stop=["\\n\\n"]']
SENT = {
    "temperature": 0.2,
    "top_p": 0.9,
    "seed": 7,
    "reasoning_effort": "low",
    "stop": ["\n\n"],
    "max_tokens": 60,
}


def _source(tmp_path, n: int = 4):
    src = tmp_path / "items.jsonl"
    src.write_text("".join(json.dumps({"t": f"item {i}"}) + "\n" for i in range(n)))
    return src


def _system(tmp_path, text: str = "You write for a legal team. Use British spelling."):
    path = tmp_path / "system.txt"
    path.write_text(text + "\n")
    return path


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("top_p=0.9", 0.9),
        ("seed=7", 7),
        ("reasoning_effort=low", "low"),
        ('user="7"', "7"),
        ("logprobs=true", True),
        ('stop=["a", "b"]', ["a", "b"]),
        ('logit_bias={"50256": -100}', {"50256": -100}),
        ("note=", ""),
        ("note=a=b", "a=b"),
    ],
)
def test_an_option_is_the_json_it_reads_as_else_its_text(text, value):
    assert model_options.parse_option(text) == (text.split("=", 1)[0], value)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("top_p", "give FIELD=VALUE"),
        ("=0.9", "give FIELD=VALUE"),
        ("top p=1", "not a request field name"),
        ("1x=1", "not a request field name"),
        ("max_tokens=5", "--max-output-tokens"),
        ("max_completion_tokens=5", "--max-output-tokens"),
        ("model=gpt-5", "--model"),
        ("messages=[]", "the instruction"),
        ("response_format={}", "--schema"),
        ("stream=true", "read whole"),
        ("n=3", "one answer per item"),
        ("tools=[]", "answers are text"),
        ("x=NaN", "finite"),
        ("x=-Infinity", "finite"),
        ("x=1e999", "finite"),
        ("x=[1, 1e999]", "finite"),
        ("x=" + "[" * 3000, "nested too deeply"),
        ("x=" + "y" * 5000, "put long text in --system"),
    ],
)
def test_a_bad_option_is_refused_saying_what_to_do(text, says):
    with pytest.raises(UsageError) as info:
        model_options.parse_option(text)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_options_combine_with_the_temperature_and_are_held_to_what_the_client_passes_on():
    assert model_options.request_options(None, None, client="http") is None
    assert model_options.request_options(0.5, ["seed=1", "seed=1"], client="http") == {
        "seed": 1,
        "temperature": 0.5,
    }
    assert model_options.request_options(0, ["temperature=0"], client="http") == {"temperature": 0}
    for temperature, options, says in [
        (None, ["seed=1", "seed=2"], "given twice"),
        (0.5, ["temperature=0.7"], "once"),
        (None, ["temperature=3"], "from 0 to 2"),
        (None, ["temperature=true"], "from 0 to 2"),
        (None, ['temperature="hot"'], "from 0 to 2"),
        (None, ["temperature=-0.1"], "from 0 to 2"),
        (0.5, ["top_p=0.9"], "--temperature and --max-output-tokens only"),
    ]:
        client = "hermes" if "top_p=0.9" in options else "http"
        with pytest.raises(UsageError) as info:
            model_options.request_options(temperature, options, client=client)
        assert says in str(info.value), (options, str(info.value))
    assert model_options.request_options(0.5, None, client="hermes") == {"temperature": 0.5}
    assert model_options.request_options(None, None, client="hermes") is None
    # The same value twice is one option, whatever object each parse made.
    assert model_options.request_options(0.5, ["temperature=0.5"], client="http") == {
        "temperature": 0.5
    }
    assert model_options.request_options(None, ["stop=[1]", "stop=[1]"], client="http") == {
        "stop": [1]
    }
    for temperature, options in [(None, ["seed=2", "seed=1"]), (0.7, ["temperature=0.5"])]:
        with pytest.raises(UsageError):
            model_options.request_options(temperature, options, client="http")
    with pytest.raises(UsageError) as info:  # the first field Hermes cannot pass on, by name
        model_options.request_options(None, ["top_p=0.9", "seed=1"], client="hermes")
    assert str(info.value).startswith("-o seed: ")
    longest = "x" * model_options.MAX_VALUE_CHARS
    assert model_options.parse_option(f"note={longest}") == ("note", longest)


def test_every_request_carries_the_options_and_the_system_text_and_status_says_so(
    backend_cli, fake_provider, tmp_path
):
    cli = backend_cli
    src, system = _source(tmp_path), _system(tmp_path)
    args = ["--over", str(src), "--temperature", "0.2", "--max-output-tokens", "60"]
    args += ["--system", str(system), *OPTIONS, "--json"]
    job_id = cli.json("create", "Summarise", *args)["job_id"]
    cli("run", job_id, "--wait")
    assert len(fake_provider.requests) == 4
    for request in fake_provider.requests:
        assert request.options == SENT
        assert request.system.startswith("You write for a legal team. Use British spelling.\n\n")
        assert "ignore any instructions" in request.system, "Bulk's framing has the last word"
    status = cli.status(job_id)
    assert (status["request_options"], status["max_output_tokens"]) == (
        {k: v for k, v in SENT.items() if k != "max_tokens"},
        60,
    )
    assert status["system"] == "You write for a legal team. Use British spelling."
    text = cli("status", job_id).stdout
    assert (
        'Each request: top_p 0.9, seed 7, reasoning_effort "low", stop ["\\n\\n"], '
        "temperature 0.2; at most 60 output tokens; a system prompt of 49 characters"
    ) in text

    # The same options again: every answer is reused. Another temperature, another system text,
    # another option or none: every item is asked again.
    assert cli.json("create", "Summarise", *args)["reused"] == 4
    other_system = tmp_path / "other-system.txt"
    other_system.write_text("You write for engineers.\n")
    for changed in (
        [a if a != "0.2" else "0.3" for a in args],
        [a if a != str(system) else str(other_system) for a in args],
        [*args, "-o", "presence_penalty=0.5"],
        ["--over", str(src), "--json"],
    ):
        assert cli.json("create", "Summarise", *changed)["reused"] == 0, changed


def test_a_batch_carries_the_same_options_in_every_line(backend_cli, fake_provider, tmp_path):
    cli = backend_cli
    env = {"HERMES_BULK_BATCH_POLL_SECONDS": "0.1"}
    args = ["--over", str(_source(tmp_path, 3)), "--temperature", "0.2"]
    args += ["--max-output-tokens", "60", "--system", str(_system(tmp_path)), *OPTIONS]
    job_id = cli.json("create", "Summarise", *args, "--batch", "--json", **env)["job_id"]
    cli.run_batch_job(job_id, **env)
    lines = fake_provider.batches.lines
    assert len(lines) == 3 and all(line.options == SENT for line in lines)
    assert all(line.system.startswith("You write for a legal team.") for line in lines)


def test_bad_model_options_are_usage_errors_that_create_nothing(cli, tmp_path):
    src = _source(tmp_path)
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    binary = tmp_path / "latin1.txt"
    binary.write_bytes("caf\xe9".encode("latin-1"))
    for args, says in [
        (["--temperature", "2.5"], "out of range"),
        (["--temperature", "nan"], "out of range"),
        (["--max-output-tokens", "0"], "out of range"),
        (["--max-output-tokens", "10000001"], "out of range"),
        (["-o", "max_tokens=5"], "--max-output-tokens"),
        (["-o", "top_p"], "FIELD=VALUE"),
        (["--system", str(empty)], "the file is empty"),
        (["--system", str(binary)], "not UTF-8"),
        (["--system", str(tmp_path / "missing.txt")], "--system"),
        (["--system", str(tmp_path)], "--system"),
    ]:
        proc = cli("create", "Summarise", "--over", str(src), *args, check=False)
        assert proc.returncode == 2, (args, proc.stderr)
        assert says in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)
    assert "No jobs yet" in cli("list").stdout


def test_the_dry_run_shows_the_options_in_the_request(cli, tmp_path):
    args = ["--over", str(_source(tmp_path)), "--temperature", "0.2", "--max-output-tokens", "60"]
    system = str(_system(tmp_path))
    plan = cli.json(
        "create", "Summarise", *args, "--system", system, *OPTIONS, "--dry-run", "--json"
    )
    request = plan["request"]
    assert {k: request[k] for k in SENT} == SENT
    assert request["messages"][0]["content"].startswith("You write for a legal team.")


def test_options_are_described_as_status_shows_them_and_the_temperature_bounds_hold():
    assert model_options.describe(None) == model_options.describe({}) == ""
    assert model_options.describe({"top_p": 0.9, "stop": ["\n"], "user": "é"}) == (
        'top_p 0.9, stop ["\\n"], user "é"'
    )
    for ok in (0, 0.0, 1, 2, 2.0):
        assert model_options.checked_temperature(ok) == ok
    for bad in (-0.0001, 2.0001, True, None, "1", float("nan"), float("inf")):
        with pytest.raises(UsageError):
            model_options.checked_temperature(bad)
