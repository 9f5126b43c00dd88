"""Under CI=1 a skip is a failure, and so is a non-strict xfail (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys

from .conftest import ROOT

PROBE = """
import pytest

def test_skips():
    pytest.skip("no thing")

@pytest.mark.skipif(True, reason="a condition")
def test_skipif():
    pass

@pytest.mark.xfail(reason="loose")
def test_loose_xfail():
    assert False

@pytest.mark.xfail(reason="strict", strict=True)
def test_strict_xfail():
    assert False

def test_passes():
    pass
"""


def run_probe(tmp_path, ci: str) -> str:
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci:
        env["CI"] = ci
    # The suite's conftest as a plugin, over a probe file outside the suite.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.conftest",
            "-q",
            "-rsx",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_probe.py"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.stdout.strip().splitlines()[-1]


def test_skips_and_loose_xfails_fail_under_ci(tmp_path):
    # The skipif is refused at setup (an error); the skip and the loose xfail fail.
    assert run_probe(tmp_path, "1").startswith("2 failed, 1 passed, 1 xfailed, 1 error")


def test_outside_ci_a_skip_is_a_skip(tmp_path):
    assert run_probe(tmp_path, "").startswith("1 passed, 2 skipped, 2 xfailed")
