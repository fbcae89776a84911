"""Host-run tool calls over the real wire (spec 4.1 I3, 4.7, 5.3; 6.1 tool tests).

A CONTROLLER_MEDIATED call is journaled before its executor runs; calls the host must not run
(no idempotency key, unmediated, non-JSON-shaped arguments) are refused before anything about
them is journaled; a harness cannot report a receipt only the host may write.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import grpc
import pytest
from google.protobuf import struct_pb2

from agentsessions.host.journal.store import JournalStore
from agentsessions.sdk import EventSink, Start
from agentsessions.sdk.errors import SinkError
from agentsessions.v1 import common_pb2, harness_pb2
from tests.approvals.calls import (
    StampTool,
    config,
    get,
    journal,
    kinds,
    new_session,
    outputs,
    receipts_seen,
    records,
    say,
)
from tests.approvals.harnesses import ToolHarness
from tests.approvals.raw_peer import Conversation, Script, raw_peer, tool_call_event
from tests.support.harnesses import descriptor
from tests.support.host import counting_ids, running_host
from tests.support.processes import HarnessProcess

K = common_pb2.EventKind
MEDIATED = common_pb2.MEDIATION_CONTROLLER_MEDIATED


async def test_mediated_call_is_journaled_before_the_executor_runs(
    store: JournalStore, tooler_process: HarnessProcess
) -> None:
    stamp = StampTool(store)
    async with running_host(
        store, remote={"tooler": tooler_process.address}, tools=stamp.registry(), new_id=counting_ids()
    ) as host:
        uid = await new_session(host, "tooler")
        recs = records(await host.exec(say(uid, "hi", config=config(calls=[{"mediation": "mediated"}]))))
        assert kinds(recs) == [
            "EXECUTION_START",
            "INPUT",
            "MODEL_CALL",
            "OUTPUT",
            "TOOL_CALL",
            "TOOL_RESULT",
            "OUTPUT",
            "END",
        ]
        call, result = recs[4].event.tool, recs[5].event.result
        assert call.mediation == MEDIATED and call.tool == "stamp" and call.idempotency_key
        assert stamp.intent_was_journaled == [True]
        (run,) = stamp.runs
        context, args = run
        assert (context.session_uid, context.call_id, context.idempotency_key) == (
            uid,
            call.id,
            call.idempotency_key,
        )
        assert args == {"text": "echo:hi"}
        assert result.id == call.id and not result.is_error
        assert result.code == common_pb2.ToolResult.CODE_UNSPECIFIED
        assert result.approval_request_seq == 0 and result.approval_decision_seq == 0
        (seen,) = receipts_seen(recs)
        assert seen["output"] == {"stamped": "echo:hi"} and seen["id"] == call.id
        before = await journal(store, uid)
        report = await host.controller.replay(uid)
        assert (report.executions, report.model_calls) == (1, 0)
        assert len(stamp.runs) == 1, "replay serves the recorded result; the tool does not run again"
        assert await journal(store, uid) == before


async def test_a_tool_no_executor_serves_fails_after_intent_and_runs_nothing(
    store: JournalStore, tooler_process: HarnessProcess
) -> None:
    stamp = StampTool(store)
    async with running_host(store, remote={"tooler": tooler_process.address}, tools=stamp.registry()) as host:
        uid = await new_session(host, "tooler")
        request = say(uid, "hi", config=config(calls=[{"mediation": "mediated", "tool": "shred"}]))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await host.exec(request)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "shred" in (err.value.details() or "")
        recs = await journal(store, uid)
        assert kinds(recs) == ["EXECUTION_START", "INPUT", "MODEL_CALL", "OUTPUT", "TOOL_CALL", "ERROR"]
        assert stamp.runs == []


async def test_without_any_tool_registry_a_mediated_call_fails_precondition(
    store: JournalStore, tooler_process: HarnessProcess
) -> None:
    async with running_host(store, remote={"tooler": tooler_process.address}) as host:
        uid = await new_session(host, "tooler")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await host.exec(say(uid, "hi", config=config(calls=[{"mediation": "mediated"}])))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert kinds(await journal(store, uid))[-2:] == ["TOOL_CALL", "ERROR"]


def _raw_tool_call(call: common_pb2.ToolCall) -> Script:
    async def script(conversation: Conversation) -> None:
        conversation.send(tool_call_event(call))
        await conversation.recv()  # the host ends the stream after refusing

    return script


def _args(**values: float) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    for key, value in values.items():
        struct.fields[key].number_value = value
    return struct


REFUSED_CALLS = {
    "no-key": (
        common_pb2.ToolCall(id="c1", tool="stamp", mediation=MEDIATED),
        "tool_call.idempotency_key",
    ),
    "approval-no-key": (
        common_pb2.ToolCall(id="c1", tool="stamp", mediation=common_pb2.MEDIATION_REQUIRES_APPROVAL),
        "tool_call.idempotency_key",
    ),
    "in-harness-reported": (
        common_pb2.ToolCall(
            id="c1", tool="stamp", mediation=common_pb2.MEDIATION_IN_HARNESS_REPORTED, idempotency_key="k"
        ),
        "tool_call.mediation",
    ),
    "unspecified": (
        common_pb2.ToolCall(id="c1", tool="stamp", idempotency_key="k"),
        "tool_call.mediation",
    ),
    "nan": (
        common_pb2.ToolCall(
            id="c1", tool="stamp", mediation=MEDIATED, idempotency_key="k", args=_args(x=math.nan)
        ),
        "tool_call.args.x: NaN",
    ),
    "plus-inf": (
        common_pb2.ToolCall(
            id="c1", tool="stamp", mediation=MEDIATED, idempotency_key="k", args=_args(x=math.inf)
        ),
        "tool_call.args.x: +Infinity",
    ),
    "minus-inf-approval": (
        common_pb2.ToolCall(
            id="c1",
            tool="stamp",
            mediation=common_pb2.MEDIATION_REQUIRES_APPROVAL,
            idempotency_key="k",
            args=_args(y=-math.inf),
        ),
        "tool_call.args.y: -Infinity",
    ),
    "unsafe-integer": (
        common_pb2.ToolCall(
            id="c1", tool="stamp", mediation=MEDIATED, idempotency_key="k", args=_args(big=2.0**60)
        ),
        "tool_call.args.big",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED_CALLS))
async def test_raw_wire_calls_the_host_must_not_run_are_refused_before_intent(
    store: JournalStore, case: str
) -> None:
    call, named = REFUSED_CALLS[case]
    stamp = StampTool(store)
    async with (
        raw_peer(_raw_tool_call(call)) as (address, _),
        running_host(store, remote={"raw": address}, tools=stamp.registry()) as host,
    ):
        uid = await new_session(host, "raw")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await host.exec(say(uid, "hi"))
        # An invalid approval call is a precondition failure (spec 1.1 Exec error mapping); other
        # refused calls end the bridge like any harness failure.
        approval = call.mediation == common_pb2.MEDIATION_REQUIRES_APPROVAL
        expected = grpc.StatusCode.FAILED_PRECONDITION if approval else grpc.StatusCode.INTERNAL
        assert err.value.code() == expected
        recs = await journal(store, uid)
        assert kinds(recs) == ["EXECUTION_START", "INPUT", "ERROR"], "nothing journaled for the call"
        assert named in recs[2].event.error.description
        assert stamp.runs == []
        assert await store.verify(uid) == 3


class _RefusalProbe:
    """In-process: the refused call's error reaches the harness, which goes on."""

    def __init__(self, calls: Sequence[common_pb2.ToolCall]) -> None:
        self.calls = calls

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return descriptor("probe")

    async def run(self, start: Start, sink: EventSink) -> None:
        for call in self.calls:
            try:
                await sink.tool_call(call)
            except SinkError as exc:
                await sink.output(f"refused {call.id}: {exc}")


async def test_in_process_refusals_reach_the_harness_and_journal_no_intent(store: JournalStore) -> None:
    calls = []
    for index, case in enumerate(sorted(REFUSED_CALLS)):
        call = common_pb2.ToolCall()
        call.CopyFrom(REFUSED_CALLS[case][0])
        call.id = f"c{index}"
        calls.append(call)
    stamp = StampTool(store)
    async with running_host(store, local={"probe": _RefusalProbe(calls)}, tools=stamp.registry()) as host:
        uid = await new_session(host, "probe")
        recs = records(await host.exec(say(uid, "hi")))
        assert kinds(recs) == ["EXECUTION_START", "INPUT"] + ["OUTPUT"] * len(calls) + ["END"]
        for (case, (_, named)), text in zip(sorted(REFUSED_CALLS.items()), outputs(recs), strict=True):
            assert named in text, case
        assert stamp.runs == []
        assert (await get(host, uid)).exec_state == 4  # EXEC_COMPLETED


HOST_OWNED_REPORTS = {
    "approval_request_seq": common_pb2.ToolResult(id="r1", approval_request_seq=3),
    "approval_decision_seq": common_pb2.ToolResult(id="r1", approval_decision_seq=4),
    "code APPROVAL_DENIED": common_pb2.ToolResult(
        id="r1", is_error=True, code=common_pb2.ToolResult.APPROVAL_DENIED
    ),
}


@pytest.mark.parametrize("field", sorted(HOST_OWNED_REPORTS))
async def test_a_harness_reporting_a_host_owned_receipt_is_refused(store: JournalStore, field: str) -> None:
    forged = HOST_OWNED_REPORTS[field]

    async def script(conversation: Conversation) -> None:
        conversation.send(common_pb2.Event(kind=K.EVENT_TOOL_RESULT, result=forged))
        await conversation.recv()

    async with raw_peer(script) as (address, _), running_host(store, remote={"raw": address}) as host:
        uid = await new_session(host, "raw")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await host.exec(say(uid, "hi"))
        assert err.value.code() == grpc.StatusCode.INTERNAL
        recs = await journal(store, uid)
        assert kinds(recs) == ["EXECUTION_START", "INPUT", "ERROR"]
        assert field in recs[2].event.error.description


class _Forger:
    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return descriptor("forger")

    async def run(self, start: Start, sink: EventSink) -> None:
        for field, result in sorted(HOST_OWNED_REPORTS.items()):
            try:
                await sink.report(result)
            except SinkError as exc:
                await sink.output(f"{field}: {exc}")


async def test_in_process_host_owned_reports_are_refused_too(store: JournalStore) -> None:
    async with running_host(store, local={"forger": _Forger()}) as host:
        uid = await new_session(host, "forger")
        recs = records(await host.exec(say(uid, "hi")))
        assert "TOOL_RESULT" not in kinds(recs)
        texts = outputs(recs)
        assert len(texts) == 3
        for text in texts:
            field = text.split(":")[0]
            assert "host-owned" in text and field in text


async def test_tool_harness_in_process_matches_the_process(store: JournalStore) -> None:
    """The same ToolHarness in-process journals the same kinds as over Connect."""
    stamp = StampTool(store)
    async with running_host(store, local={"tooler": ToolHarness()}, tools=stamp.registry()) as host:
        uid = await new_session(host, "tooler")
        recs = records(await host.exec(say(uid, "hi", config=config(calls=[{"mediation": "mediated"}]))))
        assert kinds(recs)[4:] == ["TOOL_CALL", "TOOL_RESULT", "OUTPUT", "END"]
        assert stamp.intent_was_journaled == [True]
