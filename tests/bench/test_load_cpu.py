"""The load suite's CPU accounting (bench/load.py): where the machine's CPU went over a window, so a
reader's drag on the turns can be told apart from a machine that ran out of cores."""

from __future__ import annotations

import io
import os
from contextlib import redirect_stdout
from typing import Any

import pytest

from bench import load, turn_client

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads Linux /proc")


def test_the_machines_busy_time_counts_this_process_cpu() -> None:
    machine, mine = load._machine_busy(), turn_client.own_cpu()
    spent = 0
    while turn_client.own_cpu() - mine < 0.3:  # burn CPU until this process has spent 0.3 s of it
        spent += sum(range(10_000))
    assert spent
    # Every busy second of this process is a busy second of the machine (other processes only add;
    # clock ticks round each figure by at most a tick, 10 ms).
    assert load._machine_busy() - machine >= 0.3 - 0.05


def phase(cpu: dict[str, Any]) -> dict[str, Any]:
    return {
        "sessions": 200,
        "seconds": 60.0,
        "turns": {"p50_ms": 1.0, "p99_ms": 2.0, "errors": {}},
        "turns_per_s": 500.0,
        "host_peak": {"rss_kib": 1024, "fds": 10},
        "readers": {},
        "journal": {"verify_exit": 0, "verify_output": ["ok"], "incomplete_executions": 0},
        "cpu_cores": cpu,
    }


def test_the_phase_prints_each_process_share_and_the_hosts_cpu_a_turn() -> None:
    cpu = {"host": 1.0, "turn_client": 0.45, "readers_list": 0.03, "readers_watch": 0.05, "machine": 1.6}
    out = io.StringIO()
    with redirect_stdout(out):
        load._print("turns + readers", phase(cpu | {"cores": 2}))
    line = next(line for line in out.getvalue().splitlines() if "CPU in cores" in line)
    assert "host 1.00 (2.00 ms a turn)" in line
    assert "readers 0.08 (list 0.03, watch 0.05)" in line
    assert line.endswith("the machine 1.60 of 2")


def test_a_phase_without_readers_prints_no_reader_share() -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        load._print("turns only", phase({"host": 1.1, "turn_client": 0.5, "machine": 1.6, "cores": 2}))
    assert "readers" not in next(line for line in out.getvalue().splitlines() if "CPU in cores" in line)


def test_the_pace_control_compares_the_phases_median_paces() -> None:
    alone = {"samples": 20, "fastest_ms": 12.4, "median_ms": 13.3, "mean_ms": 13.3, "slow_share": 0.17}
    mixed = {"samples": 20, "fastest_ms": 12.5, "median_ms": 13.4, "mean_ms": 16.9, "slow_share": 0.45}
    ratio = load.pace_control(alone, mixed)
    assert ratio is not None and ratio == pytest.approx(16.9 / 13.3)  # the mean, not the median
    assert "27% slower with the readers" in load._pace_verdict(ratio)
    assert load._pace_verdict(1.05) == "the phases ran at the same pace"
    assert "faster" in load._pace_verdict(0.8)
    assert load.pace_control({"samples": 0}, mixed) is None
