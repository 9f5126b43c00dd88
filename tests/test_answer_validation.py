"""Nothing a provider answers is kept before it is checked (DESIGN.md invariant 15).

A truncated answer (finish_reason "length") fails its item and never enters the reuse index; a
--schema answer is checked against the schema with jsonschema; every malformed shape of a live
chat-completions answer (choices not a list, content a number, an HTML page, 50 MB …) is a
failed attempt with a reason in our words, never an exception out of a worker and never a
completed item. The loopback provider's hostile modes (fake_provider.HOSTILE) play the provider;
real `hermes-bulk run --wait` and real workers, on SQLite and Redis.
"""

from __future__ import annotations

import json
import signal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_bulk.errors import InvalidAnswer, ModelError, PermanentModelError, TruncatedAnswer
from hermes_bulk.providers import answers
from hermes_bulk.providers.client import HttpModelClient
from hermes_bulk.runtime.sending import structured
from hermes_bulk.testing.fake_provider import HOSTILE

from .helpers import wait_for

LABEL = {
    "type": "object",
    "properties": {"label": {"enum": ["good", "bad"]}, "score": {"type": "integer"}},
    "required": ["label"],
}


def _export(cli, job_id: str) -> list[dict]:
    out = cli("export", job_id, "--format", "jsonl", "--output", "-").stdout
    return [json.loads(line) for line in out.splitlines()]


def _items(tmp_path, names: list[str]):
    src = tmp_path / "items.jsonl"
    src.write_text("".join(json.dumps({"t": name}) + "\n" for name in names))
    return src


# The schema sent, and the user's schema checked --------------------------------------------------


def test_the_strict_form_closes_every_object_and_asks_for_every_property():
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "label": {"enum": ["a", "b"], "description": "kept"},
            "tags": {
                "type": "array",
                "items": {"type": "object", "properties": {"k": {"type": "string"}}},
            },
            "where": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/place"}]},
        },
        "$defs": {
            "place": {"type": "object", "properties": {"city": {"type": "string", "default": "x"}}}
        },
    }
    strict = answers.strict_form(schema)
    assert strict == {
        "type": "object",
        "additionalProperties": False,
        "required": ["label", "tags", "where"],
        "properties": {
            "label": {"enum": ["a", "b"], "description": "kept"},
            "tags": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"k": {"type": "string"}},
                    "additionalProperties": False,
                    "required": ["k"],
                },
            },
            "where": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/place"}]},
        },
        "$defs": {
            "place": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "additionalProperties": False,
                "required": ["city"],
            }
        },
    }
    assert "$schema" in schema and "additionalProperties" not in schema, (
        "the user's schema is not changed"
    )
    body = HttpModelClient(
        base_url="http://127.0.0.1:9/v1", api_key=None, model="m", timeout_s=1
    ).request_body([], max_tokens=None, json_schema=schema)
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "item_result", "schema": strict, "strict": True},
    }


@pytest.mark.parametrize(
    "change",
    [
        {"additionalProperties": True},
        {"additionalProperties": {"type": "string"}},
        {"patternProperties": {"^x": {"type": "string"}}},
        {"required": ["label", "not_listed"]},
        {"properties": {"label": {"type": "string", "minLength": 3}}},
        {"properties": {"label": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}},
        {"properties": {"label": {"type": "object"}}},
        {"allOf": [{"required": ["label"]}]},
    ],
)
def test_strict_is_dropped_where_it_would_change_what_is_valid(change):
    schema = {"type": "object", "properties": {"label": {"type": "string"}}, **change}
    assert answers.strict_form(schema) is None
    assert answers.response_format(schema) == {
        "type": "json_schema",
        "json_schema": {"name": "item_result", "schema": schema, "strict": False},
    }


@pytest.mark.parametrize(
    ("schema", "needle"),
    [
        (
            {"type": "object", "properties": {"a": {"type": "strin"}}},
            "not a valid JSON schema at $.properties.a.type",
        ),
        (
            {"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}},
            "points outside the file",
        ),
        (
            {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
            "points at nothing in the file",
        ),
        (
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": "a"},
            "not a valid JSON schema",
        ),
    ],
)
def test_create_refuses_a_schema_that_cannot_check_answers_in_one_line(
    cli, tmp_path, schema, needle
):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    proc = cli(
        "create", "Do", "--over", str(_items(tmp_path, ["a"])), "--schema", str(path), check=False
    )
    assert proc.returncode == 1, proc.stderr
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert cli.json("list", "--json") == [], "nothing was created"


def test_create_refuses_a_schema_nested_past_the_parser_in_one_line(cli, tmp_path):
    path = tmp_path / "schema.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    proc = cli(
        "create", "Do", "--over", str(_items(tmp_path, ["a"])), "--schema", str(path), check=False
    )
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"hermes-bulk: --schema {path}: nested too deeply to be a schema."


def test_an_answer_is_checked_against_the_users_schema_not_the_strict_form():
    """A property the user left optional may be missing, and one the user's schema bounds is
    held to it: the answer is checked against what the user wrote."""
    from hermes_bulk.providers.client import Completion
    from hermes_bulk.store.protocol import Usage

    text = json.dumps(LABEL)
    kept = structured(Completion('```json\n{"label": "good"}\n```', Usage(1, 1)), text)
    assert json.loads(kept.text) == {"label": "good"}
    for answer, needle in [
        ('{"label": "maybe", "score": 3}', "$.label is not one of the values"),
        ('{"label": "good", "score": "high"}', "$.score is not an integer"),
        ('{"score": 3}', "$ lacks label"),
        ('["good"]', "not a JSON object"),
        ("[" * 100_000, "is not JSON"),
        ('{"label": "good", "label": "maybe"}', "gives a key twice"),
    ]:
        with pytest.raises(InvalidAnswer, match="--schema") as caught:
            structured(Completion(answer, Usage(1, 1)), text)
        assert needle in str(caught.value)
        assert "maybe" not in str(caught.value) and "high" not in str(caught.value), (
            "our words, not the answer"
        )


# Every shape of a live answer, through the real HTTP client -------------------------------------


@pytest.mark.parametrize("fault", sorted(HOSTILE))
def test_every_hostile_answer_is_a_classified_error_never_a_completion(fault, fake_provider):
    client = HttpModelClient(base_url=fake_provider.base_url, api_key="k", model="m", timeout_s=10)
    fake_provider.configure(script=[fault])
    try:
        with pytest.raises(ModelError) as caught:
            completion = client.complete(
                [{"role": "user", "content": "an item"}],
                max_tokens=50,
                json_schema=LABEL if fault in ("off_schema", "prose") else None,
            )
            structured(completion, json.dumps(LABEL))  # reached only for the --schema faults
    finally:
        client.close()
    exc = caught.value
    expected = {
        "length": TruncatedAnswer,
        "length_silent": TruncatedAnswer,
        "refusal": PermanentModelError,
    }
    assert isinstance(exc, expected.get(fault, InvalidAnswer)), (fault, type(exc), exc)
    assert exc.http_status == 200 and "sk-LEAKED" not in str(exc) and len(str(exc)) < 300
    # What the provider billed goes with the error, wherever the body says it (to be charged).
    billed = fake_provider.billed()
    if fault == "huge":  # not read past MAX_ANSWER_BYTES: its usage is not known
        assert exc.usage is None and billed != (0, 0)
    elif billed == (0, 0):  # not JSON, or a usage that is no object
        assert not exc.billed, fault
    else:
        assert exc.billed and (exc.usage.tokens_in, exc.usage.tokens_out) == billed, fault


# Through the CLI and workers, on both backends ---------------------------------------------------


def test_a_truncated_answer_fails_its_item_and_is_never_reused(
    backend_cli, tmp_path, fake_provider
):
    cli = backend_cli
    cli.env["HERMES_BULK_MAX_OUTPUT_TOKENS"] = "64"
    src = _items(tmp_path, ["alpha", "beta-CUT", "gamma"])
    fake_provider.configure(item_faults={"beta-CUT": "length"})
    first = cli.create("Summarise", src)
    assert cli("run", first, "--wait", timeout=60, check=False).returncode == 1, (
        "it ends with a failed item"
    )
    rows = {r["item"]: r for r in _export(cli, first)}
    cut = rows["line:2"]
    assert cut["status"] == "failed" and cut["result"] is None
    assert cut["error"].startswith(
        "Truncated (HTTP 200): truncated: the answer stopped at the output limit of 64"
    )
    assert [rows[n]["status"] for n in ("line:1", "line:3")] == ["completed", "completed"]
    assert len(fake_provider.requests) == 3, "a truncated answer is not asked again in the same job"

    fake_provider.configure(item_faults={})
    fake_provider.reset_records()
    made = cli("create", "Summarise", "--over", str(src))
    assert "2 answered before (reused), 1 to run" in made.stdout, made.stdout
    second = made.stdout.split()[2]
    cli("run", second, "--wait", timeout=60)
    assert len(fake_provider.requests) == 1, (
        "the truncated item is asked again; the others are reused"
    )
    assert [r["status"] for r in _export(cli, second)] == ["completed"] * 3


def test_an_answer_off_the_schema_is_a_failed_attempt_with_the_path(
    backend_cli, tmp_path, fake_provider
):
    cli = backend_cli
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(LABEL))
    src = _items(tmp_path, ["once-OFF", "always-OFF", "fine"])
    fake_provider.configure(
        fail_once={"once-OFF": "off_schema"}, item_faults={"always-OFF": "off_schema"}
    )
    job = cli.create("Label it", src, "--schema", str(schema), "--retries", "1")
    assert cli("run", job, "--wait", timeout=60, check=False).returncode == 1, (
        "it ends with a failed item"
    )
    rows = {r["item"]: r for r in _export(cli, job)}
    assert rows["line:1"]["status"] == "completed" and rows["line:1"]["data"]["label"] == "good", (
        "the second attempt's valid answer is kept"
    )
    failed = rows["line:2"]
    assert failed["status"] == "failed" and failed["result"] is None
    assert failed["error"] == (
        "InvalidAnswer (HTTP 200): the answer does not match --schema: "
        "$.label is not one of the values the schema allows"
    )
    assert rows["line:3"]["status"] == "completed"
    asked = [r.fault for r in fake_provider.requests]
    assert asked.count("off_schema") == 3 and len(asked) == 5, (
        "each off-schema answer was one attempt"
    )
    # Every answer was billed: the job is charged each, those not kept apart, and the row of the
    # item answered at its second attempt says what both attempts were billed.
    by_item: dict[str, list] = {}
    for r in fake_provider.requests:
        by_item.setdefault(r.item, []).append(r)
    twice = next(rs for rs in by_item.values() if [r.fault for r in rs] == ["off_schema", None])
    kept = rows["line:1"]
    assert (kept["tokens_in"], kept["tokens_out"]) == (
        sum(r.billed_in for r in twice),
        sum(r.billed_out for r in twice),
    )
    st = cli.status(job)
    assert st["tokens_charged"] == sum(fake_provider.billed())
    assert st["tokens_unkept"] == sum(
        r.billed_in + r.billed_out for r in fake_provider.requests if r.fault
    )
    assert st["cost_unkept_usd"] is None, "no price: the tokens only"
    events = cli("events", job).stdout
    assert "not-in-the-enum" not in events and "not-in-the-enum" not in json.dumps(rows)

    fake_provider.configure(item_faults={})
    fake_provider.reset_records()
    again = cli.json("create", "Label it", "--over", str(src), "--schema", str(schema), "--json")
    assert again["reused"] == 2, "the item whose answers were all off the schema is not reused"


MALFORMED = [
    "no_choices",
    "choices_not_list",
    "choice_not_object",
    "message_not_object",
    "content_list",
    "content_number",
    "usage_string",
    "finish_reason_number",
    "model_list",
    "html",
    "deep",
    "huge",
    "duplicate_key",
    "refusal",
    "length_silent",
]


def test_a_worker_fails_each_malformed_answer_with_a_reason_and_goes_on(
    backend_cli, tmp_path, fake_provider
):
    cli = backend_cli
    cli.env["HERMES_BULK_MAX_OUTPUT_TOKENS"] = "64"
    names = [f"item-{fault}" for fault in MALFORMED] + ["healthy"]
    src = _items(tmp_path, names)
    fake_provider.configure(item_faults={f"item-{fault}": fault for fault in MALFORMED})
    job = cli.create("Process", src, "--retries", "0")
    worker = cli.spawn_worker()
    try:
        cli("run", job)
        done = wait_for(
            lambda: (
                (st := cli.status(job))["state"] in ("completed", "completed_with_errors", "failed")
                and st
            ),
            timeout=90,
            message="the job to end",
        )
    finally:
        worker.send_signal(signal.SIGINT)
        worker.wait(60)
    assert (done["completed"], done["failed"]) == (1, len(MALFORMED))
    rows = _export(cli, job)
    by_fault = {fault: rows[i] for i, fault in enumerate(MALFORMED)}
    assert rows[-1]["status"] == "completed"
    for fault, row in by_fault.items():
        assert row["status"] == "failed" and row["result"] is None, fault
        assert "InternalError" not in row["error"] and "sk-LEAKED" not in row["error"], (
            fault,
            row["error"],
        )
    assert (
        by_fault["html"]["error"] == "InvalidAnswer (HTTP 200): the provider's answer is not JSON"
    )
    assert (
        by_fault["duplicate_key"]["error"]
        == "InvalidAnswer (HTTP 200): the provider's answer gives a key twice"
    )
    assert (
        by_fault["huge"]["error"]
        == "InvalidAnswer (HTTP 200): the provider's answer is larger than 16 MiB"
    )
    assert by_fault["content_number"]["error"].endswith(
        "$.choices[0].message.content is not a string or null"
    )
    assert by_fault["usage_string"]["error"].endswith("$.usage is not an object or null")
    assert by_fault["refusal"]["error"].startswith("PermanentError (HTTP 200): the model refused")
    assert by_fault["length_silent"]["error"].startswith("Truncated (HTTP 200): truncated")
    log = "".join(p.read_text() for p in cli.logs_dir.glob("worker-*.log"))
    assert "unexpected error" not in log and "Traceback" not in log


def test_a_batch_line_cut_short_or_off_the_schema_is_not_kept(backend_cli, tmp_path, fake_provider):
    """The same checks on a provider batch's output lines: a truncated line fails its item, an
    off-schema line is a failed attempt (here the last one: --retries 0)."""
    cli = backend_cli
    cli.env |= {"HERMES_BULK_BATCH_POLL_SECONDS": "0.1", "HERMES_BULK_PRICE": "100,400"}
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(LABEL))
    src = _items(tmp_path, ["cut-CUT", "off-OFF", "fine"])
    fake_provider.configure(item_faults={"cut-CUT": "length", "off-OFF": "off_schema"})
    job = cli.json(
        "create",
        "Label it",
        "--over",
        str(src),
        "--schema",
        str(schema),
        "--batch",
        "--retries",
        "0",
        "--json",
    )["job_id"]
    worker = cli.spawn_worker()
    try:
        cli("run", job)
        wait_for(
            lambda: cli.status(job)["state"] in ("completed", "completed_with_errors", "failed"),
            timeout=90,
            message="the end",
        )
    finally:
        worker.send_signal(signal.SIGINT)
        worker.wait(60)
    rows = _export(cli, job)
    assert [r["status"] for r in rows] == ["failed", "failed", "completed"]
    assert rows[0]["error"].startswith("Truncated (HTTP 200): truncated")
    assert rows[1]["error"].endswith("$.label is not one of the values the schema allows")
    assert fake_provider.requests == [], "answered through the batch only"
    # The lines not kept were billed: charged at the price (the setting's, batch or not).
    lines = fake_provider.batches.lines
    unkept = [r for r in lines if r.fault]
    assert len(lines) == 3 and len(unkept) == 2
    tokens_in, tokens_out = fake_provider.billed()
    st = cli.status(job)
    assert st["tokens_charged"] == tokens_in + tokens_out
    assert st["tokens_unkept"] == sum(r.billed_in + r.billed_out for r in unkept) > 0
    assert st["cost_usd"] == pytest.approx((tokens_in * 100 + tokens_out * 400) / 1e6, rel=1e-12)
    unkept_usd = sum(r.billed_in * 100 + r.billed_out * 400 for r in unkept) / 1e6
    assert st["cost_unkept_usd"] == pytest.approx(unkept_usd, rel=1e-12)
    assert sum(r["cost_usd"] for r in rows) == pytest.approx(st["cost_usd"], rel=1e-9)


# The plain-Python fast path never accepts what the shape's JSON schema refuses ------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=80),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def _maybe(strategy):
    """A field's value: usually of the right kind, sometimes anything, sometimes absent."""
    return st.one_of(strategy, strategy, strategy, _JSON, st.just(_ABSENT))


_ABSENT = object()


def _fields(**parts):
    return st.fixed_dictionaries({}, optional={k: v for k, v in parts.items()}).map(
        lambda d: {k: v for k, v in d.items() if v is not _ABSENT}
    )


_MESSAGE = _fields(
    content=_maybe(st.none() | st.text(max_size=20)),
    refusal=_maybe(st.none() | st.text(max_size=5)),
    role=_maybe(st.just("assistant")),
)
_CHOICE = _fields(
    message=_maybe(_MESSAGE),
    finish_reason=_maybe(
        st.none() | st.text(min_size=60, max_size=70) | st.sampled_from(["stop", "length"])
    ),
)
_BODY = _fields(
    choices=_maybe(st.lists(_maybe(_CHOICE), max_size=3)),
    usage=_maybe(st.none() | st.dictionaries(st.text(max_size=5), _JSON, max_size=2)),
    model=_maybe(st.none() | st.text(min_size=195, max_size=205) | st.just("m")),
)


@settings(max_examples=600, deadline=None)
@given(_BODY | _JSON)
def test_the_fast_check_of_a_body_agrees_with_its_json_schema(body):
    from jsonschema import Draft202012Validator

    assert answers.plainly_valid(body) == Draft202012Validator(answers.CHAT_COMPLETION).is_valid(
        body
    )
