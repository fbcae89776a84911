"""The OpenAI-compatible provider retries what did not get through, inside one model call.

A real host (``server.serve`` from a ``HostConfig``, so the ``--model-*`` settings are what is
wired) runs echo turns against a scripted chat-completions endpoint on loopback; the journal is
read back over the wire.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

import grpc
import pytest

from agentsessions.client import SessionsClient
from agentsessions.host.config import ConfigError, HostConfig, ModelTransportConfig
from agentsessions.host.models.transport import retry_after_seconds
from agentsessions.v1 import common_pb2
from tests.support.scripted_endpoint import Reply, ScriptedEndpoint, scripted_endpoint
from tests.support.serving import serving

K = common_pb2.EventKind


class Retries(logging.Handler):
    """The provider's ``model call retry`` log lines, with their structured fields."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == "model call retry":
            self.seen.append(dict(getattr(record, "agentsessions_fields", {})))


@pytest.fixture
def retries() -> Iterator[Retries]:
    handler = Retries()
    logger = logging.getLogger("agentsessions.models")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


@pytest.fixture(autouse=True)
def no_provider_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MODEL_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


@asynccontextmanager
async def host_on(endpoint: ScriptedEndpoint, **transport: Any) -> AsyncIterator[SessionsClient]:
    config = HostConfig(
        listen="127.0.0.1:0",
        journal="memory:",
        log_level="warning",
        model="scripted-gpt",
        model_base_url=endpoint.base_url,
        model_transport=ModelTransportConfig(**transport),
    )
    async with serving(config) as addresses, SessionsClient.connect(addresses[0]) as client:
        yield client


async def turn(client: SessionsClient, text: str = "hi") -> tuple[str, list[common_pb2.LogRecord]]:
    uid = (await client.create_session(harness="echo")).metadata.uid
    try:
        async for _ in client.exec(uid, text):
            pass
    finally:
        records = [r async for r in client.replay(uid)]
    return uid, records


def kinds(records: list[common_pb2.LogRecord]) -> list[int]:
    return [r.event.kind for r in records]


async def test_two_429s_then_200_is_one_completed_turn_with_one_model_call(retries: Retries) -> None:
    with scripted_endpoint(
        Reply.failure(429, "slow down"),
        Reply.failure(429, "slow down"),
        Reply.completion("third time lucky", usage={"prompt_tokens": 5, "completion_tokens": 3}),
    ) as endpoint:
        async with host_on(endpoint) as client:
            _, records = await turn(client)
    assert len(endpoint.received) == 3
    assert all(r.body == endpoint.received[0].body for r in endpoint.received), "each retry resends the call"
    assert kinds(records).count(K.EVENT_MODEL_CALL) == 1
    (output,) = [r for r in records if r.event.kind == K.EVENT_OUTPUT]
    assert output.event.message.parts[0].text.text == "third time lucky"
    assert records[-1].event.kind == K.EVENT_END and records[-1].event.end.state == "COMPLETED"
    assert [(r["attempt"], r["cause"], r["model"]) for r in retries.seen] == [
        (1, "HTTP 429", "scripted-gpt"),
        (2, "HTTP 429", "scripted-gpt"),
    ]
    assert all(r["retry_after"] is False for r in retries.seen)


async def test_retry_after_on_a_503_is_honoured(retries: Retries) -> None:
    with scripted_endpoint(
        Reply.failure(503, "overloaded", retry_after="1"), Reply.completion("after the pause")
    ) as endpoint:
        async with host_on(endpoint) as client:
            _, records = await turn(client)
    assert records[-1].event.end.state == "COMPLETED"
    first, second = endpoint.received
    assert second.at - first.at >= 1.0, "the retry came before Retry-After had passed"
    (retry,) = retries.seen
    assert retry["cause"] == "HTTP 503" and retry["retry_after"] is True and retry["retry_in_s"] == 1.0


async def test_giving_up_is_a_clean_turn_failure_naming_the_status(retries: Retries) -> None:
    with scripted_endpoint(*[Reply.failure(503, "upstream overloaded")] * 3) as endpoint:
        async with host_on(endpoint, max_attempts=3) as client:
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await turn(client)
            uid = (await client.list_sessions().__anext__()).metadata.uid
            records = [r async for r in client.replay(uid)]
    assert len(endpoint.received) == 3 and len(retries.seen) == 2
    assert failed.value.code() == grpc.StatusCode.INTERNAL
    assert "HTTP 503 after 3 attempts" in (failed.value.details() or "")
    assert kinds(records) == [K.EVENT_EXECUTION_START, K.EVENT_INPUT, K.EVENT_MODEL_CALL, K.EVENT_ERROR]
    description = records[-1].event.error.description
    assert "HTTP 503 after 3 attempts" in description and "upstream overloaded" in description


async def test_a_client_error_is_not_retried() -> None:
    with scripted_endpoint(Reply.failure(400, "bad request body")) as endpoint:
        async with host_on(endpoint) as client:
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await turn(client)
    assert len(endpoint.received) == 1
    assert "HTTP 400: bad request body" in (failed.value.details() or "")


async def test_a_dropped_connection_is_retried(retries: Retries) -> None:
    with scripted_endpoint(Reply(drop=True), Reply.completion("reconnected")) as endpoint:
        async with host_on(endpoint) as client:
            _, records = await turn(client)
    assert len(endpoint.received) == 2
    assert records[-1].event.end.state == "COMPLETED"
    assert kinds(records).count(K.EVENT_MODEL_CALL) == 1
    (retry,) = retries.seen
    assert retry["cause"] == "RemoteProtocolError"


async def test_a_retry_after_beyond_the_budget_gives_up_at_once(retries: Retries) -> None:
    with scripted_endpoint(Reply.failure(503, "come back later", retry_after="600")) as endpoint:
        async with host_on(endpoint, timeout=30) as client:
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await turn(client)
    assert len(endpoint.received) == 1 and retries.seen == []
    assert "the next wait would pass the 30 s budget" in (failed.value.details() or "")


def test_retry_after_reads_seconds_and_http_dates() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC).timestamp()
    assert retry_after_seconds("7", now) == 7.0
    assert (
        retry_after_seconds(format_datetime(datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC), usegmt=True), now)
        == 30
    )
    assert retry_after_seconds("Thu, 01 Jan 2026 11:00:00 GMT", now) == 0.0  # in the past: no wait
    assert retry_after_seconds("soon", now) is None
    assert retry_after_seconds(None, now) is None


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("model_timeout", "0", "--model-timeout 0 must be a positive number of seconds"),
        ("model_connect_timeout", "fast", "--model-connect-timeout 'fast' is not a number of seconds"),
        ("model_max_attempts", "0", "--model-max-attempts 0 must be at least 1"),
        ("model_max_attempts", "2.5", "--model-max-attempts '2.5' is not an integer"),
    ],
)
def test_bad_transport_flags_stop_startup_naming_the_flag(flag: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        HostConfig.from_sources(argparse.Namespace(**{flag: value}), {})


def test_transport_settings_come_from_flags_then_variables() -> None:
    config = HostConfig.from_sources(
        argparse.Namespace(model_read_timeout="45"),
        {"AGENTSESSIONS_MODEL_READ_TIMEOUT": "99", "AGENTSESSIONS_MODEL_MAX_ATTEMPTS": "6"},
    )
    assert config.model_transport == ModelTransportConfig(read_timeout=45, max_attempts=6)
