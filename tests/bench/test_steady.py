"""The load benchmark's steady-window control: turns counted over the windows where every pace
sample kept the machine's usual pace."""

from __future__ import annotations

from bench.load import STEADY_WINDOW_S, steady_slowdown, steady_turns


def test_turns_are_counted_over_the_windows_whose_samples_all_kept_the_pace() -> None:
    window = [100.0, 100.0 + 4 * STEADY_WINDOW_S]  # four windows: [100, 102) ... [106, 108)
    starts = [100.5, 101.0, 101.5, 102.5, 103.0, 104.5, 106.1, 106.2, 107.9]
    timed = [
        (101.0, 13.0),  # window 0: steady, 3 turns
        (103.0, 13.2),
        (103.5, 20.0),  # window 1: one slow sample, not counted
        # window 2: no sample, not counted
        (107.0, 12.5),  # window 3: steady, 3 turns
    ]
    steady = steady_turns(window, starts, timed, fastest=12.5)
    assert steady == {"windows": 2, "of": 4, "turns_per_s": 6 / (2 * STEADY_WINDOW_S)}


def test_the_steady_slowdown_compares_both_phases_steady_windows() -> None:
    alone = {"windows": 10, "of": 30, "turns_per_s": 800.0}
    mixed = {"windows": 20, "of": 30, "turns_per_s": 680.0}
    assert steady_slowdown(alone, mixed) == 1 - 680.0 / 800.0
    assert steady_slowdown(alone, {"windows": 0, "of": 30, "turns_per_s": 0.0}) is None
    assert steady_slowdown({"windows": 0, "of": 30, "turns_per_s": 0.0}, mixed) is None
