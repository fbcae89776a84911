"""The turns suite's floors and the gRPC transport (bench/turns.py): servers run on the transport
the ``agentsessions`` commands choose, clients on grpcio's default, an environment's own setting
wins; the floor on the default transport is a control, never a goal."""

from __future__ import annotations

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
