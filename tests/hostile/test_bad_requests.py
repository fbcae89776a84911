"""Requests a client can send that once answered UNKNOWN (issue #15, item 1), one test each.

Every case is sent as raw bytes over a real loopback channel, the way a buggy or hostile client
sends it, and must answer INVALID_ARGUMENT naming the field and the rule before anything is
written (no session row, no record), with no traceback in the host's log.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator

import grpc
import pytest
from google.protobuf import struct_pb2

from agentsessions.host import protowire
from agentsessions.host.journal import encode_page_token, open_store
from agentsessions.host.journal.memory import MemoryStore
from agentsessions.host.recordable import MAX_STRUCT_DEPTH
from agentsessions.v1 import common_pb2, session_pb2
from tests.support.host import HostUnderTest, running_host, text_input

SESSIONS = "/agentsessions.v1.Sessions/"


@pytest.fixture
async def host() -> AsyncIterator[HostUnderTest]:
    async with running_host(MemoryStore()) as h:
        yield h


@pytest.fixture
def tracebacks(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


def _logged_tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]


async def _unary(host: HostUnderTest, method: str, data: bytes) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.channel.unary_unary(SESSIONS + method)(data, timeout=30)
    return err.value


async def _stream(host: HostUnderTest, method: str, data: bytes) -> tuple[list[bytes], grpc.aio.AioRpcError]:
    frames: list[bytes] = []
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for frame in host.channel.unary_stream(SESSIONS + method)(data, timeout=30):
            frames.append(frame)
    return frames, err.value


async def _nothing_written(host: HostUnderTest) -> None:
    assert await host.store.session_uids() == []


def _deep_value(levels: int) -> struct_pb2.Value:
    """A JSON object nested ``levels`` objects deep."""
    top = struct_pb2.Value()
    current = top
    for _ in range(levels):
        current = current.struct_value.fields["a"]
    current.number_value = 1
    return top


def _data_input(value: struct_pb2.Value) -> common_pb2.Message:
    message = common_pb2.Message(role="user")
    message.parts.add().data.data.fields["x"].CopyFrom(value)
    return message


async def test_invalid_utf8_in_a_string_field_names_the_field(
    host: HostUnderTest, tracebacks: pytest.LogCaptureFixture
) -> None:
    # GetSessionRequest.uid (field 1) holding the bytes C3 28, which are not UTF-8.
    err = await _unary(host, "GetSession", b"\x0a\x02\xc3\x28")
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == "uid: invalid UTF-8 in a string field"
    nested = session_pb2.CreateSessionRequest(session=session_pb2.Session(model="gpt-x")).SerializeToString()
    err = await _unary(host, "CreateSession", nested.replace(b"gpt-x", b"\xff\xfe\xfd\xfc\xfb"))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == "session.model: invalid UTF-8 in a string field"
    await _nothing_written(host)
    assert _logged_tracebacks(tracebacks) == []


async def test_a_truncated_or_corrupt_message_is_invalid_argument(
    host: HostUnderTest, tracebacks: pytest.LogCaptureFixture
) -> None:
    whole = session_pb2.ExecRequest(inputs=[text_input("hello there")]).SerializeToString()
    frames, err = await _stream(host, "Exec", whole[:-3])
    assert frames == []
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("inputs[0]") and "truncated" in err.details()
    err = await _unary(host, "ListSessions", b"\x0f\xff")  # wire type 7 does not exist
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    await _nothing_written(host)
    assert _logged_tracebacks(tracebacks) == []


async def test_struct_nesting_past_the_parsers_limit_names_the_field(
    host: HostUnderTest, tracebacks: pytest.LogCaptureFixture
) -> None:
    # 40 nested objects are ~120 nested messages: the protobuf runtime refuses to decode them.
    deep = _data_input(_deep_value(40)).SerializeToString()
    # ExecRequest.inputs (field 2) by hand: the runtime will not copy a message this deep.
    frames, err = await _stream(host, "Exec", b"\x12" + protowire.varint(len(deep)) + deep)
    assert frames == []
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("inputs[0].parts[0].data.data")
    assert "nested deeper than 100 messages" in err.details()
    await _nothing_written(host)
    assert _logged_tracebacks(tracebacks) == []


async def test_struct_nesting_the_parser_accepts_is_still_bounded(host: HostUnderTest) -> None:
    # Decodes here, but would not decode inside a harness's Start.history: refused by rule.
    request = session_pb2.ExecRequest(inputs=[_data_input(_deep_value(MAX_STRUCT_DEPTH + 5))])
    frames, err = await _stream(host, "Exec", request.SerializeToString())
    assert frames == []
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("inputs[0].parts[0].data.data.x.a")
    assert err.details().endswith(f"JSON values nest deeper than {MAX_STRUCT_DEPTH} levels")
    await _nothing_written(host)


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
async def test_nan_and_infinity_in_an_input_are_refused_before_any_frame(
    host: HostUnderTest, tracebacks: pytest.LogCaptureFixture, number: float
) -> None:
    value = struct_pb2.Value()
    value.list_value.values.add().number_value = 1
    value.list_value.values.add().number_value = number
    request = session_pb2.ExecRequest(inputs=[text_input("first"), _data_input(value)])
    frames, err = await _stream(host, "Exec", request.SerializeToString())
    assert frames == []
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("inputs[1].parts[0].data.data.x[1]: ")
    assert "is not a JSON number" in err.details()
    await _nothing_written(host)
    assert _logged_tracebacks(tracebacks) == []


async def test_a_page_token_past_int64_is_not_a_token_this_host_issued(
    host: HostUnderTest, tracebacks: pytest.LogCaptureFixture
) -> None:
    for nanos in (2**63, 2**64 + 5, 10**30):
        token = encode_page_token(nanos, "sess-x")
        request = session_pb2.ListSessionsRequest(page_token=token).SerializeToString()
        err = await _unary(host, "ListSessions", request)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.details() == "page_token: is not a token this host issued"
    assert _logged_tracebacks(tracebacks) == []


async def test_replay_from_the_largest_seq_is_an_empty_stream(
    host: HostUnderTest, tracebacks: pytest.LogCaptureFixture
) -> None:
    done = [u async for u in host.sessions.Exec(session_pb2.ExecRequest(inputs=[text_input("hi")]))]
    uid = done[0].session.metadata.uid
    for from_seq, to_seq in ((2**63 - 1, 0), (2**63 - 1000, 0), (2**63 - 2, 2**63 - 1), (1, 2**63 - 1)):
        request = session_pb2.ReplayRequest(session=uid, from_seq=from_seq, to_seq=to_seq)
        got = [r async for r in host.sessions.Replay(request)]
        # Spec: Replay reads from_seq..to_seq; past the head there is nothing to read.
        assert [r.seq for r in got] == ([] if from_seq > 1 else [r.seq for r in await host.store.read(uid)])
    assert _logged_tracebacks(tracebacks) == []


# -- NUL characters: PostgreSQL's text and jsonb hold none ------------------------------------


@pytest.fixture
async def pg_host(pg_url: str) -> AsyncIterator[HostUnderTest]:
    store = await open_store(pg_url)
    try:
        async with running_host(store) as h:
            yield h
    finally:
        await store.close()


@pytest.mark.postgres
async def test_a_nul_in_a_map_value_uid_or_page_token_is_invalid_argument_on_postgres(
    pg_host: HostUnderTest, tracebacks: pytest.LogCaptureFixture
) -> None:
    CONTROL = "uid: must not contain control characters"
    # These once reached PostgreSQL and answered INTERNAL (text and jsonb refuse U+0000); the
    # rule is the host's, so every store answers the same.
    cases = [
        (
            "CreateSession",
            session_pb2.CreateSessionRequest(session=session_pb2.Session(labels={"k": "a\x00b"})),
            "session.labels['k']: value must not contain NUL (U+0000)",
        ),
        (
            "CreateSession",
            session_pb2.CreateSessionRequest(session=session_pb2.Session(annotations={"note": "\x00"})),
            "session.annotations['note']: value must not contain NUL (U+0000)",
        ),
        ("GetSession", session_pb2.GetSessionRequest(uid="sess\x00x"), CONTROL),
        ("DeleteSession", session_pb2.DeleteSessionRequest(uid="\x00"), CONTROL),
        (
            "ListSessions",
            session_pb2.ListSessionsRequest(page_token=encode_page_token(1, "a\x00b")),
            "page_token: is not a token this host issued",
        ),
    ]
    for method, request, details in cases:
        err = await _unary(pg_host, method, request.SerializeToString())
        assert (method, err.code(), err.details()) == (method, grpc.StatusCode.INVALID_ARGUMENT, details)
    frames, err = await _stream(
        pg_host, "Replay", session_pb2.ReplayRequest(session="a\x00").SerializeToString()
    )
    assert (frames, err.code(), err.details()) == (
        [],
        grpc.StatusCode.INVALID_ARGUMENT,
        "session: must not contain control characters",
    )
    await _nothing_written(pg_host)
    assert _logged_tracebacks(tracebacks) == []
