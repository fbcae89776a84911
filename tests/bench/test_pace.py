"""The machine's pace (bench/resultfile.py): a fixed piece of work timed when a suite starts and
ends, so a slow stretch of the machine shows in the results file beside the ratios."""

from __future__ import annotations

import math

from bench import resultfile


def test_the_pace_is_a_positive_time_in_milliseconds() -> None:
    ms = resultfile.pace(repeats=1)
    assert math.isfinite(ms)
    assert 0 < ms < 60_000


def test_the_pace_goes_into_the_machine_and_its_line() -> None:
    pace = {"start_ms": 12.64, "end_ms": 16.9}
    assert resultfile.machine(pace=pace)["pace"] == pace
    line = resultfile.pace_line(pace)
    assert line.endswith("start 12.6 ms, end 16.9 ms")
    assert f"best of {resultfile.PACE_REPEATS}" in line
