"""The harness side of Harness.Connect, driven by a raw host: ControllerFrames in, Events out.

Each test serves a small scripted harness with the SDK's servicer on a loopback port and plays
the host by hand, so every frame and event the spec names is visible.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
import pytest

from agentsessions.sdk import (
    ApprovalParkedError,
    CorrelationError,
    EventSink,
    ExecutionCancelledError,
    ProtocolError,
    SinkClosedError,
    Start,
    ToolCallRejectedError,
    text_message,
)
from agentsessions.sdk.server import HarnessServicer, start_server
from agentsessions.v1 import common_pb2, harness_pb2, harness_pb2_grpc
from tests.sdk.receipts import decided_receipts

SESSION = "sess-1"
EXECUTION = "0123456789abcdef"
K = common_pb2.EventKind
Code = common_pb2.ToolResult

Script = Callable[[Start, EventSink], Awaitable[None]]


class ScriptedHarness:
    """Runs a test-provided coroutine as the execution; keeps the sink for late calls."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.runs = 0
        self.sink: EventSink | None = None
        self.start: Start | None = None

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return harness_pb2.HarnessDescriptor(id="scripted", version="7")

    async def run(self, start: Start, sink: EventSink) -> None:
        self.runs += 1
        self.start = start
        self.sink = sink
        await self.script(start, sink)


@contextlib.asynccontextmanager
async def serving(
    harness: ScriptedHarness, channel_options: Sequence[tuple[str, Any]] = (), **options: Any
) -> AsyncIterator[harness_pb2_grpc.HarnessAsyncStub]:
    servicer = HarnessServicer(harness, **options)
    running = await start_server(harness, "127.0.0.1:0", servicer=servicer)
    channel = grpc.aio.insecure_channel(running.address, options=channel_options)
    try:
        yield harness_pb2_grpc.HarnessStub(channel)  # type: ignore[misc]
    finally:
        await channel.close()
        await running.stop(None)


class Host:
    """A raw host on one Connect stream."""

    def __init__(self, stub: harness_pb2_grpc.HarnessAsyncStub) -> None:
        self.call = stub.Connect()

    async def send(self, frame: harness_pb2.ControllerFrame, *, stamp: bool = True) -> None:
        if stamp:
            frame.session = frame.session or SESSION
            frame.execution_id = frame.execution_id or EXECUTION
        await self.call.write(frame)

    async def start(self, *inputs: str, session: str = SESSION) -> None:
        start = harness_pb2.Start(inputs=[text_message("user", text) for text in inputs])
        frame = harness_pb2.ControllerFrame(session=session, execution_id=EXECUTION, start=start)
        await self.send(frame, stamp=False)

    async def recv(self) -> common_pb2.Event | None:
        async with asyncio.timeout(10):
            message = await self.call.read()
        if message is grpc.aio.EOF:
            return None
        assert isinstance(message, common_pb2.Event)
        assert message.execution_id == EXECUTION
        return message

    async def status(self) -> grpc.StatusCode:
        async with asyncio.timeout(10):
            code: grpc.StatusCode = await self.call.code()
        return code

    async def end(self) -> common_pb2.HarnessEnd:
        event = await self.recv()
        assert event is not None and event.kind == K.EVENT_END, event
        return event.end


def model_reply(call_id: str, text: str, *, execution_id: str = "") -> harness_pb2.ControllerFrame:
    result = harness_pb2.ModelResult(model_call_id=call_id, message=text_message("assistant", text))
    return harness_pb2.ControllerFrame(model=result, execution_id=execution_id)


def approval_call(call_id: str = "call-1") -> common_pb2.ToolCall:
    return common_pb2.ToolCall(
        id=call_id, tool="deploy", mediation=common_pb2.MEDIATION_REQUIRES_APPROVAL, idempotency_key="key-1"
    )


def mediated_call(call_id: str = "call-1") -> common_pb2.ToolCall:
    return common_pb2.ToolCall(
        id=call_id, tool="lookup", mediation=common_pb2.MEDIATION_CONTROLLER_MEDIATED, idempotency_key="key-1"
    )


async def echo_script(start: Start, sink: EventSink) -> None:
    await sink.model(
        common_pb2.ModelCall(model="echo", messages=[text_message("user", start.last_input_text())])
    )


async def test_describe_returns_the_harness_descriptor() -> None:
    async with serving(ScriptedHarness(echo_script)) as stub:
        descriptor = await stub.Describe(harness_pb2.DescribeRequest(), timeout=10)
    assert (descriptor.id, descriptor.version) == ("scripted", "7")


async def test_echo_turn_follows_the_raw_transcript() -> None:
    harness = ScriptedHarness(echo_script)
    async with serving(harness) as stub:
        host = Host(stub)
        await host.start("hi")
        event = await host.recv()
        assert event is not None and event.kind == K.EVENT_MODEL_CALL
        call = event.model
        assert len(call.id) == 16 and int(call.id, 16) >= 0
        assert call.model == "echo"
        assert [m.parts[0].text.text for m in call.messages] == ["hi"]
        await host.send(model_reply(call.id, "echo:hi"))
        end = await host.end()
        assert end.state == "COMPLETED" and not end.HasField("error")
        assert await host.recv() is None
        assert await host.status() == grpc.StatusCode.OK
    assert harness.start is not None and harness.start.session == SESSION
    assert harness.start.execution_id == EXECUTION


@pytest.mark.parametrize(
    ("opening", "detail"),
    [
        (lambda host: host.send(model_reply("x", "y")), "first ControllerFrame must be Start"),
        (
            lambda host: host.send(
                harness_pb2.ControllerFrame(session=SESSION, start=harness_pb2.Start()), stamp=False
            ),
            "Start frame requires execution_id",
        ),
        (lambda host: host.call.done_writing(), None),
    ],
    ids=["first-frame-must-be-start", "start-requires-execution-id", "host-closing-before-start"],
)
async def test_a_stream_without_a_valid_start_is_refused(
    opening: Callable[[Host], Awaitable[object]], detail: str | None
) -> None:
    harness = ScriptedHarness(echo_script)
    async with serving(harness) as stub:
        host = Host(stub)
        await opening(host)
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await host.recv()
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    if detail is not None:
        assert detail in (failure.value.details() or "")
    assert harness.runs == 0


class Recorder:
    """What a script saw, for assertions after the stream."""

    def __init__(self) -> None:
        self.errors: list[BaseException] = []
        self.results: list[common_pb2.ToolResult] = []


def failing_then_sticky(recorder: Recorder, effect: Callable[[EventSink], Awaitable[object]]) -> Script:
    """A script whose first effect fails; a second call must fail with the same error."""

    async def script(start: Start, sink: EventSink) -> None:
        try:
            await effect(sink)
        except Exception as first:
            recorder.errors.append(first)
            try:
                await sink.output("after the failure")
            except Exception as second:
                recorder.errors.append(second)
            raise
        raise AssertionError("the effect should have failed")

    return script


def recording(
    recorder: Recorder, error_type: type[Exception], effect: Callable[[EventSink], Awaitable[object]]
) -> Script:
    """A script whose effect fails with ``error_type``, which it records and raises."""

    async def script(start: Start, sink: EventSink) -> None:
        try:
            await effect(sink)
        except error_type as exc:
            recorder.errors.append(exc)
            raise

    return script


async def model_effect(sink: EventSink) -> object:
    return await sink.model(common_pb2.ModelCall(model="m"))


async def tool_effect(sink: EventSink) -> object:
    return await sink.tool_call(mediated_call())


@pytest.mark.parametrize(
    ("reply", "error_type", "message"),
    [
        (
            lambda call_id: model_reply("not-" + call_id, "x"),
            CorrelationError,
            "model result correlation mismatch",
        ),
        (
            lambda call_id: model_reply(call_id, "x", execution_id="another-exec"),
            CorrelationError,
            "result execution_id mismatch",
        ),
        (
            lambda call_id: harness_pb2.ControllerFrame(tool=common_pb2.ToolResult(id=call_id)),
            ProtocolError,
            "expected a ModelResult frame",
        ),
    ],
    ids=["call-id", "execution-id", "frame-kind"],
)
async def test_model_reply_must_correlate(
    reply: Callable[[str], harness_pb2.ControllerFrame], error_type: type[Exception], message: str
) -> None:
    recorder = Recorder()
    async with serving(ScriptedHarness(failing_then_sticky(recorder, model_effect))) as stub:
        host = Host(stub)
        await host.start("hi")
        event = await host.recv()
        assert event is not None and event.kind == K.EVENT_MODEL_CALL
        await host.send(reply(event.model.id))
        end = await host.end()
        with pytest.raises(grpc.aio.AioRpcError):
            await host.recv()
        assert await host.status() == grpc.StatusCode.UNKNOWN
    assert end.state == "FAILED" and message in end.error.description
    first, second = recorder.errors
    assert isinstance(first, error_type) and message in str(first)
    assert second is first  # protocol failures are sticky


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (
            harness_pb2.ControllerFrame(tool=common_pb2.ToolResult(id="call-2")),
            "tool result correlation mismatch",
        ),
        (
            harness_pb2.ControllerFrame(session="other-session", tool=common_pb2.ToolResult(id="call-1")),
            "tool result session mismatch",
        ),
        (
            harness_pb2.ControllerFrame(model=harness_pb2.ModelResult(model_call_id="call-1")),
            "expected a ToolResult frame",
        ),
        (
            harness_pb2.ControllerFrame(
                park=common_pb2.ApprovalRef(execution_id=EXECUTION, tool_call_id="call-1", request_seq=3)
            ),
            "expected a ToolResult frame",
        ),
    ],
    ids=["call-id", "session", "frame-kind", "park-on-ordinary-call"],
)
async def test_tool_reply_must_correlate(reply: harness_pb2.ControllerFrame, message: str) -> None:
    recorder = Recorder()
    async with serving(ScriptedHarness(failing_then_sticky(recorder, tool_effect))) as stub:
        host = Host(stub)
        await host.start()
        event = await host.recv()
        assert event is not None and event.kind == K.EVENT_TOOL_CALL
        assert event.tool == mediated_call()
        await host.send(reply)
        end = await host.end()
    assert end.state == "FAILED" and message in end.error.description
    assert isinstance(recorder.errors[0], ProtocolError)
    assert recorder.errors[1] is recorder.errors[0]


async def test_mediated_tool_call_round_trip() -> None:
    recorder = Recorder()

    async def script(start: Start, sink: EventSink) -> None:
        recorder.results.append(await sink.tool_call(mediated_call()))

    async with serving(ScriptedHarness(script)) as stub:
        host = Host(stub)
        await host.start()
        event = await host.recv()
        assert event is not None and event.kind == K.EVENT_TOOL_CALL
        result = common_pb2.ToolResult(
            id="call-1", content=[common_pb2.Part(text=common_pb2.TextPart(text="42"))]
        )
        await host.send(harness_pb2.ControllerFrame(tool=result))
        assert (await host.end()).state == "COMPLETED"
    assert recorder.results == [result]


async def test_unmediated_and_unkeyed_approval_calls_are_refused_before_the_host_sees_them() -> None:
    recorder = Recorder()

    async def script(start: Start, sink: EventSink) -> None:
        for call in (
            common_pb2.ToolCall(id="a", tool="t", mediation=common_pb2.MEDIATION_IN_HARNESS_REPORTED),
            common_pb2.ToolCall(id="b", tool="t"),
            approval_call(call_id=""),
        ):
            try:
                await sink.tool_call(call)
            except ToolCallRejectedError as exc:
                recorder.errors.append(exc)

    async with serving(ScriptedHarness(script)) as stub:
        host = Host(stub)
        await host.start()
        assert (await host.end()).state == "COMPLETED"
    assert len(recorder.errors) == 3
    assert "approval requires session and call id" in str(recorder.errors[2])


async def test_approval_without_session_is_refused() -> None:
    recorder = Recorder()

    async def script(start: Start, sink: EventSink) -> None:
        with pytest.raises(ToolCallRejectedError, match="approval requires session and call id") as refused:
            await sink.tool_call(approval_call())
        recorder.errors.append(refused.value)

    async with serving(ScriptedHarness(script)) as stub:
        host = Host(stub)
        await host.start(session="")
        assert (await host.end()).state == "COMPLETED"
    assert len(recorder.errors) == 1


async def test_outputs_reports_and_usage_become_events() -> None:
    async def script(start: Start, sink: EventSink) -> None:
        await sink.output("thinking")
        await sink.report(common_pb2.ToolResult(id="local-1", is_error=False))
        await sink.usage(common_pb2.Usage(model="m", input_tokens=3, output_tokens=5))

    async with serving(ScriptedHarness(script)) as stub:
        host = Host(stub)
        await host.start()
        events = [await host.recv() for _ in range(4)]
    kinds = [e.kind for e in events if e is not None]
    assert kinds == [K.EVENT_OUTPUT, K.EVENT_TOOL_RESULT, K.EVENT_USAGE, K.EVENT_END]
    assert events[0] is not None and events[0].message == text_message("assistant", "thinking")
    assert events[1] is not None and events[1].result.id == "local-1"
    assert events[2] is not None and events[2].usage.output_tokens == 5


async def test_park_round_trip_acknowledges_once_and_seals_the_sink() -> None:
    recorder = Recorder()
    ref = common_pb2.ApprovalRef(execution_id=EXECUTION, tool_call_id="call-1", request_seq=7)

    async def script(start: Start, sink: EventSink) -> None:
        try:
            await sink.tool_call(approval_call())
        except ApprovalParkedError as parked:
            recorder.errors.append(parked)
            try:
                await sink.model(common_pb2.ModelCall(model="m"))
            except ApprovalParkedError as again:
                recorder.errors.append(again)
            raise

    harness = ScriptedHarness(script)
    async with serving(harness) as stub:
        host = Host(stub)
        await host.start()
        event = await host.recv()
        assert event is not None and event.kind == K.EVENT_TOOL_CALL
        await host.send(harness_pb2.ControllerFrame(park=ref))
        ack = await host.recv()
        assert ack is not None and ack.kind == K.EVENT_PARKED and ack.parked == ref
        assert await host.recv() is None  # no END after a park
        assert await host.status() == grpc.StatusCode.OK
    parked, again = recorder.errors
    assert isinstance(parked, ApprovalParkedError) and parked.ref == ref
    assert again is parked
    assert harness.sink is not None
    with pytest.raises(ApprovalParkedError) as late:
        await harness.sink.usage(common_pb2.Usage())
    assert late.value is parked


async def test_swallowed_park_is_still_acknowledged() -> None:
    ref = common_pb2.ApprovalRef(execution_id=EXECUTION, tool_call_id="call-1", request_seq=2)

    async def script(start: Start, sink: EventSink) -> None:
        with contextlib.suppress(ApprovalParkedError):
            await sink.tool_call(approval_call())

    async with serving(ScriptedHarness(script)) as stub:
        host = Host(stub)
        await host.start()
        await host.recv()
        await host.send(harness_pb2.ControllerFrame(park=ref))
        ack = await host.recv()
        assert ack is not None and ack.kind == K.EVENT_PARKED and ack.parked == ref
        assert await host.recv() is None


async def test_park_then_a_distinct_failure_sends_no_acknowledgement() -> None:
    async def script(start: Start, sink: EventSink) -> None:
        try:
            await sink.tool_call(approval_call())
        except ApprovalParkedError:
            raise RuntimeError("cleanup failed") from None

    async with serving(ScriptedHarness(script)) as stub:
        host = Host(stub)
        await host.start()
        await host.recv()
        ref = common_pb2.ApprovalRef(execution_id=EXECUTION, tool_call_id="call-1", request_seq=2)
        await host.send(harness_pb2.ControllerFrame(park=ref))
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await host.recv()
    assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "cleanup failed" in (failure.value.details() or "")


@pytest.mark.parametrize(
    "frame",
    [
        harness_pb2.ControllerFrame(
            park=common_pb2.ApprovalRef(execution_id=EXECUTION, tool_call_id="call-9", request_seq=2)
        ),
        harness_pb2.ControllerFrame(
            park=common_pb2.ApprovalRef(execution_id="other", tool_call_id="call-1", request_seq=2)
        ),
        harness_pb2.ControllerFrame(
            park=common_pb2.ApprovalRef(execution_id=EXECUTION, tool_call_id="call-1", request_seq=0)
        ),
    ],
    ids=["call-id", "execution-id", "request-seq"],
)
async def test_park_must_correlate(frame: harness_pb2.ControllerFrame) -> None:
    async def script(start: Start, sink: EventSink) -> None:
        await sink.tool_call(approval_call())

    async with serving(ScriptedHarness(script)) as stub:
        host = Host(stub)
        await host.start()
        await host.recv()
        await host.send(frame)
        end = await host.end()
    assert end.state == "FAILED" and "park correlation mismatch" in end.error.description


def decision(
    approved: bool, *, request_seq: int = 4, reason: str = "ok by ops"
) -> harness_pb2.ControllerFrame:
    result = common_pb2.ApprovalResult(
        tool_call_id="call-1", approved=approved, reason=reason, request_seq=request_seq
    )
    return harness_pb2.ControllerFrame(approval=result)


def receipt(
    code: common_pb2.ToolResult.Code.ValueType,
    is_error: bool,
    *,
    approval_request_seq: int = 4,
    approval_decision_seq: int = 5,
) -> harness_pb2.ControllerFrame:
    result = common_pb2.ToolResult(
        id="call-1",
        code=code,
        is_error=is_error,
        approval_request_seq=approval_request_seq,
        approval_decision_seq=approval_decision_seq,
    )
    return harness_pb2.ControllerFrame(tool=result)


@decided_receipts
async def test_decided_approval_is_served_as_a_receipt(
    approved: bool, code: common_pb2.ToolResult.Code.ValueType, is_error: bool
) -> None:
    recorder = Recorder()

    async def script(start: Start, sink: EventSink) -> None:
        recorder.results.append(await sink.tool_call(approval_call()))

    async with serving(ScriptedHarness(script)) as stub:
        host = Host(stub)
        await host.start()
        await host.recv()
        await host.send(decision(approved))
        await host.send(receipt(code, is_error))
        assert (await host.end()).state == "COMPLETED"
    (result,) = recorder.results
    assert (result.code, result.is_error) == (code, is_error)
    assert (result.approval_request_seq, result.approval_decision_seq) == (4, 5)


@pytest.mark.parametrize(
    ("frames", "message"),
    [
        ([decision(True), receipt(Code.APPROVAL_DENIED, True)], "status conflicts with decision"),
        ([decision(False), receipt(Code.APPROVAL_DENIED, False)], "status conflicts with decision"),
        ([decision(False), receipt(Code.CODE_UNSPECIFIED, False)], "status conflicts with decision"),
        ([decision(True), receipt(Code.CODE_UNSPECIFIED, True)], "status conflicts with decision"),
        (
            [decision(True), receipt(Code.CODE_UNSPECIFIED, False, approval_request_seq=9)],
            "does not match decision",
        ),
        (
            [decision(True), receipt(Code.CODE_UNSPECIFIED, False, approval_decision_seq=0)],
            "must be positive",
        ),
        ([receipt(Code.CODE_UNSPECIFIED, False)], "expected an ApprovalResult or park frame"),
        ([decision(True), decision(True)], "expected a ToolResult frame"),
        ([decision(True, request_seq=0)], "approval correlation mismatch"),
    ],
    ids=[
        "approved-but-denied",
        "denied-not-error",
        "denied-but-executed",
        "success-flagged-error",
        "request-seq",
        "decision-seq",
        "receipt-without-decision",
        "duplicate-decision",
        "decision-without-seq",
    ],
)
async def test_malformed_approval_replies_fail_the_call(
    frames: list[harness_pb2.ControllerFrame], message: str
) -> None:
    recorder = Recorder()
    script = recording(recorder, ProtocolError, lambda sink: sink.tool_call(approval_call()))
    async with serving(ScriptedHarness(script)) as stub:
        host = Host(stub)
        await host.start()
        await host.recv()
        for frame in frames:
            await host.send(frame)
        end = await host.end()
    assert end.state == "FAILED" and message in end.error.description
    assert len(recorder.errors) == 1


async def test_forged_receipt_report_is_refused_and_sticky() -> None:
    recorder = Recorder()

    async def forge(sink: EventSink) -> object:
        await sink.report(common_pb2.ToolResult(id="call-1", approval_request_seq=3, approval_decision_seq=4))
        return None

    async with serving(ScriptedHarness(failing_then_sticky(recorder, forge))) as stub:
        host = Host(stub)
        await host.start()
        end = await host.end()  # the forged TOOL_RESULT never reached the host
    assert end.state == "FAILED" and "host-owned approval receipt" in end.error.description
    assert recorder.errors[1] is recorder.errors[0]


async def test_cancel_interrupts_a_blocked_call_and_ends_canceled() -> None:
    recorder = Recorder()
    script = recording(recorder, ExecutionCancelledError, model_effect)
    async with serving(ScriptedHarness(script)) as stub:
        host = Host(stub)
        await host.start()
        await host.recv()
        await host.send(harness_pb2.ControllerFrame(cancel=harness_pb2.Cancel(reason="user stop")))
        end = await host.end()
        assert await host.recv() is None
        assert await host.status() == grpc.StatusCode.OK
    assert end.state == "CANCELED" and end.error.description == "user stop"
    assert len(recorder.errors) == 1 and "user stop" in str(recorder.errors[0])


class HookedHarness(ScriptedHarness):
    """A scripted harness with a cancel hook; ``ends_by_itself`` is what the hook answers."""

    def __init__(self, script: Script, *, ends_by_itself: bool) -> None:
        super().__init__(script)
        self.ends_by_itself = ends_by_itself
        self.cancels: list[tuple[str, str]] = []
        self.told = asyncio.Event()

    async def cancel(self, execution_id: str, reason: str) -> bool:
        self.cancels.append((execution_id, reason))
        self.told.set()
        return self.ends_by_itself


async def test_the_cancel_hook_hears_a_cancel_while_the_run_is_busy_with_its_own_work() -> None:
    async def script(start: Start, sink: EventSink) -> None:
        await sink.output("working")
        async with asyncio.timeout(10):
            await harness.told.wait()  # its own work, no sink call: only the hook can tell it

    harness = HookedHarness(script, ends_by_itself=True)
    async with serving(harness) as stub:
        host = Host(stub)
        await host.start()
        event = await host.recv()
        assert event is not None and event.kind == K.EVENT_OUTPUT
        await host.send(harness_pb2.ControllerFrame(cancel=harness_pb2.Cancel(reason="stop now")))
        end = await host.end()
        assert await host.status() == grpc.StatusCode.OK
    assert harness.cancels == [(EXECUTION, "stop now")]
    assert end.state == "CANCELED" and end.error.description == "stop now"


@pytest.mark.parametrize("ends_by_itself", [True, False], ids=["after-the-grace", "at-once"])
async def test_a_hooked_run_that_does_not_end_is_cancelled(ends_by_itself: bool) -> None:
    cancelled = asyncio.Event()

    async def script(start: Start, sink: EventSink) -> None:
        try:
            # The host may read the OUTPUT before this write's completion is seen here: a cancel
            # arriving then lands in the write, which is inside the try too.
            await sink.output("working")
            await asyncio.Event().wait()  # never set: the grace timer or the hook's False ends this
        except asyncio.CancelledError:
            cancelled.set()
            raise

    harness = HookedHarness(script, ends_by_itself=ends_by_itself)
    grace = 0.01 if ends_by_itself else 3600.0  # "at once" must not wait for the grace
    async with serving(harness, cancel_grace=grace) as stub:
        host = Host(stub)
        await host.start()
        event = await host.recv()
        assert event is not None and event.kind == K.EVENT_OUTPUT
        await host.send(harness_pb2.ControllerFrame(cancel=harness_pb2.Cancel(reason="stop")))
        end = await host.end()
    assert end.state == "CANCELED"
    assert cancelled.is_set()


async def test_a_write_abandoned_in_the_middle_still_lets_the_stream_end_cleanly() -> None:
    """The host reads nothing while the harness writes 48 MiB, so the write waits on flow control
    past the reply timeout and the sink call gives up on it. The write still completes once the
    host reads, and the END that reports the failure follows it on the same stream (gRPC takes
    one message write at a time)."""
    gave_up = asyncio.Event()

    async def script(start: Start, sink: EventSink) -> None:
        try:
            await sink.output("x" * (48 << 20))
        finally:
            gave_up.set()

    big = [("grpc.max_receive_message_length", 64 << 20)]
    async with serving(ScriptedHarness(script), big, reply_timeout=0.2) as stub:
        host = Host(stub)
        await host.start()
        await asyncio.wait_for(gave_up.wait(), timeout=30)
        event = await host.recv()
        assert event is not None and event.kind == K.EVENT_OUTPUT
        assert len(event.message.parts[0].text.text) == 48 << 20
        end = await host.end()
        assert end.state == "FAILED"
        assert end.error.description == "the host did not accept an event within 0.2 s"
        assert await host.status() == grpc.StatusCode.UNKNOWN


async def test_without_a_hook_the_next_sink_call_hears_the_cancel() -> None:
    recorder = Recorder()
    proceed = asyncio.Event()

    async def effect(sink: EventSink) -> object:
        await sink.output("working")
        async with asyncio.timeout(10):
            await proceed.wait()
        return await model_effect(sink)

    async with serving(ScriptedHarness(recording(recorder, ExecutionCancelledError, effect))) as stub:
        host = Host(stub)
        await host.start()
        await host.recv()
        await host.send(harness_pb2.ControllerFrame(cancel=harness_pb2.Cancel(reason="stop")))
        proceed.set()
        event = await host.recv()  # the model call went out; its reply slot holds the Cancel
        assert event is not None and event.kind == K.EVENT_MODEL_CALL
        end = await host.end()
    assert end.state == "CANCELED" and end.error.description == "stop"
    assert len(recorder.errors) == 1


async def test_without_a_hook_a_busy_run_ends_when_the_host_cuts_the_stream() -> None:
    cancelled = asyncio.Event()

    async def script(start: Start, sink: EventSink) -> None:
        try:
            await sink.output("working")  # inside the try: see the test above
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with serving(ScriptedHarness(script)) as stub:
        host = Host(stub)
        await host.start()
        await host.recv()
        await host.send(harness_pb2.ControllerFrame(cancel=harness_pb2.Cancel(reason="stop")))
        host.call.cancel()  # what this host does once its cancel grace is over
        async with asyncio.timeout(10):
            await cancelled.wait()


async def test_run_failure_ends_failed_with_an_error_status() -> None:
    async def script(start: Start, sink: EventSink) -> None:
        raise ValueError("config is malformed")

    async with serving(ScriptedHarness(script)) as stub:
        host = Host(stub)
        await host.start()
        end = await host.end()
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await host.recv()
    assert end.state == "FAILED" and end.error.description == "config is malformed"
    assert failure.value.code() == grpc.StatusCode.UNKNOWN


async def test_host_closing_while_a_reply_is_awaited_fails_the_call() -> None:
    recorder = Recorder()
    async with serving(ScriptedHarness(failing_then_sticky(recorder, model_effect))) as stub:
        host = Host(stub)
        await host.start()
        await host.recv()
        await host.call.done_writing()
        end = await host.end()
    assert end.state == "FAILED" and "host closed the Connect stream" in end.error.description


async def test_sink_is_closed_after_the_stream_ends() -> None:
    harness = ScriptedHarness(echo_script)
    async with serving(harness) as stub:
        host = Host(stub)
        await host.start("hi")
        event = await host.recv()
        assert event is not None
        await host.send(model_reply(event.model.id, "echo:hi"))
        assert (await host.end()).state == "COMPLETED"
        assert await host.recv() is None
    assert harness.sink is not None
    with pytest.raises(SinkClosedError):
        await harness.sink.output("late")


async def test_the_history_arrives_whole_when_the_harness_reads_it() -> None:
    history = [
        common_pb2.Event(
            execution_id=f"{n:016x}", kind=K.EVENT_INPUT, message=text_message("user", f"turn {n}")
        )
        for n in range(50)
    ]
    seen: list[list[common_pb2.Event]] = []

    async def script(start: Start, sink: EventSink) -> None:
        seen.append(list(start.history))
        await sink.output(f"{len(start.history)} events, last {start.history[-1].message.parts[0].text.text}")

    async with serving(ScriptedHarness(script)) as stub:
        host = Host(stub)
        start = harness_pb2.Start(inputs=[text_message("user", "now")], history=history, config=b"{}")
        await host.send(
            harness_pb2.ControllerFrame(session=SESSION, execution_id=EXECUTION, start=start), stamp=False
        )
        output = await host.recv()
        assert (await host.end()).state == "COMPLETED"
    assert seen == [history]
    assert output is not None and output.message.parts[0].text.text == "50 events, last turn 49"


async def test_a_first_frame_that_does_not_decode_is_refused_with_invalid_argument() -> None:
    harness = ScriptedHarness(echo_script)
    running = await start_server(harness, "127.0.0.1:0", servicer=HarnessServicer(harness))
    try:
        async with grpc.aio.insecure_channel(running.address) as channel:
            connect = channel.stream_stream(
                "/agentsessions.v1.Harness/Connect", response_deserializer=common_pb2.Event.FromString
            )
            call = connect()
            await call.write(b"\x0a\xff\x01")  # field 1 says 255 bytes follow; one does
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await call.read()
    finally:
        await running.stop(None)
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "first frame does not decode" in (failure.value.details() or "")
    assert harness.runs == 0
