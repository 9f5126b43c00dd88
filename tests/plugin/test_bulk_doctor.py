"""`/bulk doctor` in a real Hermes gateway: Hermes' own model (what /bulk jobs call) is checked
with one 1-token request through ctx.llm; a refused key is one FAIL line, without provider text."""

from __future__ import annotations


def test_bulk_doctor_checks_hermes_model_with_one_request(gateway, hermes_provider):
    gw = gateway()
    answer = gw.bulk("doctor")
    assert answer.splitlines() == [
        "ok   model    Hermes' model custom/fake-model answered a 1-token request",
        "Usable.",
    ], answer
    assert len(hermes_provider.requests) == 1

    hermes_provider.configure(require_key="sk-not-what-hermes-has")
    try:
        answer = gw.bulk("doctor")
    finally:
        hermes_provider.configure(require_key=None)
    first = answer.replace("\n  ", " ").splitlines()[
        0
    ]  # a reply wraps at 80 columns, continuing indented
    assert first.startswith(
        "FAIL model    Hermes' model custom/fake-model did not answer a 1-token request: "
        "the provider refused the credentials (HTTP 401)"
    ), answer
    assert "Not usable" in answer and "sk-LEAKED" not in answer and "sk-local-fake" not in answer
