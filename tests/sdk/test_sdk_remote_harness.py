"""The host side of Harness.Connect (``RemoteHarness``) against raw harness peers.

Each peer is a hand-written ``agentsessions.v1.Harness`` servicer that plays a script of Events
and records every ControllerFrame it receives; the host side is bridged to the SDK test kit's
scripted host (``agentsessions.sdk.testing``), whose journal shows what reached it. A few tests
wrap that sink to play a host that misbehaves, which the bridge must refuse to relay.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from agentsessions.host.harnesslink import (
    HarnessFailedError,
    HarnessProtocolError,
    HarnessUnavailableError,
    HostSinkError,
    RemoteHarness,
    harness_target,
)
from agentsessions.sdk import Message, ModelCall, ModelResult, ToolError, Usage, convert
from agentsessions.sdk.errors import ApprovalParkedError, ExecutionCancelledError
from agentsessions.sdk.harness import EventSink, Start, text_message
from agentsessions.sdk.testing import HarnessEnvironment, HostTool, ScriptedSink
from agentsessions.v1 import common_pb2, harness_pb2, harness_pb2_grpc
from tests.sdk.receipts import decided_receipts

SESSION = "sess-1"
# The test environment's first execution (its journal is seeded with one earlier INPUT).
EXECUTION = "0000000000000001"
K = common_pb2.EventKind
Code = common_pb2.ToolResult


class Peer:
    """The harness end of one Connect stream, as a script sees it."""

    def __init__(self, frames: AsyncIterator[harness_pb2.ControllerFrame]) -> None:
        self._frames = frames
        self.received: list[harness_pb2.ControllerFrame] = []

    async def recv(self) -> harness_pb2.ControllerFrame | None:
        async with asyncio.timeout(10):
            frame = await anext(self._frames, None)
        if frame is not None:
            self.received.append(frame)
        return frame


PeerScript = Callable[[Peer], AsyncIterator[common_pb2.Event]]


class RawHarness(harness_pb2_grpc.HarnessServicer):
    def __init__(self, script: PeerScript) -> None:
        self.script = script
        self.peers: list[Peer] = []
        self.describe_gate = asyncio.Event()
        self.block_describe = False
        self.describing = asyncio.Event()  # a Describe reached the harness

    async def Describe(
        self, request: harness_pb2.DescribeRequest, context: grpc.aio.ServicerContext
    ) -> harness_pb2.HarnessDescriptor:
        self.describing.set()
        if self.block_describe:
            await self.describe_gate.wait()
        return harness_pb2.HarnessDescriptor(id="raw", version="3")

    async def Connect(
        self, request_iterator: AsyncIterator[harness_pb2.ControllerFrame], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.Event]:
        peer = Peer(aiter(request_iterator))
        self.peers.append(peer)
        async for event in self.script(peer):
            yield event


@contextlib.asynccontextmanager
async def linked(raw: RawHarness, **options: Any) -> AsyncIterator[RemoteHarness]:
    server = grpc.aio.server()
    harness_pb2_grpc.add_HarnessServicer_to_server(raw, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    remote = RemoteHarness(f"127.0.0.1:{port}", **options)
    try:
        yield remote
    finally:
        await remote.close()
        await server.stop(None)


class Raw:
    """Describes itself as the raw peers do, so the test environment can journal executions."""

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return harness_pb2.HarnessDescriptor(id="raw", version="3")

    async def run(self, start: Start, sink: EventSink) -> None:
        raise AssertionError("these tests drive the bridge by hand")


def echo(call: ModelCall) -> ModelResult:
    reply = "echo:" + (call.messages[-1].text() if call.messages else "")
    return ModelResult(Message.assistant(reply), Usage(model="echo", input_tokens=1, output_tokens=2))


def environment(**tools: HostTool) -> HarnessEnvironment:
    history = [common_pb2.Event(kind=K.EVENT_INPUT, message=text_message("user", "before"))]
    return HarnessEnvironment(Raw(), model=echo, tools=tools, journal=history, session=SESSION)


async def begin(env: HarnessEnvironment, *inputs: str) -> tuple[Start, ScriptedSink]:
    return await env.begin(*inputs, config=b'{"k": 1}', resume_from_seq=4)


def journaled(env: HarnessEnvironment) -> list[tuple[str, object]]:
    """What reached the host after the execution's start: (kind, body) per record."""
    out: list[tuple[str, object]] = []
    for e in env.events:
        if e.execution_id == EXECUTION and e.kind not in (K.EVENT_EXECUTION_START, K.EVENT_INPUT):
            body = e.WhichOneof("body")
            out.append((K.Name(e.kind).removeprefix("EVENT_"), getattr(e, body) if body else None))
    return out


class Misreporting:
    """The kit's sink, but answering tool calls with ``receipt`` (a host bug the bridge refuses)."""

    def __init__(
        self,
        sink: ScriptedSink,
        receipt: common_pb2.ToolResult,
        decision: common_pb2.ApprovalResult | None = None,
    ) -> None:
        self._sink = sink
        self._receipt = receipt
        self._decision = decision

    async def model(self, call: common_pb2.ModelCall) -> harness_pb2.ModelResult:
        return await self._sink.model(call)

    async def output(self, text: str) -> None:
        await self._sink.output(text)

    async def tool_call(self, call: common_pb2.ToolCall) -> common_pb2.ToolResult:
        return self._receipt

    async def report(self, result: common_pb2.ToolResult) -> None:
        await self._sink.report(result)

    async def usage(self, usage: common_pb2.Usage) -> None:
        await self._sink.usage(usage)

    def approval_decision(self, tool_call_id: str) -> common_pb2.ApprovalResult | None:
        return self._decision


def event(kind: common_pb2.EventKind.ValueType, **body: object) -> common_pb2.Event:
    return common_pb2.Event(execution_id=EXECUTION, kind=kind, **body)  # type: ignore[arg-type]


def end(state: str = "COMPLETED", description: str = "") -> common_pb2.Event:
    finish = common_pb2.HarnessEnd(state=state)
    if description:
        finish.error.description = description
    return event(K.EVENT_END, end=finish)


def assert_stamped(peer: Peer) -> None:
    for frame in peer.received:
        assert (frame.session, frame.execution_id) == (SESSION, EXECUTION), frame


async def test_echo_turn_is_bridged_to_the_sink() -> None:
    async def script(peer: Peer) -> AsyncIterator[common_pb2.Event]:
        first = await peer.recv()
        assert first is not None and first.WhichOneof("frame") == "start"
        yield event(
            K.EVENT_MODEL_CALL,
            model=common_pb2.ModelCall(model="echo", id="abc123", messages=list(first.start.inputs)),
        )
        reply = await peer.recv()
        assert reply is not None and reply.WhichOneof("frame") == "model"
        yield event(K.EVENT_OUTPUT, message=text_message("assistant", "and more"))
        yield event(K.EVENT_USAGE, usage=common_pb2.Usage(model="echo", output_tokens=9))
        yield end()

    raw = RawHarness(script)
    env = environment()
    async with linked(raw) as remote:
        await remote.run(*await begin(env, "hi"))
    peer = raw.peers[0]
    assert_stamped(peer)
    first, reply = peer.received
    assert list(first.start.inputs) == [text_message("user", "hi")]
    assert first.start.config == b'{"k": 1}' and first.start.resume_from_seq == 4
    assert [e.message for e in first.start.history] == [text_message("user", "before")]
    assert reply.model.model_call_id == "abc123"
    assert reply.model.message == text_message("assistant", "echo:hi")
    assert [kind for kind, _ in journaled(env)] == ["MODEL_CALL", "OUTPUT", "USAGE", "OUTPUT", "USAGE"]
    assert journaled(env)[3] == ("OUTPUT", text_message("assistant", "and more"))
    assert journaled(env)[4] == ("USAGE", common_pb2.Usage(model="echo", output_tokens=9))


async def test_describe_returns_the_descriptor() -> None:
    async with linked(RawHarness(_nothing)) as remote:
        descriptor = await remote.describe()
    assert (descriptor.id, descriptor.version) == ("raw", "3")


async def _nothing(peer: Peer) -> AsyncIterator[common_pb2.Event]:
    await peer.recv()
    return
    yield  # an async generator that emits nothing


async def test_describe_of_an_unreachable_harness_is_unavailable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    remote = RemoteHarness(f"127.0.0.1:{port}")
    try:
        with pytest.raises(HarnessUnavailableError) as failure:
            await remote.describe()
        assert failure.value.code == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(HarnessUnavailableError):
            await remote.run(*await begin(environment(), "hi"))
    finally:
        await remote.close()


async def test_describe_is_bounded() -> None:
    raw = RawHarness(_nothing)
    raw.block_describe = True
    async with linked(raw, describe_timeout=0.05) as remote:
        with pytest.raises(HarnessUnavailableError) as failure:
            await remote.describe()
        raw.describe_gate.set()
    assert failure.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


@pytest.mark.parametrize(
    "kind", [K.EVENT_APPROVAL_REQUEST, K.EVENT_APPROVAL_RESULT, K.EVENT_EXECUTION_START, K.EVENT_PARKED]
)
async def test_host_owned_control_events_are_refused(kind: common_pb2.EventKind.ValueType) -> None:
    async def script(peer: Peer) -> AsyncIterator[common_pb2.Event]:
        await peer.recv()
        yield event(kind)
        yield end()

    env = environment()
    async with linked(RawHarness(script)) as remote:
        with pytest.raises(HarnessProtocolError) as failure:
            await remote.run(*await begin(env, "hi"))
    assert str(failure.value) == f"harness emitted host-owned control event {K.Name(kind)}"
    assert journaled(env) == []


async def test_event_for_another_execution_is_refused() -> None:
    async def script(peer: Peer) -> AsyncIterator[common_pb2.Event]:
        await peer.recv()
        yield common_pb2.Event(
            execution_id="someone-else", kind=K.EVENT_OUTPUT, message=text_message("a", "x")
        )

    env = environment()
    async with linked(RawHarness(script)) as remote:
        with pytest.raises(HarnessProtocolError, match="event execution_id mismatch"):
            await remote.run(*await begin(env, "hi"))
    assert journaled(env) == []


async def test_transport_only_kinds_are_ignored() -> None:
    async def script(peer: Peer) -> AsyncIterator[common_pb2.Event]:
        await peer.recv()
        for kind in (K.EVENT_INPUT, K.EVENT_ERROR, K.EVENT_LIFECYCLE, K.EVENT_KIND_UNSPECIFIED):
            yield event(kind)
        yield end()

    env = environment()
    async with linked(RawHarness(script)) as remote:
        await remote.run(*await begin(env, "hi"))
    assert journaled(env) == []


async def test_eof_without_end_counts_as_completed() -> None:
    async def script(peer: Peer) -> AsyncIterator[common_pb2.Event]:
        await peer.recv()
        yield event(K.EVENT_OUTPUT, message=text_message("assistant", "done"))

    env = environment()
    async with linked(RawHarness(script)) as remote:
        await remote.run(*await begin(env, "hi"))
    assert journaled(env) == [("OUTPUT", text_message("assistant", "done"))]


async def test_end_failed_raises_with_the_description() -> None:
    async def script(peer: Peer) -> AsyncIterator[common_pb2.Event]:
        await peer.recv()
        yield end("FAILED", "the model refused")

    async with linked(RawHarness(script)) as remote:
        with pytest.raises(HarnessFailedError, match="the model refused") as failure:
            await remote.run(*await begin(environment(), "hi"))
    assert str(failure.value) == "remote harness ended FAILED: the model refused"
    assert failure.value.description == "the model refused"


async def test_stream_error_keeps_the_status() -> None:
    async def script(peer: Peer) -> AsyncIterator[common_pb2.Event]:
        await peer.recv()
        raise RuntimeError("harness crashed")
        yield  # an async generator

    async with linked(RawHarness(script)) as remote:
        with pytest.raises(HarnessFailedError) as failure:
            await remote.run(*await begin(environment(), "hi"))
    assert failure.value.code == grpc.StatusCode.UNKNOWN


async def test_mediated_tool_result_answers_the_call_id() -> None:
    call = common_pb2.ToolCall(
        id="t-1", tool="lookup", mediation=common_pb2.MEDIATION_CONTROLLER_MEDIATED, idempotency_key="k"
    )

    async def script(peer: Peer) -> AsyncIterator[common_pb2.Event]:
        await peer.recv()
        yield event(K.EVENT_TOOL_CALL, tool=call)
        await peer.recv()
        yield end()

    forced = RawHarness(script)
    start, sink = await begin(environment())
    async with linked(forced) as remote:
        await remote.run(start, Misreporting(sink, common_pb2.ToolResult(id="executor-chose-this")))
    assert forced.peers[0].received[1].tool == common_pb2.ToolResult(id="t-1"), (
        "the reply answers the call's id"
    )

    raw = RawHarness(script)
    env = environment(lookup=lambda args: {"found": 3})
    async with linked(raw) as remote:
        await remote.run(*await begin(env))
    reply = raw.peers[0].received[1]
    assert reply.WhichOneof("frame") == "tool" and reply.tool.id == "t-1"
    assert convert.dict_from_struct(reply.tool.output) == {"found": 3}
    assert journaled(env) == [("TOOL_CALL", call), ("TOOL_RESULT", reply.tool)]
    assert_stamped(raw.peers[0])


async def test_harness_report_of_a_host_owned_receipt_is_refused() -> None:
    async def script(peer: Peer) -> AsyncIterator[common_pb2.Event]:
        await peer.recv()
        yield event(K.EVENT_TOOL_RESULT, result=common_pb2.ToolResult(id="t-1", code=Code.APPROVAL_DENIED))

    env = environment()
    async with linked(RawHarness(script)) as remote:
        with pytest.raises(HarnessProtocolError, match="host-owned approval receipt"):
            await remote.run(*await begin(env))
    assert journaled(env) == []


APPROVAL_CALL = common_pb2.ToolCall(
    id="c-1", tool="deploy", mediation=common_pb2.MEDIATION_REQUIRES_APPROVAL, idempotency_key="k-1"
)
# The request the kit journals for that call: after the seeded INPUT, EXECUTION_START and TOOL_CALL.
REF = common_pb2.ApprovalRef(execution_id=EXECUTION, tool_call_id="c-1", request_seq=4)


def approval_script(*after_park: common_pb2.Event | None) -> PeerScript:
    """Emit the approval call, expect a park, then send ``after_park`` (None: close)."""

    async def script(peer: Peer) -> AsyncIterator[common_pb2.Event]:
        await peer.recv()
        yield event(K.EVENT_TOOL_CALL, tool=APPROVAL_CALL)
        frame = await peer.recv()
        assert frame is not None and frame.WhichOneof("frame") == "park"
        for item in after_park:
            if item is None:
                return
            yield item

    return script


async def test_park_requires_acknowledgement_then_closure_and_reraises() -> None:
    raw = RawHarness(approval_script(event(K.EVENT_PARKED, parked=REF)))
    env = environment()
    start, sink = await begin(env)
    async with linked(raw) as remote:
        with pytest.raises(ApprovalParkedError) as parked:
            await remote.run(start, sink)
    assert parked.value is sink.parked
    assert env.pending_approval() == REF
    park = raw.peers[0].received[1]
    assert park.park == REF
    assert_stamped(raw.peers[0])


@pytest.mark.parametrize(
    ("after_park", "message"),
    [
        ((end(),), "park acknowledgement correlation mismatch"),
        ((event(K.EVENT_PARKED),), "park acknowledgement correlation mismatch"),
        (
            (
                event(
                    K.EVENT_PARKED, parked=common_pb2.ApprovalRef(execution_id=EXECUTION, tool_call_id="c-1")
                ),
            ),
            "park acknowledgement correlation mismatch",
        ),
        ((None,), "park acknowledgement correlation mismatch"),
        (
            (event(K.EVENT_PARKED, parked=REF), end()),
            "expected stream closure after park acknowledgement, got EVENT_END",
        ),
        (
            (event(K.EVENT_PARKED, parked=REF), event(K.EVENT_OUTPUT, message=text_message("a", "late"))),
            "expected stream closure after park acknowledgement, got EVENT_OUTPUT",
        ),
    ],
    ids=["end-instead", "bare-ack", "wrong-ref", "eof-instead", "extra-end", "late-effect"],
)
async def test_park_handoff_failures(after_park: tuple[common_pb2.Event | None, ...], message: str) -> None:
    env = environment()
    async with linked(RawHarness(approval_script(*after_park))) as remote:
        with pytest.raises(HarnessProtocolError) as failure:
            await remote.run(*await begin(env))
    assert str(failure.value) == message
    assert env.pending_approval() == REF, "the durable request is kept"


async def test_stalled_park_acknowledgement_is_bounded() -> None:
    async def script(peer: Peer) -> AsyncIterator[common_pb2.Event]:
        await peer.recv()
        yield event(K.EVENT_TOOL_CALL, tool=APPROVAL_CALL)
        await peer.recv()
        await peer.recv()  # blocks until the host gives up and cancels the stream

    async with linked(RawHarness(script), ack_timeout=0.05) as remote:
        with pytest.raises(HarnessUnavailableError, match="park acknowledgement"):
            await remote.run(*await begin(environment()))


async def test_a_harness_silent_past_the_event_timeout_is_deadline_exceeded() -> None:
    """Each wait for the harness's next event is bounded: before its first event, and between
    events after a reply (the stream's one timer moves with each wait)."""
    stalls_after = {"start": 0, "model reply": 1}

    for where, events_first in stalls_after.items():

        async def script(peer: Peer, n: int = events_first) -> AsyncIterator[common_pb2.Event]:
            await peer.recv()
            if n:
                yield event(K.EVENT_MODEL_CALL, model=common_pb2.ModelCall(model="echo", id="m1"))
                await peer.recv()  # the model's reply
            await peer.recv()  # blocks until the host gives up and cancels the stream

        env = environment()
        async with linked(RawHarness(script), event_timeout=0.05) as remote:
            with pytest.raises(HarnessUnavailableError, match=r"sent no event within 0\.05 s") as failure:
                await remote.run(*await begin(env))
        assert failure.value.code == grpc.StatusCode.DEADLINE_EXCEEDED, where
        kinds = [kind for kind, _ in journaled(env)]
        assert kinds == (["MODEL_CALL", "OUTPUT", "USAGE"] if events_first else []), where


async def test_a_cancel_of_the_caller_during_a_bounded_wait_stays_a_cancel() -> None:
    """The bound takes back only its own cancel: the caller's cancel of a run waiting on the
    harness is a cancel, not a timeout (tests/host/test_wait_bound.py has the bound's own cases)."""
    reached = asyncio.Event()

    async def script(peer: Peer) -> AsyncIterator[common_pb2.Event]:
        await peer.recv()
        reached.set()
        await peer.recv()  # blocks until the stream is cut
        yield end()

    env = environment()
    async with linked(RawHarness(script)) as remote:
        running = asyncio.create_task(remote.run(*await begin(env)))
        async with asyncio.timeout(10):
            await reached.wait()
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
    loop = asyncio.get_running_loop()
    assert not [h for h in loop._scheduled if not h.cancelled()], "the stream's timer went with it"  # type: ignore[attr-defined]


async def test_approval_without_session_is_refused_before_the_host_sink() -> None:
    env = environment()
    env.session = ""
    async with linked(RawHarness(approval_script())) as remote:
        with pytest.raises(HarnessProtocolError, match="approval requires session and call id"):
            await remote.run(*await begin(env))
    assert journaled(env) == []


def receipt(code: common_pb2.ToolResult.Code.ValueType, is_error: bool) -> common_pb2.ToolResult:
    return common_pb2.ToolResult(
        id="c-1", code=code, is_error=is_error, approval_request_seq=4, approval_decision_seq=5
    )


def decided_script(peer_frames: list[harness_pb2.ControllerFrame]) -> PeerScript:
    """First conversation: park (acknowledged); later ones: the decision and receipt frames."""
    parks = approval_script(event(K.EVENT_PARKED, parked=REF))
    conversations = 0

    async def script(peer: Peer) -> AsyncIterator[common_pb2.Event]:
        nonlocal conversations
        conversations += 1
        if conversations == 1:
            async for item in parks(peer):
                yield item
            return
        await peer.recv()
        yield event(K.EVENT_TOOL_CALL, tool=APPROVAL_CALL)
        for _ in range(2):
            frame = await peer.recv()
            assert frame is not None
            peer_frames.append(frame)
        yield end()

    return script


async def parked_then_decided(
    raw: RawHarness, env: HarnessEnvironment, remote: RemoteHarness, approved: bool, reason: str
) -> tuple[Start, ScriptedSink]:
    with pytest.raises(ApprovalParkedError):
        await remote.run(*await begin(env))
    env.approve(reason, approved=approved)
    return env.begin_resume()


def failing_deploy(args: dict[str, object]) -> object:
    raise ToolError("deploy target is down")


@decided_receipts
async def test_decided_approval_sends_decision_then_receipt(
    approved: bool, code: common_pb2.ToolResult.Code.ValueType, is_error: bool
) -> None:
    frames: list[harness_pb2.ControllerFrame] = []
    raw = RawHarness(decided_script(frames))
    deploy = failing_deploy if code == Code.EXECUTOR_ERROR else (lambda args: {"deployed": True})
    env = environment(deploy=deploy)
    async with linked(raw) as remote:
        await remote.run(*await parked_then_decided(raw, env, remote, approved, "ops said so"))
    approval, tool = frames
    decision = common_pb2.ApprovalResult(
        tool_call_id="c-1", approved=approved, reason="ops said so", request_seq=4
    )
    assert approval.WhichOneof("frame") == "approval" and approval.approval == decision
    assert tool.WhichOneof("frame") == "tool"
    assert (tool.tool.code, tool.tool.is_error) == (code, is_error)
    assert (tool.tool.approval_request_seq, tool.tool.approval_decision_seq) == (4, 5)
    assert_stamped(raw.peers[1])


async def test_decision_is_derived_from_the_receipt_when_the_sink_has_none() -> None:
    frames: list[harness_pb2.ControllerFrame] = []
    raw = RawHarness(decided_script(frames))
    env = environment()
    async with linked(raw) as remote:
        start, sink = await parked_then_decided(raw, env, remote, False, "no")
        await remote.run(start, Misreporting(sink, receipt(Code.APPROVAL_DENIED, True)))
    assert frames[0].approval == common_pb2.ApprovalResult(tool_call_id="c-1", approved=False, request_seq=4)


APPROVED = common_pb2.ApprovalResult(tool_call_id="c-1", approved=True, request_seq=4)


@pytest.mark.parametrize(
    ("answer", "decision"),
    [(common_pb2.ToolResult(id="c-1"), None), (receipt(Code.APPROVAL_DENIED, True), APPROVED)],
    ids=["no-receipt", "conflicting-receipt"],
)
async def test_inconsistent_host_receipts_are_not_sent(
    answer: common_pb2.ToolResult, decision: common_pb2.ApprovalResult | None
) -> None:
    frames: list[harness_pb2.ControllerFrame] = []
    raw = RawHarness(decided_script(frames))
    env = environment(deploy=lambda args: {"deployed": True})
    async with linked(raw) as remote:
        start, sink = await parked_then_decided(raw, env, remote, True, "yes")
        with pytest.raises(HostSinkError):
            await remote.run(start, Misreporting(sink, answer, decision))
    assert [f.WhichOneof("frame") for f in raw.peers[1].received] == ["start"]


async def test_cancel_sends_the_cancel_frame_and_honours_canceled() -> None:
    async def script(peer: Peer) -> AsyncIterator[common_pb2.Event]:
        await peer.recv()
        yield event(K.EVENT_OUTPUT, message=text_message("assistant", "working"))
        frame = await peer.recv()
        assert frame is not None and frame.WhichOneof("frame") == "cancel"
        yield end("CANCELED", frame.cancel.reason)

    raw = RawHarness(script)
    env = environment()
    async with linked(raw) as remote:
        running = asyncio.create_task(remote.run(*await begin(env)))
        async with asyncio.timeout(10):
            await env.journaled(K.EVENT_OUTPUT)
        assert await remote.cancel(EXECUTION, "user pressed stop")
        with pytest.raises(ExecutionCancelledError, match="user pressed stop"):
            await running
    cancel = raw.peers[0].received[1]
    assert cancel.cancel.reason == "user pressed stop"
    assert_stamped(raw.peers[0])


async def test_cancel_cuts_a_harness_that_ignores_it() -> None:
    async def script(peer: Peer) -> AsyncIterator[common_pb2.Event]:
        await peer.recv()
        yield event(K.EVENT_OUTPUT, message=text_message("assistant", "working"))
        await peer.recv()  # the cancel frame, ignored
        await peer.recv()  # blocks until the stream is cut

    env = environment()
    async with linked(RawHarness(script), cancel_grace=0.05) as remote:
        running = asyncio.create_task(remote.run(*await begin(env)))
        async with asyncio.timeout(10):
            await env.journaled(K.EVENT_OUTPUT)
        assert await remote.cancel(EXECUTION, "stop")
        with pytest.raises(ExecutionCancelledError):
            await running
        assert not await remote.cancel(EXECUTION, "again")


async def test_a_describe_cut_by_its_channel_closing_is_unavailable_not_a_cancel() -> None:
    """grpc raises CancelledError from a call whose channel was closed on this side, in a task
    nobody cancelled (the host retires a harness process that went away): that is the harness gone,
    not a cancel of the admission (which would end a caller's Exec CANCELLED, or stop a loop)."""

    async def unused(peer: Peer) -> AsyncIterator[common_pb2.Event]:
        raise AssertionError("no stream is opened")
        yield  # pragma: no cover

    raw = RawHarness(unused)
    raw.block_describe = True
    async with linked(raw) as remote:
        describing = asyncio.create_task(remote.describe())
        async with asyncio.timeout(10):
            await raw.describing.wait()
        await remote.close()
        with pytest.raises(HarnessUnavailableError) as gone:
            await describing
        raw.describe_gate.set()
    assert gone.value.code == grpc.StatusCode.UNAVAILABLE


async def test_a_cancel_before_the_stream_opens_ends_the_run_and_opens_nothing() -> None:
    """The execution is registered as soon as ``run`` is called, before its stream task takes a
    step: a cancel then has no stream to write to (it once failed on an assertion, and the turn ran
    on as if nobody had asked)."""

    async def script(peer: Peer) -> AsyncIterator[common_pb2.Event]:
        await peer.recv()
        yield end("COMPLETED")

    raw = RawHarness(script)
    env = environment()
    async with linked(raw) as remote:
        start, sink = await begin(env)
        running = asyncio.create_task(remote.run(start, sink))
        # One step of the loop: ``run`` registers the execution and creates its stream's task, which
        # has not run yet (asyncio steps ready tasks in order).
        await asyncio.sleep(0)
        assert await remote.cancel(EXECUTION, "stop at once")
        with pytest.raises(ExecutionCancelledError, match="stop at once"):
            await running
        assert not await remote.cancel(EXECUTION, "again")
    assert raw.peers == []


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1:50061",
        "localhost:1",
        "[::1]:8080",
        "dns:///h.example:443",
        "dns://8.8.8.8/h:1",
        "unix:sock",
        "unix:///tmp/h.sock",
    ],
)
def test_accepted_addresses(address: str) -> None:
    assert harness_target(address) == address


@pytest.mark.parametrize(
    "address",
    [
        "",
        "host",
        "host:",
        "host:0",
        "host:70000",
        "http://h:1",
        "dns:h:1",
        "dns:///h",
        "unix:",
        "unix://rel",
        "::1:80",
    ],
)
def test_rejected_addresses(address: str) -> None:
    with pytest.raises(ValueError, match="harness address"):
        harness_target(address)
