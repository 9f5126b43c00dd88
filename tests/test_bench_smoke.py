"""The benchmark suite (bench/) runs and produces numbers: each row at smoke sizes,
through the same code as `scripts/bench`. Whether the numbers meet their goals is for the
full run on a quiet machine (docs/benchmarks.md), not for the test suite."""

from __future__ import annotations

import math

import pytest
from bench import runner
from bench.core import RowResult

pytestmark = pytest.mark.slow


ROWS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]


@pytest.mark.parametrize("row", ROWS)
def test_row_runs_and_produces_positive_numbers(row):
    results, unavailable = runner.run_rows([row], quick=True, log=lambda text: None)
    assert unavailable == {}
    (result,) = results
    assert isinstance(result, RowResult) and result.row == row and result.lines
    for line in result.lines:
        assert line.measured and line.ratio is not None, line
        assert line.ratio > 0 and math.isfinite(line.ratio), line


def test_every_row_is_found_and_an_unknown_row_is_reported_not_available():
    assert sorted(runner.discover()) == ROWS
    results, unavailable = runner.run_rows([99], quick=True, log=lambda text: None)
    assert unavailable == {99: "no such row in bench/rows/"} and results == []


def test_the_report_keeps_the_hand_written_analysis(tmp_path):
    from bench import report
    from bench.core import Line

    doc = tmp_path / "benchmarks.md"
    r = RowResult(
        row=1,
        title="t",
        compared_with="c",
        goal="g",
        setup="s",
        lines=[Line("SQLite", "1 items/s", "pool 2 items/s", 0.5, ">= 0.60", False)],
    )
    doc.write_text(report.render([r], {}, command="x", machine={}, analysis="") + "My analysis.\n")
    again = report.render(
        [r], {5: "why"}, command="x", machine={}, analysis=report.existing_analysis(doc)
    )
    assert again.endswith(report.ANALYSIS_MARKER + "\nMy analysis.\n")
    assert "**missed**" in again and "Row 5: not available (why)." in again
