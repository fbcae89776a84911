"""The turns suite's floors and the gRPC transport (bench/turns.py): servers run on the transport
the ``agentsessions`` commands choose, clients on grpcio's default, an environment's own setting
wins; the floor on the default transport, and the host driven by a client on the commands'
transport, are controls, never goals."""

from __future__ import annotations

import io
from typing import Any

import pytest

from agentsessions.sdk.grpcenv import LEGACY_IO, VARIABLE
from bench import turns


def test_servers_take_the_commands_transport_and_clients_grpcs_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(VARIABLE, raising=False)
    assert turns._env()[VARIABLE] == LEGACY_IO
    assert turns._env(turns.DEFAULT_TRANSPORT)[VARIABLE] == ""
    assert VARIABLE not in turns._env(None)


def test_an_environments_setting_wins_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VARIABLE, "event_engine_client")
    for transport in (LEGACY_IO, turns.DEFAULT_TRANSPORT, None):
        assert turns._env(transport)[VARIABLE] == "event_engine_client"


def test_the_default_transport_floor_is_a_control_not_a_goal() -> None:
    r = turns.Report(turns.QUICK)
    r.throughput = {
        "floor": {"1": 400.0, "32": 800.0},
        "floor-default": {"1": 380.0, "32": 720.0},
        "host": {"1": 240.0, "32": 540.0},
    }
    goals = {g["goal"]: g for g in turns.summary(r)["goals"]}
    assert goals["host/floor turns/s, 32 session(s)"]["value"] == pytest.approx(540 / 800)
    assert goals["host/floor turns/s, 32 session(s)"]["met"] is False
    control = goals["control: host / floor on the default transport, 32 session(s)"]
    assert control["value"] == pytest.approx(540 / 720)
    assert control["met"] is None


def test_a_client_on_the_commands_transport_is_a_control_beside_the_langgraph_goal() -> None:
    r = turns.Report(turns.QUICK)
    r.throughput = {"host": {"1": 240.0, "32": 540.0}, turns.CLIENT_IO: {"1": 250.0, "32": 600.0}}
    r.langgraph = {"1": 80.0, "32": 200.0}
    goals = {g["goal"]: g for g in turns.summary(r)["goals"]}
    assert goals["host/LangGraph turns/s, 32 session(s)"]["value"] == pytest.approx(2.7)
    assert goals["host/LangGraph turns/s, 32 session(s)"]["met"] is False
    control = goals["control: host/LangGraph, client on host's transport, 32 session(s)"]
    assert control["value"] == pytest.approx(3.0)
    assert control["met"] is None


def test_a_systems_client_runs_on_its_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str | None] = []

    def run_json(argv: Any, timeout: float, transport: str | None = None) -> dict[str, Any]:
        seen.append(transport)
        return {"turns": 1, "turns_per_s": 1.0, "cpu_s": 0.0, "updates_per_turn": 7.0}

    monkeypatch.setattr(turns, "run_json", run_json)
    monkeypatch.setattr(turns, "cpu_seconds", lambda pid: 0.0)
    systems = {
        "host": turns.System("127.0.0.1:1", "echo", 1, 2),
        turns.CLIENT_IO: turns.System("127.0.0.1:1", "echo", 1, 2, LEGACY_IO),
    }
    r = turns.Report(turns.QUICK)
    turns.measure_throughput(r, systems, turns.QUICK, io.StringIO())
    assert seen == [None, LEGACY_IO, None, LEGACY_IO]  # 1 session, then 32, in the order given
