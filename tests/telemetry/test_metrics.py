"""Metrics of a real echo turn: RPC duration, turns by outcome, journal append latency, model calls."""

from __future__ import annotations

from typing import Any

import pytest

from agentsessions.client import SessionsClient
from agentsessions.host.config import HostConfig
from agentsessions.host.controller import writer
from tests.support.serving import serving
from tests.telemetry.conftest import Telemetry

Points = dict[tuple[str, frozenset[tuple[str, Any]]], float]


def points(telemetry: Telemetry) -> Points:
    """Every data point, keyed by metric name and attributes: a counter's sum or a histogram's count."""
    found: Points = {}
    for resource in telemetry.metrics().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "count", None)
                    if value is None:
                        value = point.value  # type: ignore[union-attr]
                    found[(metric.name, frozenset((point.attributes or {}).items()))] = value
    return found


def added(before: Points, after: Points, name: str, **attributes: Any) -> float:
    """How much the points of ``name`` whose attributes include ``attributes`` grew."""
    wanted = set(attributes.items())
    total = 0.0
    for (metric, attrs), value in after.items():
        if metric == name and wanted <= set(attrs):
            total += value - before.get((metric, attrs), 0)
    return total


async def test_an_echo_turn_is_measured(telemetry: Telemetry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer, "SOON_LINGER_S", 60.0)  # the OUTPUT waits for the END, however slow
    before = points(telemetry)
    config = HostConfig(listen="127.0.0.1:0", journal="memory:")
    async with serving(config) as (address,), SessionsClient.connect(address) as client:
        uid = (await client.create_session()).metadata.uid
        [u async for u in client.exec(uid, "hello")]
    after = points(telemetry)
    exec_method = {"rpc.method": "agentsessions.v1.Sessions/Exec", "rpc.response.status_code": "OK"}
    assert added(before, after, "rpc.server.call.duration", **exec_method) == 1
    assert (
        added(
            before,
            after,
            "rpc.server.call.duration",
            **{"rpc.method": "agentsessions.v1.Sessions/CreateSession"},
        )
        == 1
    )
    assert (
        added(
            before,
            after,
            "agentsessions.turns",
            **{"agentsessions.turn.outcome": "completed", "gen_ai.agent.name": "echo"},
        )
        == 1
    )
    assert added(before, after, "agentsessions.turns", **{"agentsessions.turn.outcome": "failed"}) == 0
    # EXECUTION_START+INPUT, then MODEL_CALL+OUTPUT+END (ordered, written with the END).
    assert added(before, after, "agentsessions.journal.append.duration") == 2
    assert (
        added(
            before,
            after,
            "gen_ai.client.operation.duration",
            **{"gen_ai.operation.name": "chat", "gen_ai.request.model": "echo"},
        )
        == 1
    )
