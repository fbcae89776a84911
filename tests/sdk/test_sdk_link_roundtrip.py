"""Both halves of Harness.Connect together: an SDK-served harness driven by ``RemoteHarness``.

The park, the decided approval, cancellation and failure each cross the real gRPC stream in both
directions, so a mismatch between the two halves shows up here even where each half alone is
self-consistent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from agentsessions.host.harnesslink import HarnessFailedError, RemoteHarness
from agentsessions.host.models.echo import EchoModel
from agentsessions.sdk import ApprovalParkedError, EventSink, ExecutionCancelledError, Start, text_message
from agentsessions.sdk.server import HarnessServicer, start_server
from agentsessions.v1 import common_pb2, harness_pb2

EXECUTION = "00112233aabbccdd"
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


class HostSink:
    """The host side: the echo model, plus an approval that is parked or decided."""

    def __init__(
        self,
        *,
        park: common_pb2.ApprovalRef | None = None,
        decision: common_pb2.ApprovalResult | None = None,
        receipt: common_pb2.ToolResult | None = None,
        model_blocks: bool = False,
    ) -> None:
        self.park = park
        self.decision = decision
        self.receipt = receipt
        self.model_blocks = model_blocks
        self.model_started = asyncio.Event()
        self.model_cancelled = False
        self.outputs: list[str] = []
        self.models: list[common_pb2.ModelCall] = []
        self.raised: ApprovalParkedError | None = None

    async def model(self, call: common_pb2.ModelCall) -> harness_pb2.ModelResult:
        self.models.append(call)
        self.model_started.set()
        if self.model_blocks:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.model_cancelled = True
                raise
        return await EchoModel().complete(call)

    async def output(self, text: str) -> None:
        self.outputs.append(text)

    async def tool_call(self, call: common_pb2.ToolCall) -> common_pb2.ToolResult:
        if self.park is not None:
            self.raised = ApprovalParkedError(self.park)
            raise self.raised
        assert self.receipt is not None
        return self.receipt

    async def report(self, result: common_pb2.ToolResult) -> None:
        raise AssertionError("no reports expected")

    async def usage(self, usage: common_pb2.Usage) -> None:
        raise AssertionError("no usage expected")

    def approval_decision(self, tool_call_id: str) -> common_pb2.ApprovalResult | None:
        return self.decision


@contextlib.asynccontextmanager
async def linked(harness: ScriptedHarness, **remote_options: float) -> AsyncIterator[RemoteHarness]:
    running = await start_server(harness, "127.0.0.1:0", servicer=HarnessServicer(harness, cancel_grace=0.05))
    remote = RemoteHarness(running.address, **remote_options)
    try:
        yield remote
    finally:
        await remote.close()
        await running.stop(None)


def start(*inputs: str) -> Start:
    return Start(session="sess-9", execution_id=EXECUTION, inputs=[text_message("user", t) for t in inputs])


async def test_echo_turn_round_trip() -> None:
    async def script(start: Start, sink: EventSink) -> None:
        result = await sink.model(common_pb2.ModelCall(model="echo", messages=list(start.inputs)))
        await sink.output("model said " + result.message.parts[0].text.text)

    host = HostSink()
    async with linked(ScriptedHarness(script)) as remote:
        await remote.run(start("hi"), host)
    assert host.outputs == ["model said echo:hi"]
    assert len(host.models) == 1


async def test_park_crosses_both_halves() -> None:
    ref = common_pb2.ApprovalRef(execution_id=EXECUTION, tool_call_id="c-1", request_seq=5)
    seen: list[common_pb2.ApprovalRef] = []

    async def script(start: Start, sink: EventSink) -> None:
        try:
            await sink.tool_call(APPROVAL_CALL)
        except ApprovalParkedError as parked:
            seen.append(parked.ref)
            raise

    harness = ScriptedHarness(script)
    host = HostSink(park=ref)
    async with linked(harness) as remote:
        with pytest.raises(ApprovalParkedError) as parked:
            await remote.run(start(), host)
    assert parked.value is host.raised
    assert seen == [ref]


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
    receipt = common_pb2.ToolResult(
        id="c-1", code=code, is_error=is_error, approval_request_seq=5, approval_decision_seq=6
    )
    decision = common_pb2.ApprovalResult(tool_call_id="c-1", approved=approved, reason="ok", request_seq=5)
    received: list[common_pb2.ToolResult] = []

    async def script(start: Start, sink: EventSink) -> None:
        received.append(await sink.tool_call(APPROVAL_CALL))

    async with linked(ScriptedHarness(script)) as remote:
        await remote.run(start(), HostSink(decision=decision, receipt=receipt))
    assert received == [receipt]


async def test_cancel_crosses_both_halves() -> None:
    seen: list[BaseException] = []

    async def script(start: Start, sink: EventSink) -> None:
        try:
            await sink.model(common_pb2.ModelCall(model="echo"))
        except ExecutionCancelledError as exc:
            seen.append(exc)
            raise

    host = HostSink(model_blocks=True)
    async with linked(ScriptedHarness(script), cancel_grace=0.05) as remote:
        running = asyncio.create_task(remote.run(start("hi"), host))
        async with asyncio.timeout(10):
            await host.model_started.wait()
        assert await remote.cancel(EXECUTION, "operator")
        with pytest.raises(ExecutionCancelledError):
            await running
    assert host.model_cancelled


async def test_harness_failure_reaches_the_host() -> None:
    async def script(start: Start, sink: EventSink) -> None:
        raise ValueError("no inputs to work with")

    async with linked(ScriptedHarness(script)) as remote:
        with pytest.raises(HarnessFailedError, match="no inputs to work with"):
            await remote.run(start(), HostSink())
