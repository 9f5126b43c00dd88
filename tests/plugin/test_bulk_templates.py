"""/bulk … --template and --fields in a real Hermes 0.19.0: each item is sent as the template makes
it, through Hermes' model, on both backends; a missing field is a reply, not a traceback."""

from __future__ import annotations

from hermes_bulk.testing.fake_provider import digest

from .conftest import job_id_of
from .test_bulk_plugin import wait_for_state


def test_a_bulk_job_sends_each_row_as_its_template_makes_it(
    gateway, hermes_home, hermes_provider, tmp_path, bulk_backend
):
    url = bulk_backend
    src = tmp_path / "rows.csv"
    src.write_text("id,title,body\n1,Tea,Green\n2,Coffee,Black\n")
    gw = gateway()
    created = gw.bulk(f"\"Describe\" --over {src} --template '{{title}} is {{body}}'")
    job = job_id_of(created)
    gw.bulk(f"run {job}")
    status = " ".join(wait_for_state(gw, job, "completed", backend=url).split())  # unwrapped
    assert "each item as the template '{title} is {body}'" in status
    assert sorted(r.item for r in hermes_provider.requests) == sorted(
        [digest("Tea is Green"), digest("Coffee is Black")]
    )

    refused = " ".join(gw.bulk(f'"Describe" --over {src} --fields title,author').split())
    assert "--fields: row:1 (line 2) has no field 'author'" in refused
    assert "its fields are: id, title, body" in refused and "Traceback" not in refused
