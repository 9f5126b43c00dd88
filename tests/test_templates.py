"""create --template TEXT and --fields a,b: what of each CSV row or JSON record is sent. Checked at
create (a missing field names the item, its line and the fields it has), applied to every request
(live, in a provider batch, in the dry run and in `show`), part of the answer key, and never to
what the store keeps (`export --with-input` gives the rows back as they were). Real CLI and
workers against the loopback provider, on both backends; /bulk's is in
tests/plugin/test_bulk_templates.py."""

from __future__ import annotations

import csv
import io
import json

import pytest

from hermes_bulk.errors import InputError, UsageError
from hermes_bulk.jobs import templates
from hermes_bulk.testing.fake_provider import digest, expected_answer

ROWS = 'id,title,body\n1,Hello,World\n2,"=1+1",-10 stars #3\n3,@x,+3\n4,Hello,World\n'


def _csv(tmp_path, text: str = ROWS):
    src = tmp_path / "rows.csv"
    src.write_bytes(text.encode("utf-8"))
    return src


# The template language ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("template", "record", "sent"),
    [
        ("Title: {title}\\n{body}", {"title": "A", "body": "B"}, "Title: A\nB"),
        ("{ title }\\t{{literal}}", {"title": "A"}, "A\t{literal}"),
        ("{first name}!", {"first name": "Ann"}, "Ann!"),
        ("a\\\\n{x}", {"x": "1"}, "a\\n1"),  # an escaped backslash, then n
        ("{x}{x}", {"x": "é"}, "éé"),
        ("n={n}", {"n": 1}, "n=1"),
        ("{v}", {"v": [1, {"k": None}]}, '[1, {"k": null}]'),
        ("{v}|{w}", {"v": True, "w": "line\nbreak"}, "true|line\nbreak"),
    ],
)
def test_a_template_puts_each_fields_value_in_its_place(template, record, sent):
    shape = templates.shape(template, None)
    assert shape.render(json.dumps(record)) == sent


def test_numbers_go_as_they_were_written_and_fields_keep_their_json():
    record = '{"a": 1.10, "b": ' + "9" * 5000 + ', "c": 1e999, "d": "x", "e": [2.50]}'
    assert templates.shape("{a} {c}", None).render(record) == "1.10 1e999"
    assert templates.shape("{b}", None).render(record) == "9" * 5000
    assert (
        templates.shape(None, ("e", "a", "d")).render(record)
        == '{"e": [2.50], "a": 1.10, "d": "x"}'
    )


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("no fields here", "names no field"),
        ("{}", "names no field"),
        ("{  }", "names no field"),
        ("{title", "a lone '{' at character 1"),
        ("title}", "a lone '}' at character 6"),
        ("{a{b}}", "a lone '{'"),
        ("x" * (templates.MAX_TEMPLATE_CHARS + 1), "at most 20,000"),
        ("".join(f"{{f{i}}}" for i in range(templates.MAX_FIELDS + 1)), "more than 200"),
    ],
)
def test_a_bad_template_is_refused_saying_what_to_write(template, says):
    with pytest.raises(UsageError) as info:
        templates.checked(template, None, "csv")
    assert says in str(info.value)


def test_template_and_fields_are_for_fielded_sources_and_one_at_a_time():
    for kind in ("directory", "file"):
        with pytest.raises(UsageError, match="CSV, JSON and JSONL"):
            templates.checked("{a}", None, kind)
        with pytest.raises(UsageError, match="CSV, JSON and JSONL"):
            templates.checked(None, "a", kind)
    with pytest.raises(UsageError, match="not both"):
        templates.checked("{a}", "a", "csv")
    for empty in ("", ",", " , "):
        with pytest.raises(UsageError, match="names no field"):
            templates.checked(None, empty, "json")
    assert templates.checked(None, " b, a ,b", "jsonl") == (None, ("b", "a"))
    assert templates.checked(None, None, "directory") == (None, None)
    assert templates.checked("{a}", None, "json") == ("{a}", None)


def test_an_item_without_a_field_is_named_with_its_line_and_the_fields_it_has():
    shape = templates.shape("{title} {body}", None)
    assert shape.missing('{"title": 1, "body": 2}') == ()
    assert shape.missing('{"title": 1}') == ("body",)
    assert shape.missing('"text"') is None and shape.missing("[1]") is None
    error = templates.missing_field_error("--template", "line:3", 3, ("body",), '{"title": 1}')
    assert isinstance(error, InputError)
    assert str(error) == "--template: line:3 (line 3) has no field 'body'; its fields are: title."
    error = templates.missing_field_error("--fields", "record:2", None, None, "[1]")
    assert "record:2 is not a JSON object" in str(error)


# Through the CLI ---------------------------------------------------------------------------------
def test_every_request_sends_the_template_and_the_rows_come_back_as_themselves(
    backend_cli, fake_provider, tmp_path
):
    cli, src = backend_cli, _csv(tmp_path)
    args = ["--over", str(src), "--template", "Title: {title}\\n{body}"]
    created = cli.json("create", "Summarise", *args, "--json")
    job_id = created["job_id"]
    cli("run", job_id, "--wait")
    sent = ["Title: Hello\nWorld", "Title: =1+1\n-10 stars #3", "Title: @x\n+3"]
    # Rows 1 and 4 send the same text: one question, asked once.
    assert sorted(r.item for r in fake_provider.requests) == sorted(digest(t) for t in sent)
    status = cli.status(job_id)
    assert (status["template"], status["fields"]) == ("Title: {title}\\n{body}", None)
    assert (
        "Each request: at most 4,096 output tokens; each item as the template "
        "'Title: {title}\\\\n{body}'" in cli("status", job_id).stdout
    )

    out = tmp_path / "out.csv"
    cli("export", job_id, "--format", "csv", "--with-input", "--output", str(out))
    back = list(csv.reader(io.StringIO(out.read_text(encoding="utf-8-sig"))))
    given = list(csv.reader(io.StringIO(ROWS)))
    assert [row[:3] for row in back] == given, "the input cells are the user's, byte for byte"
    answers = [row[back[0].index("result")] for row in back[1:]]
    assert answers == [expected_answer(t) for t in (sent[0], sent[1], sent[2], sent[0])]
    shown = cli.json("show", job_id, "row:2", "--json")
    assert "Title: =1+1\n-10 stars #3" in shown["messages"][-1]["content"]

    # The same template again reuses every answer; another template, --fields or the whole row
    # asks again.
    assert cli.json("create", "Summarise", *args, "--json")["reused"] == 4
    for other in (
        ["--template", "Title: {title}"],
        ["--fields", "title,body"],
        [],
    ):
        assert cli.json("create", "Summarise", "--over", str(src), *other, "--json")["reused"] == 0


def test_fields_send_only_those_fields_and_equal_choices_are_one_question(
    backend_cli, fake_provider, tmp_path
):
    cli = backend_cli
    src = tmp_path / "records.json"
    src.write_text(
        '[{"id": 1, "lang": "fr", "text": "bonjour", "price": 1.10},\n'
        ' {"id": 2, "lang": "fr", "text": "bonjour", "price": 1.10},\n'
        ' {"id": 3, "lang": "de", "text": "hallo", "price": 2}]\n'
    )
    plan = cli.json(
        "create", "Translate", "--over", str(src), "--fields", "text,price", "--dry-run", "--json"
    )
    assert (plan["items"], plan["repeats"], plan["to_run"]) == (3, 1, 2)
    job_id = cli.json(
        "create", "Translate", "--over", str(src), "--fields", "text,price", "--json"
    )["job_id"]
    cli("run", job_id, "--wait")
    sent = ['{"text": "bonjour", "price": 1.10}', '{"text": "hallo", "price": 2}']
    assert sorted(r.item for r in fake_provider.requests) == sorted(digest(t) for t in sent)
    assert cli.status(job_id)["fields"] == ["text", "price"]
    assert "only the fields text, price of each item" in cli("status", job_id).stdout


def test_a_missing_field_is_an_error_naming_the_item_and_its_line_and_creates_nothing(
    backend_cli, tmp_path
):
    cli = backend_cli
    src = tmp_path / "records.jsonl"
    src.write_text('{"title": "a", "body": "b"}\n\n{"title": "c", "body": "d"}\n{"title": "e"}\n')
    proc = cli("create", "Do", "--over", str(src), "--template", "{title}: {body}", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "--template: line:3 (line 4) has no field 'body'; its fields are: title." in proc.stderr
    csv_src = _csv(tmp_path)
    proc = cli("create", "Do", "--over", str(csv_src), "--fields", "title,author", check=False)
    assert "--fields: row:1 (line 2) has no field 'author'; its fields are: id, title, body." in (
        proc.stderr
    )
    array = tmp_path / "mixed.json"
    array.write_text('[{"title": "a"},\n "just text"]')
    proc = cli("create", "Do", "--over", str(array), "--template", "{title}", check=False)
    assert "record:2 (line 2) is not a JSON object" in proc.stderr
    proc = cli(
        "create", "Do", "--over", str(array), "--template", "{title}", "--dry-run", check=False
    )
    assert proc.returncode == 1 and "record:2" in proc.stderr, "the dry run checks every item too"
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text("alpha")
    proc = cli("create", "Do", "--over", str(folder), "--fields", "a", check=False)
    assert proc.returncode == 2 and "CSV, JSON and JSONL" in proc.stderr
    assert "No jobs yet" in cli("list").stdout


def test_a_batch_line_carries_the_template(backend_cli, fake_provider, tmp_path):
    cli = backend_cli
    env = {"HERMES_BULK_BATCH_POLL_SECONDS": "0.1"}
    src = _csv(tmp_path, "title,body\nA,B\nC,D\n")
    args = ["--over", str(src), "--template", "{body} / {title}", "--batch", "--json"]
    job_id = cli.json("create", "Do", *args, **env)["job_id"]
    cli.run_batch_job(job_id, **env)
    assert sorted(line.item for line in fake_provider.batches.lines) == sorted(
        [digest("B / A"), digest("D / C")]
    )


def test_the_limits_are_the_documented_ones_and_the_flag_named_is_the_one_given():
    most = " ".join(f"{{f{i}}}" for i in range(templates.MAX_FIELDS))
    assert len(templates.parse_template(most)) == 2 * templates.MAX_FIELDS + 1
    longest = "{a}" + "x" * (templates.MAX_TEMPLATE_CHARS - 3)
    assert templates.checked(longest, None, "csv") == (longest, None)
    names = ",".join(f"f{i}" for i in range(templates.MAX_FIELDS))
    assert len(templates.parse_fields(names)) == templates.MAX_FIELDS
    with pytest.raises(UsageError, match="more than 200"):
        templates.parse_fields(names + ",one_more")
    with pytest.raises(UsageError, match=r"^--template is for"):
        templates.checked("{a}", None, "file")
    with pytest.raises(UsageError, match=r"^--fields is for"):
        templates.checked(None, "a", "file")


def test_text_goes_unescaped_and_a_record_too_deep_to_read_has_no_fields():
    assert templates.shape(None, ("t",)).render('{"t": "é ✓", "u": 1}') == '{"t": "é ✓"}'
    deep = "[" * 100_000 + "]" * 100_000
    assert templates.shape("{a}", None).missing(deep) is None


def test_a_rendered_item_over_max_item_bytes_is_refused_at_create_and_in_the_dry_run(
    backend_cli, tmp_path
):
    """A template that repeats a field makes the request text what max_item_bytes bounds: at the
    limit it is created, one byte over it is an error naming the item and the limit (the dry
    run too), and nothing is created."""
    cli = backend_cli
    src = tmp_path / "records.jsonl"
    src.write_text('{"x": "short"}\n' + json.dumps({"x": "a" * 100}) + "\n")
    template = "{x}" * 10  # the second record: 1,000 bytes
    proc = cli("create", "Do", "--over", str(src), "--template", template, "--dry-run",
               check=False, HERMES_BULK_MAX_ITEM_BYTES="999")  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert (
        "--template: line:2 (line 2) makes a request text larger than max_item_bytes (999 bytes);"
        in proc.stderr
    ) and "HERMES_BULK_MAX_ITEM_BYTES" in proc.stderr
    proc = cli("create", "Do", "--over", str(src), "--template", template, check=False,
               HERMES_BULK_MAX_ITEM_BYTES="999")  # fmt: skip
    assert proc.returncode == 1 and "line:2 (line 2) makes a request text" in proc.stderr
    assert "No jobs yet" in cli("list").stdout
    created = cli.json("create", "Do", "--over", str(src), "--template", template, "--json",
                       HERMES_BULK_MAX_ITEM_BYTES="1000")  # fmt: skip
    assert created["items"] == 2


def test_rendering_stops_at_the_limit():
    """A 100 KB field 6,000 times (600 MB rendered) against a 4 MiB limit: refused having built
    no more than about the limit; a multi-byte text counts its UTF-8 bytes."""
    import tracemalloc

    shape = templates.shape("{x}" * 6000, None)
    record = json.dumps({"x": "a" * 100_000})
    tracemalloc.start()
    try:
        with pytest.raises(templates.TooLarge):
            shape.render(record, 4 * 1024 * 1024)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 1024 * 1024, peak
    two = templates.shape("{x}{x}", None)
    assert two.render('{"x": "é"}', 4) == "éé"
    with pytest.raises(templates.TooLarge):
        two.render('{"x": "é"}', 3)
    fields = templates.shape(None, ("x",))
    assert fields.render('{"x": "ab"}', 11) == '{"x": "ab"}'
    with pytest.raises(templates.TooLarge):
        fields.render('{"x": "ab"}', 10)


@pytest.mark.parametrize(
    ("template", "parts"),
    [
        ("{Q1: revenue}", ("", "Q1: revenue", "")),
        ("{wow!}{a!r}", ("", "wow!", "", "a!r", "")),
        ("{a[0]} {b:}", ("", "a[0]", " ", "b:", "")),
        ("x: {a} [!]", ("x: ", "a", " [!]")),
    ],
)
def test_a_name_is_everything_between_its_braces_colons_and_brackets_too(template, parts):
    # A column may be called "Q1: revenue": no format spec, conversion or index is read in it.
    assert templates.parse_template(template) == parts


@pytest.mark.parametrize(
    ("template", "says"), [("{a[}]}", "'}' at character 6"), ("{a:{b}}", "'{'")]
)
def test_a_brace_inside_a_name_is_a_lone_one(template, says):
    with pytest.raises(UsageError, match=f"a lone {says}"):
        templates.parse_template(template)
