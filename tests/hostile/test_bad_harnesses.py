"""Harnesses that misdescribe themselves or send frames the host cannot journal (issue #15).

Each harness is a real gRPC server on loopback answering with the exact bytes a test chooses
(``tests.support.raw_harness.WireHarness``). A harness that misdescribes itself is refused with
FAILED_PRECONDITION before anything is journaled; a frame the journal cannot hold fails the turn
with an ERROR record that says why (never an empty description), and the session stays usable.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable

import grpc
import pytest
from google.protobuf import struct_pb2

from agentsessions.host import harnesslink
from agentsessions.host.journal.memory import MemoryStore
from agentsessions.host.limits import MAX_READABLE_BYTES
from agentsessions.v1 import common_pb2, harness_pb2, session_pb2
from tests.support.host import HostUnderTest, running_host, text_input
from tests.support.raw_harness import WireHarness, start_ids, wire_harness

K = common_pb2


def kinds(records: list[common_pb2.LogRecord]) -> list[str]:
    return [K.EventKind.Name(r.event.kind).removeprefix("EVENT_") for r in records]


def _frames(*events: common_pb2.Event) -> Callable[[bytes], list[bytes]]:
    """A script sending ``events`` stamped with the execution's id."""

    def script(start: bytes) -> list[bytes]:
        _, execution_id = start_ids(start)
        out = []
        for event in events:
            stamped = common_pb2.Event()
            stamped.CopyFrom(event)
            stamped.execution_id = execution_id
            out.append(stamped.SerializeToString())
        return out

    return script


def _end() -> common_pb2.Event:
    return common_pb2.Event(kind=K.EVENT_END, end=common_pb2.HarnessEnd(state="COMPLETED"))


@pytest.fixture
def wire() -> WireHarness:
    return WireHarness(_frames(_end()))


@pytest.fixture
async def host(wire: WireHarness) -> AsyncIterator[HostUnderTest]:
    async with wire_harness(wire) as address, running_host(MemoryStore(), remote={"wire": address}) as h:
        yield h


async def _session(host: HostUnderTest) -> str:
    created = await host.sessions.CreateSession(
        session_pb2.CreateSessionRequest(session=session_pb2.Session(harness="wire"))
    )
    return str(created.metadata.uid)


async def _exec(
    host: HostUnderTest, uid: str, text: str = "hi"
) -> tuple[list[session_pb2.ExecUpdate], grpc.StatusCode, str]:
    frames: list[session_pb2.ExecUpdate] = []
    try:
        async for update in host.sessions.Exec(
            session_pb2.ExecRequest(session=uid, inputs=[text_input(text)]), timeout=60
        ):
            frames.append(update)
    except grpc.aio.AioRpcError as exc:
        return frames, exc.code(), exc.details() or ""
    return frames, grpc.StatusCode.OK, ""


def _descriptor(**fields: object) -> bytes:
    return harness_pb2.HarnessDescriptor(**fields).SerializeToString()  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("describe", "named"),
    [
        # HarnessDescriptor.id (field 1) holding bytes that are not UTF-8.
        (b"\x0a\x02\xc3\x28", "do not decode as agentsessions.v1.HarnessDescriptor: id: invalid UTF-8"),
        (_descriptor(version="1"), "without an id"),
        (
            _descriptor(id="wire", capabilities=harness_pb2.Capabilities(resumability=7)),  # type: ignore[arg-type]
            "declares resumability 7, which this host does not know",
        ),
    ],
    ids=["undecodable", "empty-id", "unknown-resumability"],
)
async def test_a_harness_that_misdescribes_itself_is_a_failed_precondition(
    host: HostUnderTest, wire: WireHarness, describe: bytes, named: str
) -> None:
    uid = await _session(host)
    wire.describe = describe
    frames, code, details = await _exec(host, uid)
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert named in details
    assert [f.WhichOneof("update") for f in frames] == ["session"]  # the admission frame only
    assert await host.store.read(uid) == [], "nothing is journaled for a harness that cannot be placed"
    assert wire.starts == []


async def test_an_undecodable_connect_frame_records_an_error_saying_why(
    host: HostUnderTest, wire: WireHarness
) -> None:
    uid = await _session(host)
    # Event.execution_id is field 2: bytes that are not UTF-8.
    wire.script = lambda start: [b"\x12\x02\xc3\x28"]
    _, code, details = await _exec(host, uid)
    assert code == grpc.StatusCode.INTERNAL  # spec 1.1 Exec 8: the harness failed mid-turn
    records = await host.store.read(uid)
    assert kinds(records) == ["EXECUTION_START", "INPUT", "ERROR"]
    description = records[-1].event.error.description
    assert "does not decode as agentsessions.v1.Event: execution_id: invalid UTF-8" in description
    assert "does not decode" in details
    # The session is still usable once the harness behaves.
    wire.script = _frames(_end())
    _, code, _ = await _exec(host, uid, "again")
    assert code == grpc.StatusCode.OK
    assert kinds(await host.store.read(uid))[-1] == "END"
    assert await host.store.verify(uid) == len(await host.store.read(uid))


class AfterTheHarnessReturned:
    """Echoes, once the harness's Connect handler has returned: the reply then goes to a stream
    that is over."""

    def __init__(self, wire: WireHarness) -> None:
        self.wire = wire

    async def complete(self, call: common_pb2.ModelCall, on_delta: object = None) -> harness_pb2.ModelResult:
        async with asyncio.timeout(30):
            await self.wire.returned.wait()
        text = common_pb2.Part(text=common_pb2.TextPart(text="late"))
        return harness_pb2.ModelResult(message=common_pb2.Message(role="assistant", parts=[text]))


async def test_a_harness_that_returns_before_its_reply_fails_the_turn_saying_so() -> None:
    wire = WireHarness(
        _frames(common_pb2.Event(kind=K.EVENT_MODEL_CALL, model=common_pb2.ModelCall(model="m")))
    )
    async with (
        wire_harness(wire) as address,
        running_host(MemoryStore(), remote={"wire": address}, model=AfterTheHarnessReturned(wire)) as host,
    ):
        uid = await _session(host)
        _, code, details = await _exec(host, uid)
        records = await host.store.read(uid)
        if code == grpc.StatusCode.OK:
            # The reply was written before the stream's end reached the host: EOF without END
            # then reads as completed, as the reference host treats it.
            assert kinds(records)[-1] == "END"
            return
        assert code == grpc.StatusCode.INTERNAL
        assert "ended the stream mid-turn, while the host was sending it a frame" in details
        description = records[-1].event.error.description
        assert kinds(records)[-1] == "ERROR" and "mid-turn" in description
        assert "with OK" not in description


def test_a_stream_closed_mid_turn_says_so() -> None:
    # The link's wording when a write finds the harness's stream already ended with OK.
    error = harnesslink._status_error(grpc.StatusCode.OK, "", "127.0.0.1:1")
    assert isinstance(error, harnesslink.HarnessProtocolError)
    assert str(error) == (
        "harness at 127.0.0.1:1 closed the stream mid-turn, before the host's reply was delivered"
    )
    assert "with OK" not in str(error)
    failed = harnesslink._status_error(grpc.StatusCode.ABORTED, "", "127.0.0.1:1")
    assert str(failed) == "harness at 127.0.0.1:1 ended the stream with ABORTED: no details"
    writing = harnesslink._status_error(
        grpc.StatusCode.INTERNAL, "Internal error from Core", "h:1", writing=True
    )
    assert str(writing) == (
        "harness at h:1 ended the stream mid-turn, while the host was sending it a frame "
        "(INTERNAL: Internal error from Core)"
    )


async def test_negative_token_counts_are_refused(host: HostUnderTest, wire: WireHarness) -> None:
    uid = await _session(host)
    usage = common_pb2.Usage(model="m", input_tokens=5, output_tokens=-3)
    wire.script = _frames(common_pb2.Event(kind=K.EVENT_USAGE, usage=usage), _end())
    _, code, details = await _exec(host, uid)
    assert code == grpc.StatusCode.INTERNAL
    records = await host.store.read(uid)
    assert kinds(records) == ["EXECUTION_START", "INPUT", "ERROR"], "the USAGE was not journaled"
    assert (
        "usage.output_tokens: a token count must not be negative, got -3"
        in records[-1].event.error.description
    )
    assert "output_tokens" in details


@pytest.mark.parametrize("number", [math.nan, math.inf], ids=["nan", "inf"])
async def test_nan_in_a_harnesss_tool_args_fails_the_turn_cleanly(
    host: HostUnderTest, wire: WireHarness, number: float
) -> None:
    uid = await _session(host)
    args = struct_pb2.Struct()
    args.update({"path": "a.txt", "weights": [1.0, number]})
    call = common_pb2.ToolCall(
        id="t1", tool="note", args=args, mediation=K.MEDIATION_CONTROLLER_MEDIATED, idempotency_key="k1"
    )
    wire.script = _frames(common_pb2.Event(kind=K.EVENT_TOOL_CALL, tool=call), _end())
    _, code, details = await _exec(host, uid)
    assert code == grpc.StatusCode.INTERNAL
    assert "internal error" not in details, "a typed refusal, not an unexpected exception"
    records = await host.store.read(uid)
    assert kinds(records) == ["EXECUTION_START", "INPUT", "ERROR"], "the TOOL_CALL was not journaled"
    description = records[-1].event.error.description
    assert "weights[1]" in description and "JSON" in description


@pytest.mark.parametrize("number", [math.nan, -math.inf], ids=["nan", "-inf"])
async def test_nan_in_a_reported_tool_result_fails_the_turn_cleanly(
    host: HostUnderTest, wire: WireHarness, number: float
) -> None:
    uid = await _session(host)
    output = struct_pb2.Struct()
    output.update({"score": number})
    report = common_pb2.ToolResult(id="t1", output=output)
    wire.script = _frames(common_pb2.Event(kind=K.EVENT_TOOL_RESULT, result=report), _end())
    _, code, details = await _exec(host, uid)
    assert code == grpc.StatusCode.INTERNAL
    assert "internal error" not in details
    records = await host.store.read(uid)
    assert kinds(records) == ["EXECUTION_START", "INPUT", "ERROR"], "the TOOL_RESULT was not journaled"
    description = records[-1].event.error.description
    assert "TOOL_RESULT record cannot be journaled: result.output.score: " in description
    assert description.endswith("is not a JSON number (the journal hashes JSON)")


async def test_a_harness_output_over_the_record_limit_fails_the_turn_and_stays_readable(
    host: HostUnderTest, wire: WireHarness
) -> None:
    uid = await _session(host)
    big = common_pb2.Message(
        role="assistant", parts=[common_pb2.Part(text=common_pb2.TextPart(text="x" * 6_000_000))]
    )
    wire.script = _frames(common_pb2.Event(kind=K.EVENT_OUTPUT, message=big), _end())
    _, code, details = await _exec(host, uid)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"--max-record-bytes {MAX_READABLE_BYTES}" in details
    records = await host.store.read(uid)
    assert kinds(records) == ["EXECUTION_START", "INPUT", "ERROR"]
    assert "exceeds the record size limit" in records[-1].event.error.description
    # A client on gRPC's default 4 MiB limit still reads the whole session back.
    async with grpc.aio.insecure_channel(host.address) as default_client:
        replay = default_client.unary_stream(
            "/agentsessions.v1.Sessions/Replay",
            request_serializer=session_pb2.ReplayRequest.SerializeToString,
            response_deserializer=common_pb2.LogRecord.FromString,
        )
        assert [r.seq async for r in replay(session_pb2.ReplayRequest(session=uid))] == [1, 2, 3]
    wire.script = _frames(_end())
    _, code, _ = await _exec(host, uid, "again")
    assert code == grpc.StatusCode.OK
