"""Each retry of a model request is an event on the model call's ``chat`` span and one count on
``agentsessions.model.retries``; the turn still has one ``chat`` span (one model call)."""

from __future__ import annotations

import pytest

from agentsessions.client import SessionsClient
from agentsessions.host.config import HostConfig
from tests.support.scripted_endpoint import Reply, scripted_endpoint
from tests.support.serving import serving
from tests.telemetry.conftest import Telemetry
from tests.telemetry.test_metrics import added, points


@pytest.fixture(autouse=True)
def no_provider_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MODEL_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


async def test_retries_are_span_events_and_counted(telemetry: Telemetry) -> None:
    before = points(telemetry)
    with scripted_endpoint(
        Reply.failure(429, "slow down"), Reply.failure(502, "bad gateway"), Reply.completion("done")
    ) as endpoint:
        config = HostConfig(
            listen="127.0.0.1:0",
            journal="memory:",
            log_level="warning",
            model="scripted-gpt",
            model_base_url=endpoint.base_url,
        )
        async with serving(config) as addresses, SessionsClient.connect(addresses[0]) as client:
            uid = (await client.create_session(harness="echo")).metadata.uid
            async for _ in client.exec(uid, "hi"):
                pass
    # The echo harness asks for model "echo", which the provider serves with its --model.
    chats = [s for s in telemetry.finished() if s.name.startswith("chat ")]
    assert len(chats) == 1, [s.name for s in telemetry.finished()]
    events = [e for e in chats[0].events if e.name == "agentsessions.model.retry"]
    assert [(e.attributes or {}).get("error.type") for e in events] == ["429", "502"]
    assert [(e.attributes or {}).get("agentsessions.model.retry.attempt") for e in events] == [1, 2]
    after = points(telemetry)
    assert (
        added(before, after, "agentsessions.model.retries", **{"gen_ai.request.model": "scripted-gpt"}) == 2
    )
    assert added(before, after, "agentsessions.model.retries", **{"error.type": "429"}) == 1
