"""Both halves of Harness.Connect together: an SDK-served harness driven by ``RemoteHarness``,
with the SDK test kit's scripted host behind the host half.

The park, the decided approval, cancellation and failure each cross the real gRPC stream in both
directions, so a mismatch between the two halves shows up here even where each half alone is
self-consistent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from agentsessions.host.harnesslink import HarnessFailedError, RemoteHarness
from agentsessions.sdk import (
    ApprovalParkedError,
    EventSink,
    ExecutionCancelledError,
    ModelCall,
    Start,
    ToolError,
)
from agentsessions.sdk.harness import ApprovalDetails
from agentsessions.sdk.server import HarnessServicer, start_server
from agentsessions.sdk.testing import HarnessEnvironment
from agentsessions.v1 import common_pb2, harness_pb2

APPROVAL_CALL = common_pb2.ToolCall(
    id="c-1", tool="deploy", mediation=common_pb2.MEDIATION_REQUIRES_APPROVAL, idempotency_key="k-1"
)


class ScriptedHarness:
    def __init__(self, script: Callable[[Start, EventSink], Awaitable[None]]) -> None:
        self.script = script

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return harness_pb2.HarnessDescriptor(id="scripted", version="1")

    async def run(self, start: Start, sink: EventSink) -> None:
        await self.script(start, sink)


def echo(call: ModelCall) -> str:
    return "echo:" + call.messages[-1].text()


@contextlib.asynccontextmanager
async def linked(harness: ScriptedHarness, **remote_options: Any) -> AsyncIterator[RemoteHarness]:
    running = await start_server(harness, "127.0.0.1:0", servicer=HarnessServicer(harness, cancel_grace=0.05))
    remote = RemoteHarness(running.address, **remote_options)
    try:
        yield remote
    finally:
        await remote.close()
        await running.stop(None)


async def test_echo_turn_round_trip() -> None:
    async def script(start: Start, sink: EventSink) -> None:
        result = await sink.model(common_pb2.ModelCall(model="echo", messages=list(start.inputs)))
        await sink.output("model said " + result.message.parts[0].text.text)

    async with linked(ScriptedHarness(script)) as remote:
        env = HarnessEnvironment(remote, model=echo)
        outcome = await env.run("hi")
    assert outcome.outputs == ["echo:hi", "model said echo:hi"]
    assert env.model_calls == 1


async def test_park_crosses_both_halves() -> None:
    seen: list[common_pb2.ApprovalRef] = []

    async def script(start: Start, sink: EventSink) -> None:
        try:
            await sink.tool_call(APPROVAL_CALL)
        except ApprovalParkedError as parked:
            seen.append(parked.ref)
            raise

    async with linked(ScriptedHarness(script)) as remote:
        env = HarnessEnvironment(remote)
        outcome = await env.run()
    assert outcome.state == "PARKED" and isinstance(outcome.parked, common_pb2.ApprovalRef)
    assert seen == [outcome.parked] == [env.pending_approval()]


def deploy_failing(args: dict[str, object]) -> object:
    raise ToolError("target unreachable")


@pytest.mark.parametrize(
    ("approved", "code", "is_error"),
    [
        (True, common_pb2.ToolResult.CODE_UNSPECIFIED, False),
        (True, common_pb2.ToolResult.EXECUTOR_ERROR, True),
        (False, common_pb2.ToolResult.APPROVAL_DENIED, True),
    ],
    ids=["success", "executor-error", "denied"],
)
async def test_decided_approval_crosses_both_halves(
    approved: bool, code: common_pb2.ToolResult.Code.ValueType, is_error: bool
) -> None:
    received: list[tuple[common_pb2.ToolResult, common_pb2.ApprovalResult | None]] = []

    async def script(start: Start, sink: EventSink) -> None:
        result = await sink.tool_call(APPROVAL_CALL)
        assert isinstance(sink, ApprovalDetails), "the SDK's stream sink relays the decision"
        received.append((result, sink.approval_decision(APPROVAL_CALL.id)))

    deploy = deploy_failing if code == common_pb2.ToolResult.EXECUTOR_ERROR else (lambda args: {"ok": True})
    async with linked(ScriptedHarness(script)) as remote:
        env = HarnessEnvironment(remote, tools={"deploy": deploy})
        parked = await env.run()
        env.approve("ops said ok", approved=approved)
        resumed = await env.resume()
    assert resumed.state == "COMPLETED"
    ((result, decision),) = received
    assert (result.code, result.is_error) == (code, is_error)
    assert parked.parked is not None and result.approval_request_seq == parked.parked.request_seq
    assert decision is not None and (decision.approved, decision.reason) == (approved, "ops said ok")


async def test_cancel_crosses_both_halves() -> None:
    seen: list[BaseException] = []
    model_started = asyncio.Event()
    model_cancelled = asyncio.Event()

    async def blocking(call: ModelCall) -> str:
        model_started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            model_cancelled.set()
            raise
        return "never"

    async def script(start: Start, sink: EventSink) -> None:
        try:
            await sink.model(common_pb2.ModelCall(model="echo"))
        except ExecutionCancelledError as exc:
            seen.append(exc)
            raise

    async with linked(ScriptedHarness(script), cancel_grace=0.05) as remote:
        env = HarnessEnvironment(remote, model=[blocking])
        running = asyncio.create_task(env.run("hi"))
        async with asyncio.timeout(10):
            await model_started.wait()
        await env.cancel("operator")
        async with asyncio.timeout(10):
            outcome = await running
    assert outcome.state == "CANCELED" and outcome.kinds()[-1] == "END"
    assert model_cancelled.is_set()


async def test_harness_failure_reaches_the_host() -> None:
    async def script(start: Start, sink: EventSink) -> None:
        raise ValueError("no inputs to work with")

    async with linked(ScriptedHarness(script)) as remote:
        env = HarnessEnvironment(remote)
        outcome = await env.run()
    assert outcome.state == "FAILED" and isinstance(outcome.error, HarnessFailedError)
    assert "no inputs to work with" in str(outcome.error)
