"""The machine's pace (bench/resultfile.py): a fixed piece of work whose CPU is timed when a suite
starts and ends and sampled while it runs, so a slow spell of the machine shows beside the ratios."""

from __future__ import annotations

import math

import pytest

from bench import resultfile


def test_the_pace_is_a_positive_cpu_time_in_milliseconds() -> None:
    ms = resultfile.pace(repeats=1)
    assert math.isfinite(ms)
    assert 0 < ms < 60_000


def test_a_sampler_samples_the_pace_in_a_process_of_its_own() -> None:
    with resultfile.PaceSampler(every_s=0.05) as sampler:
        assert sampler.sampled.wait(timeout=60), "no sample from the sampler's process"
    summary = sampler.summary()
    assert summary["samples"] >= 1
    assert summary["fastest_ms"] <= summary["median_ms"]
    assert 0 <= summary["slow_share"] <= 1


def test_the_summary_counts_slow_samples_against_the_fastest() -> None:
    sampler = resultfile.PaceSampler()
    sampler.samples = [10.0, 10.5, 12.9, 13.1, 20.0]
    summary = sampler.summary()
    assert summary == {
        "samples": 5,
        "fastest_ms": 10.0,
        "median_ms": 12.9,
        "mean_ms": pytest.approx(13.3),
        "slow_share": 0.4,
    }
    assert resultfile.PaceSampler().summary() == {"samples": 0}


def test_the_pace_goes_into_the_machine_and_its_lines() -> None:
    during = {"samples": 4, "fastest_ms": 12.5, "median_ms": 13.0, "slow_share": 0.25}
    pace = {"start_ms": 12.64, "end_ms": 16.9, "during": during}
    assert resultfile.machine(pace=pace)["pace"] == pace
    line = resultfile.pace_line(pace)
    assert "start 12.6 ms, end 16.9 ms" in line
    assert line.endswith("sampled 4 times, fastest 12.5 ms, median 13.0, 25% slow (over 1.3x the fastest)")
    assert resultfile.sampled_line({"samples": 0}) == "not sampled"
