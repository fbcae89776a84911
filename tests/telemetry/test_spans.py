"""Traces and metrics of real turns over gRPC, read from the SDK's in-memory exporter and reader:
the span tree of an echo turn, GenAI attributes, the trace context joining a client and a remote
harness, tool spans, metrics, and no payload text anywhere in spans."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from agentsessions.client import SessionsClient
from agentsessions.harnesses.echo import EchoHarness
from agentsessions.host.config import HostConfig
from agentsessions.host.controller import writer
from agentsessions.host.tools.executor import ToolContext
from agentsessions.sdk.server import start_server
from agentsessions.v1 import session_pb2
from tests.approvals.harnesses import ToolHarness
from tests.support.serving import serving
from tests.telemetry.conftest import Telemetry

SECRET = "classified-payload-7d1e"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN_ID = "00f067aa0ba902b7"


def stamp(args: dict[str, Any], context: ToolContext) -> str:
    """A host-run tool for the tool span test: answers with its argument (payload!)."""
    return f"stamped {args.get('text', '')}"


def named(spans: Iterable[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def one(spans: Iterable[ReadableSpan], name: str) -> ReadableSpan:
    (span,) = named(spans, name)
    return span


def children(spans: Iterable[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    parent_id = parent.context.span_id
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent_id]


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def assert_no_payload(spans: Iterable[ReadableSpan], *texts: str) -> None:
    for span in spans:
        seen = json.dumps([span.name, attrs(span), [dict(e.attributes or {}) for e in span.events]])
        for text in texts:
            assert text not in seen, f"span {span.name!r} carries payload text {text!r}: {seen}"
        assert span.status.description in (None, "")


async def run_turn(address: str, harness: str = "echo", **exec_options: Any) -> list[session_pb2.ExecUpdate]:
    async with SessionsClient.connect(address) as client:
        uid = (await client.create_session(harness=harness)).metadata.uid
        return [u async for u in client.exec(uid, SECRET, **exec_options)]


async def test_echo_turn_span_tree_without_payloads(
    telemetry: Telemetry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer, "SOON_LINGER_S", 60.0)  # the OUTPUT waits for the END, however slow
    async with serving(HostConfig(listen="127.0.0.1:0", journal="memory:")) as (address,):
        updates = await run_turn(address)
    uid = updates[0].session.metadata.uid
    spans = telemetry.finished()

    create = one(spans, "agentsessions.v1.Sessions/CreateSession")
    exec_span = one(spans, "agentsessions.v1.Sessions/Exec")
    assert exec_span.kind == SpanKind.SERVER and create.kind == SpanKind.SERVER
    assert attrs(exec_span) | {"agentsessions.request_id": "-"} == {
        "rpc.system.name": "grpc",
        "rpc.method": "agentsessions.v1.Sessions/Exec",
        "rpc.response.status_code": "OK",
        "agentsessions.request_id": "-",
    }
    turn = one(spans, "invoke_agent echo")
    assert turn.parent is not None and turn.parent.span_id == exec_span.context.span_id
    assert attrs(turn) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "echo",
        "gen_ai.conversation.id": uid,
        "agentsessions.session": uid,
        "agentsessions.execution_id": updates[1].record.event.execution_id,
        "agentsessions.turn.outcome": "completed",
    }
    # EXECUTION_START and the INPUT are journaled at admission, beside the turn, under the RPC.
    (admission,) = [s for s in children(spans, exec_span) if s.name == "journal.append"]
    assert attrs(admission)["agentsessions.journal.records"] == 2
    assert attrs(admission)["agentsessions.journal.last_seq"] == 2

    under_turn = sorted(children(spans, turn), key=lambda s: s.start_time or 0)
    # The model call, then its MODEL_CALL, the OUTPUT and the END in one append.
    assert [s.name for s in under_turn] == ["chat echo", "journal.append"]
    assert [attrs(s).get("agentsessions.journal.last_seq") for s in under_turn] == [None, 5]
    assert attrs(under_turn[1])["agentsessions.journal.records"] == 3
    chat = under_turn[0]
    assert chat.kind == SpanKind.CLIENT
    assert attrs(chat) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "echo",
        "gen_ai.request.model": "echo",
    }
    assert {s.context.trace_id for s in [exec_span, turn, *under_turn]} == {exec_span.context.trace_id}
    assert_no_payload(spans, SECRET, "echo:" + SECRET)


async def test_a_callers_traceparent_parents_the_rpc_span(telemetry: Telemetry) -> None:
    traceparent = f"00-{TRACE_ID}-{CLIENT_SPAN_ID}-01"
    config = HostConfig(listen="127.0.0.1:0", journal="memory:")
    metadata = (("traceparent", traceparent),)
    async with serving(config) as (address,), SessionsClient.connect(address, metadata=metadata) as client:
        await client.create_session()
    create = one(telemetry.finished(), "agentsessions.v1.Sessions/CreateSession")
    assert create.parent is not None
    assert (format(create.context.trace_id, "032x"), format(create.parent.span_id, "016x")) == (
        TRACE_ID,
        CLIENT_SPAN_ID,
    )


async def test_a_remote_harness_joins_the_turn_over_connect_metadata(telemetry: Telemetry) -> None:
    harness = await start_server(EchoHarness(), "127.0.0.1:0")
    try:
        config = HostConfig(listen="127.0.0.1:0", journal="memory:", harnesses=[("remote", harness.address)])
        async with serving(config) as (address,):
            updates = await run_turn(address, "remote")
    finally:
        await harness.stop(None)
    spans = telemetry.finished()
    turn = one(spans, "invoke_agent remote")
    connect = one(spans, "agentsessions.v1.Harness/Connect")
    assert connect.kind == SpanKind.SERVER
    assert connect.parent is not None and connect.parent.span_id == turn.context.span_id
    assert connect.context.trace_id == turn.context.trace_id
    assert attrs(connect)["agentsessions.execution_id"] == updates[1].record.event.execution_id
    assert attrs(connect)["agentsessions.run.outcome"] == "returned"
    chat = one(spans, "chat echo")
    assert chat.parent is not None and chat.parent.span_id == turn.context.span_id
    assert_no_payload(spans, SECRET, "echo:" + SECRET)


async def test_host_run_tools_are_execute_tool_spans(telemetry: Telemetry) -> None:
    tooler = await start_server(ToolHarness(), "127.0.0.1:0")
    config_json = json.dumps({"calls": [{"mediation": "mediated", "tool": "stamp"}]}).encode()
    try:
        config = HostConfig(
            listen="127.0.0.1:0",
            journal="memory:",
            harnesses=[("tooler", tooler.address)],
            tool_executors=[f"python:{__name__}:stamp"],
        )
        async with serving(config) as (address,):
            updates = await run_turn(address, "tooler", config=config_json)
    finally:
        await tooler.stop(None)
    spans = telemetry.finished()
    turn = one(spans, "invoke_agent tooler")
    tool = one(spans, "execute_tool stamp")
    assert tool.parent is not None and tool.parent.span_id == turn.context.span_id
    call_id = next(u.record.event.tool.id for u in updates if u.record.event.HasField("tool"))
    assert attrs(tool) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "stamp",
        "gen_ai.tool.call.id": call_id,
        "agentsessions.session": updates[0].session.metadata.uid,
        "agentsessions.tool.is_error": False,
    }
    assert_no_payload(spans, SECRET, "stamped")


async def test_a_failed_turn_is_an_error_span_naming_only_the_error_type(telemetry: Telemetry) -> None:
    # The harness asks for a host tool nobody serves: the turn fails (FAILED_PRECONDITION).
    tooler = await start_server(ToolHarness(), "127.0.0.1:0")
    config_json = json.dumps({"calls": [{"mediation": "mediated", "tool": "absent"}]}).encode()
    try:
        config = HostConfig(listen="127.0.0.1:0", journal="memory:", harnesses=[("tooler", tooler.address)])
        async with serving(config) as (address,):
            try:
                await run_turn(address, "tooler", config=config_json)
            except grpc.aio.AioRpcError as exc:
                failure = exc
            else:
                raise AssertionError("the turn was expected to fail")
    finally:
        await tooler.stop(None)
    spans = telemetry.finished()
    turn = one(spans, "invoke_agent tooler")
    assert turn.status.status_code == StatusCode.ERROR
    assert attrs(turn)["agentsessions.turn.outcome"] == "failed"
    assert attrs(turn)["error.type"]
    exec_span = one(spans, "agentsessions.v1.Sessions/Exec")
    assert attrs(exec_span)["rpc.response.status_code"] == failure.code().name
    # Error messages stay out of spans (they may quote what the turn was doing).
    assert_no_payload(spans, SECRET, failure.details() or "?")
