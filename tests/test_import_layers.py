"""The arrows point down: what a module loads, checked in a fresh interpreter.

jobs/service.py (the service API) sits above the store and below the worker runtime, which consumes
it; fleet/liveness.py (who is alive) sits below both, on the store protocol alone."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def loaded_by(module: str) -> set[str]:
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return {m for m in json.loads(out) if m.startswith("hermes_bulk")}


@pytest.mark.parametrize(
    "module, above",
    [
        (
            "hermes_bulk.jobs.service",
            {"hermes_bulk.runtime.worker", "hermes_bulk.frontends.cli", "hermes_bulk.plugin"},
        ),
        (
            "hermes_bulk.fleet.liveness",
            {
                "hermes_bulk.runtime.worker",
                "hermes_bulk.jobs.service",
                "hermes_bulk.fleet.broker",
                "hermes_bulk.runtime.pipeline",
                "hermes_bulk.fleet.tasks",
            },
        ),
    ],
)
def test_a_module_loads_nothing_above_it(module, above):
    loaded = loaded_by(module)
    assert {m for m in loaded if m in above or m.rsplit(".", 1)[0] in above} == set()
