"""Harness.Connect fuzzed from the harness's side: a raw harness sends drawn Event frames.

Each example is one turn of a fresh session on the real controller and servicers (loopback gRPC,
memory journal), served by ``tests.support.raw_harness.WireHarness``, which answers the Start
frame with the drawn frames' bytes and returns: well-formed events of any kind with extreme
values (most stamped with the execution's id, so they reach the sink), and broken ones (invalid
UTF-8, truncated, corrupt, random bytes). Whatever the harness sends, the turn ends with a
documented status and an honest journal:

* never UNKNOWN or DATA_LOSS, and never the host's "internal error: <type>" fallback (an
  exception nothing mapped); INTERNAL only as the spec's "harness failed mid-turn", with an ERROR
  record that says why;
* the journal verifies, and the session still answers GetSession;
* nothing is logged with a traceback.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentsessions.host.journal.memory import MemoryStore
from agentsessions.v1 import common_pb2, session_pb2
from tests.fuzz.strategies import messages
from tests.support.host import HostUnderTest, running_host, text_input
from tests.support.raw_harness import WireHarness, start_ids, wire_harness

EXAMPLES = 150
CALL_TIMEOUT_S = 30.0
EVENT = common_pb2.Event.DESCRIPTOR
NEVER = frozenset({grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS})


@dataclass(frozen=True)
class Frame:
    """One drawn frame: an event, whether it carries the execution's id, and how it is broken."""

    event: common_pb2.Event
    stamped: bool
    mutation: str
    at: int
    garbage: bytes

    def encode(self, execution_id: str) -> bytes:
        event = common_pb2.Event()
        event.CopyFrom(self.event)
        if self.stamped:
            event.execution_id = execution_id
        data = event.SerializeToString()
        if self.mutation == "truncate" and data:
            return data[: self.at % len(data)]
        if self.mutation == "flip" and data:
            i = self.at % len(data)
            return data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :]
        if self.mutation == "garbage":
            return self.garbage
        return data


# The events a harness sends, with the body each carries (spec 5.2).
_BODIES = {
    common_pb2.EVENT_MODEL_CALL: "model",
    common_pb2.EVENT_OUTPUT: "message",
    common_pb2.EVENT_TOOL_CALL: "tool",
    common_pb2.EVENT_TOOL_RESULT: "result",
    common_pb2.EVENT_USAGE: "usage",
    common_pb2.EVENT_END: "end",
    common_pb2.EVENT_APPROVAL_REQUEST: "approval",
}


@st.composite
def _events(draw: st.DrawFn) -> common_pb2.Event:
    """Mostly a harness event with its own body (drawn with extreme values); sometimes anything."""
    if draw(st.integers(0, 5)) == 0:
        anything = draw(messages(EVENT))
        assert isinstance(anything, common_pb2.Event)
        return anything
    kind = draw(st.sampled_from(sorted(_BODIES)))
    body = _BODIES[kind]
    event = common_pb2.Event(kind=kind)
    field = EVENT.fields_by_name[body]
    assert field.message_type is not None
    getattr(event, body).CopyFrom(draw(messages(field.message_type)))
    if kind == common_pb2.EVENT_END and draw(st.booleans()):
        event.end.state = draw(st.sampled_from(["COMPLETED", "FAILED", "CANCELED", ""]))
    return event


@st.composite
def frames(draw: st.DrawFn) -> Frame:
    return Frame(
        draw(_events()),
        stamped=draw(st.integers(0, 9)) > 0,
        mutation=draw(st.sampled_from(["none"] * 6 + ["truncate", "flip", "garbage"])),
        at=draw(st.integers(0, 10_000)),
        garbage=draw(st.binary(min_size=1, max_size=48)),
    )


class _Tracebacks(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info or "Traceback" in record.getMessage():
            self.seen.append(f"{record.name}: {record.getMessage()}")


@pytest.fixture
def tracebacks() -> Iterator[_Tracebacks]:
    handler = _Tracebacks()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)


async def _turn(host: HostUnderTest, wire: WireHarness, drawn: list[Frame]) -> None:
    wire.script = lambda start: [f.encode(start_ids(start)[1]) for f in drawn]
    created = await host.sessions.CreateSession(
        session_pb2.CreateSessionRequest(session=session_pb2.Session(harness="wire")), timeout=CALL_TIMEOUT_S
    )
    uid = created.metadata.uid
    code, details = grpc.StatusCode.OK, ""
    try:
        async for _ in host.sessions.Exec(
            session_pb2.ExecRequest(session=uid, inputs=[text_input("go")]), timeout=CALL_TIMEOUT_S
        ):
            pass
    except grpc.aio.AioRpcError as exc:
        code, details = exc.code(), exc.details() or ""
    assert code not in NEVER, f"{code.name}: {details}"
    assert not details.startswith("internal error"), f"an unmapped exception: {details}"
    records = await host.store.read(uid)
    if code == grpc.StatusCode.INTERNAL:
        last = records[-1].event
        assert last.kind == common_pb2.EVENT_ERROR, f"INTERNAL without an ERROR record: {details}"
        assert last.error.description, "an ERROR record must say why"
        assert "with OK" not in last.error.description
    assert await host.store.verify(uid) == len(records)
    got = await host.sessions.GetSession(session_pb2.GetSessionRequest(uid=uid), timeout=CALL_TIMEOUT_S)
    assert got.last_seq == len(records)


@pytest.mark.e2e
def test_no_harness_frame_gets_an_undocumented_status(tracebacks: _Tracebacks) -> None:
    wire = WireHarness(lambda start: [])
    stack = AsyncExitStack()

    async def up() -> HostUnderTest:
        address = await stack.enter_async_context(wire_harness(wire))
        return await stack.enter_async_context(running_host(MemoryStore(), remote={"wire": address}))

    with asyncio.Runner() as runner:
        host = runner.run(up())
        try:

            @settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
            @given(drawn=st.lists(frames(), max_size=5))
            def case(drawn: list[Frame]) -> None:
                runner.run(_turn(host, wire, drawn))

            case()
        finally:
            runner.run(stack.aclose())
    assert tracebacks.seen == [], "the host logged tracebacks:\n" + "\n".join(tracebacks.seen[:3])
