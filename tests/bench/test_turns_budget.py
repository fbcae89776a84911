"""The turns suite's CPU budget (bench/turns.py ``cpu_budget``): what a run's CPU a turn allows on
the machine's cores, and what the LangGraph goal asks, from the raw numbers of a report."""

from __future__ import annotations

import io

import pytest

from bench import turns


def report() -> turns.Report:
    r = turns.Report(turns.QUICK)
    r.throughput = {"host": {"32": 580.0}}
    r.cpu_ms_per_turn = {"host": {"32": {"host": 1.85, "harness": 0.6, "client": 0.55}}}
    r.langgraph = {"1": 85.0, "32": 230.0}
    return r


def test_the_budget_is_the_cores_over_every_process_cpu_a_turn() -> None:
    budget = turns.cpu_budget(report(), cores=2)
    assert budget is not None
    assert budget["total_ms"] == pytest.approx(3.0)
    assert budget["cap_turns_per_s"] == pytest.approx(2000 / 3.0)
    assert budget["share_of_cap"] == pytest.approx(580.0 / (2000 / 3.0))
    assert budget["langgraph_goal_turns_per_s"] == pytest.approx(690.0)


def test_no_budget_without_cpu_figures_and_no_goal_without_langgraph() -> None:
    r = report()
    r.langgraph = {"unavailable": "not installed"}
    budget = turns.cpu_budget(r, cores=2)
    assert budget is not None and budget["langgraph_goal_turns_per_s"] is None
    r.cpu_ms_per_turn = {}
    assert turns.cpu_budget(r, cores=2) is None


def test_the_report_prints_the_budget() -> None:
    r = report()
    out = io.StringIO()
    derived = turns.summary(r)
    derived["cpu_budget"] = turns.cpu_budget(r, cores=2)
    turns.print_report(r, derived, out)
    assert (
        "CPU budget, 32 sessions, the benchmark's client: host 1.85 + harness 0.60 + client 0.55 = "
        "3.00 ms a turn on 2 cores: at most 667 turns/s; the host did 580.0 (87% of that); "
        "the LangGraph goal asks 690"
    ) in out.getvalue()
