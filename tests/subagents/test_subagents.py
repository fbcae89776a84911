"""The host's ``task`` tool on an in-process live host (the real controller, SQLite and PostgreSQL
journals, the model a
scripted chat-completions endpoint on loopback): a parent delegating to two children in parallel
completes after both with one park; a failing child is an error result carrying its error and partial
output; bad arguments and limits get precise error results at once; Cancel, Delete and Submit
ON_BUSY_INTERRUPT cascade; a
person cannot decide a task gate; the links are served over gRPC."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2
from grpc import aio

from agentsessions.ext.v1 import live_pb2, subagents_pb2, subagents_pb2_grpc
from agentsessions.host.callcontext import CallContext
from agentsessions.host.controller import cancel, subagents
from agentsessions.host.controller.live import LiveSettings
from agentsessions.host.controller.subagents import HOST_ACTOR, SubagentSettings, child_uid
from agentsessions.host.journal import open_store
from agentsessions.host.journal.store import JournalStore
from agentsessions.host.models.openai import OpenAIModel
from agentsessions.host.service.subagents import SubagentsServicer
from agentsessions.sdk import EventSink, Start
from agentsessions.sdk.approval import receipt_conflict
from agentsessions.sdk.harness import Harness
from agentsessions.v1 import common_pb2, harness_pb2, session_pb2
from tests.live.world import TEST_SETTINGS, LiveHost, ends, exec_request, live_host
from tests.support.scripted_endpoint import Reply, ScriptedEndpoint, scripted_endpoint
from tests.support.subagent_harnesses import Delegator, Worker

K = common_pb2.EventKind
LK = common_pb2.Lifecycle


def task(call_id: str, **args: Any) -> Mapping[str, Any]:
    return {"id": call_id, "name": "task", "args": args}


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with scripted_endpoint() as served:
        yield served


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def journal(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each test on SQLite and on PostgreSQL (a database of its own). A sync fixture, so that it may
    ask for the async per-test database."""
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return str(tmp_path / "journal.db")


@pytest.fixture
async def store(journal: str) -> AsyncIterator[JournalStore]:
    opened = await open_store(journal)
    try:
        yield opened
    finally:
        await opened.close()


def settings(**limits: Any) -> LiveSettings:
    return dataclasses.replace(TEST_SETTINGS, attempts=1, subagents=SubagentSettings(scan_s=0.1, **limits))


@pytest.fixture
async def host(store: JournalStore, endpoint: ScriptedEndpoint) -> AsyncIterator[LiveHost]:
    async with world(store, endpoint, settings()) as h:
        yield h


def world(store: JournalStore, endpoint: ScriptedEndpoint, live: LiveSettings) -> Any:
    model = OpenAIModel("scripted", base_url=endpoint.base_url)
    return live_host(store, settings=live, model=model, local={"delegator": Delegator(), "worker": Worker()})


async def delegate(host: LiveHost, text: str = "split the work") -> tuple[str, list[session_pb2.ExecUpdate]]:
    uid = await host.create("delegator")
    updates = [u async for u in host.sessions.Exec(exec_request(uid, text), timeout=30)]
    return uid, updates


async def settled(host: LiveHost, uid: str) -> list[common_pb2.LogRecord]:
    return await host.wait_for(uid, lambda rs: bool(ends(rs)), f"the END of {uid}")


def output(records: list[common_pb2.LogRecord]) -> str:
    outputs = [r for r in records if r.event.kind == K.EVENT_OUTPUT]
    return "".join(p.text.text for p in outputs[-1].event.message.parts)


def is_resume(record: common_pb2.LogRecord) -> bool:
    return record.event.kind == K.EVENT_LIFECYCLE and record.event.lifecycle.kind == LK.LIFECYCLE_RESUME


def of_kind(records: list[common_pb2.LogRecord], kind: int) -> list[common_pb2.LogRecord]:
    return [r for r in records if r.event.kind == kind]


def execution_of(records: list[common_pb2.LogRecord]) -> str:
    (start,) = of_kind(records, K.EVENT_EXECUTION_START)
    return start.event.execution_id


def delegating_twice() -> tuple[Reply, Reply]:
    """The model's replies of a parent whose task call "c" runs on the delegating harness, and of
    that child, whose call "g" runs "hold me" on the gated harness (held by the test)."""
    return (
        Reply.completion("", tool_calls=[task("c", prompt="delegate further", harness="delegator")]),
        Reply.completion("", tool_calls=[task("g", prompt="hold me", harness="gated")]),
    )


async def delegated_twice(host: LiveHost) -> tuple[str, str, str]:
    """Delegate as :func:`delegating_twice` scripts it: the parent, the child and the grandchild,
    once the grandchild runs and the child waits for it."""
    uid, updates = await delegate(host)
    child = child_uid(uid, updates[-1].session.pending_approval.execution_id, "c")
    assert await host.harness.next_started() == "hold me"
    waiting = await host.wait_for(child, lambda rs: of_kind(rs, K.EVENT_APPROVAL_REQUEST), "the child's wait")
    return uid, child, child_uid(child, execution_of(waiting), "g")


async def test_a_parent_delegating_to_two_children_in_parallel_completes_after_both(
    host: LiveHost, endpoint: ScriptedEndpoint
) -> None:
    calls = [task("call-a", prompt="alpha", harness="gated"), task("call-b", prompt="beta", harness="gated")]
    endpoint.script(Reply.completion("", tool_calls=calls), Reply.completion("A"), Reply.completion("B"))
    uid, updates = await delegate(host)
    # The Exec ends at the park, showing the first call as the pending one.
    final = updates[-1].session
    assert final.exec_state == session_pb2.EXEC_AWAITING
    assert final.pending_approval.tool_call_id == "call-a"
    # Both children run at once (the gated harness holds each until the test opens it).
    assert {await host.harness.next_started(), await host.harness.next_started()} == {"alpha", "beta"}
    execution = final.pending_approval.execution_id
    first, second = (child_uid(uid, execution, call) for call in ("call-a", "call-b"))
    # Watchers see the wait too: the session item a Watch opens with.
    watched = [u async for u in host.live.Watch(live_pb2.WatchRequest(session=uid), timeout=30)]
    assert watched[0].session.exec_state == session_pb2.EXEC_AWAITING
    assert watched[0].session.pending_approval == final.pending_approval

    host.harness.open("alpha")
    await settled(host, first)
    # One child settled: the parent still waits for the last one.
    waiting = await host.sessions.GetSession(session_pb2.GetSessionRequest(uid=uid))
    assert waiting.exec_state == session_pb2.EXEC_AWAITING
    host.harness.open("beta")

    records = await settled(host, uid)
    assert ends(records)[0].event.end.state == "COMPLETED"
    assert output(records) == "ok A\nok B"
    for child in (first, second):
        kids = await host.records(child)
        assert len(of_kind(kids, K.EVENT_EXECUTION_START)) == 1  # each child ran once
        assert [e.event.end.state for e in ends(kids)] == ["COMPLETED"]
    # The parent parked once and resumed once, when the last child had settled.
    parks = [
        r
        for r in records
        if r.event.kind == K.EVENT_LIFECYCLE and r.event.lifecycle.kind == LK.LIFECYCLE_SUSPEND
    ]
    assert len(parks) == 1
    decisions = of_kind(records, K.EVENT_APPROVAL_RESULT)
    assert [d.event.actor for d in decisions] == [HOST_ACTOR, HOST_ACTOR]
    assert all(d.seq > parks[0].seq for d in decisions)
    results = of_kind(records, K.EVENT_TOOL_RESULT)
    assert [r.event.result.approval_decision_seq for r in results] == [d.seq for d in decisions]
    for decision, result in zip(decisions, results, strict=True):
        assert receipt_conflict(decision.event.approval_result, result.event.result) is None
    assert len(endpoint.received) == 3  # the parent's one model call and one per child
    assert host.controller.live is not None and host.controller.live.subagents.children_started == 2
    # Recovery continued the parent: its RESUME marker closes the journal.
    records = await host.wait_for(uid, lambda rs: is_resume(rs[-1]), "the parent's RESUME marker")
    # A controller replay re-runs the parent from its journal: the receipts are served, nothing runs.
    head = records[-1].seq
    report = await host.controller.replay(uid)
    assert (report.executions, report.model_calls, report.outputs[-1]) == (1, 0, "ok A\nok B")
    assert (await host.store.head(uid)).seq == head


async def test_a_failing_child_comes_back_as_an_error_result_with_its_error_and_partial_output(
    host: LiveHost, endpoint: ScriptedEndpoint
) -> None:
    endpoint.script(
        Reply.completion(
            "",
            tool_calls=[
                task("call-ok", prompt="fine", harness="worker"),
                task("call-bad", prompt=json.dumps({"name": "b", "fail": True}), harness="worker"),
            ],
        )
    )
    uid, _ = await delegate(host)
    records = await settled(host, uid)
    assert ends(records)[0].event.end.state == "COMPLETED"
    ok, bad = of_kind(records, K.EVENT_TOOL_RESULT)
    assert not ok.event.result.is_error
    result = bad.event.result
    assert result.is_error and result.code == common_pb2.ToolResult.EXECUTOR_ERROR
    child = child_uid(uid, execution_of(records), "call-bad")
    assert result.error.startswith(f"subagent {child} ended FAILED: automatic recovery gave up")
    assert "worker b failed on purpose" in result.error
    texts = [p.text.text for p in result.content]
    assert texts[-1] == "partial output: working on b"


async def test_bad_task_arguments_get_precise_error_results_and_start_nothing(
    host: LiveHost, endpoint: ScriptedEndpoint
) -> None:
    endpoint.script(
        Reply.completion(
            "",
            tool_calls=[
                task("c1"),
                task("c2", prompt=5),
                task("c3", prompt="x", fork=True, harness="worker"),
                task("c4", prompt="x", colour="red"),
                task("c5", prompt="x", harness="nope"),
                task("c6", prompt="x", result_schema="object"),
                task("c7", prompt="x", fork="yes"),
            ],
        )
    )
    uid, updates = await delegate(host)
    assert updates[-1].record.event.end.state == "COMPLETED"  # nothing parked
    records = await host.records(uid)
    assert output(records).splitlines() == [
        "error task argument 'prompt' is required: a non-empty string: the child's input",
        "error task argument 'prompt' must be a non-empty string: the child's input",
        "error task argument 'harness' cannot be combined with fork: a fork runs the parent's harness",
        "error task argument 'colour' is not an argument of task "
        "(it takes prompt, harness, fork, result_schema)",
        "error task argument 'harness' names 'nope', which this host does not serve",
        "error task argument 'result_schema' must be an object (a JSON Schema): "
        "the data the child's result must match",
        "error task argument 'fork' must be a boolean: "
        "the child is a fork of the parent, before the delegating turn",
    ]
    # Each is answered through the gate's records, as every REQUIRES_APPROVAL call is: the request,
    # the host's decision and an EXECUTOR_ERROR receipt naming both.
    requests = of_kind(records, K.EVENT_APPROVAL_REQUEST)
    decisions = of_kind(records, K.EVENT_APPROVAL_RESULT)
    results = of_kind(records, K.EVENT_TOOL_RESULT)
    assert len(requests) == len(decisions) == len(results) == 7
    for request, decision, result in zip(requests, decisions, results, strict=True):
        receipt = result.event.result
        assert receipt.code == common_pb2.ToolResult.EXECUTOR_ERROR
        assert (receipt.approval_request_seq, receipt.approval_decision_seq) == (request.seq, decision.seq)
        assert receipt_conflict(decision.event.approval_result, receipt) is None
        assert decision.event.actor == HOST_ACTOR
    execution = execution_of(records)
    for call in ("c1", "c2", "c3", "c4", "c5", "c6", "c7"):
        assert await host.store.get_session(child_uid(uid, execution, call)) is None


async def test_task_calls_beyond_the_children_per_turn_are_refused_at_once(
    store: JournalStore, endpoint: ScriptedEndpoint
) -> None:
    endpoint.script(
        Reply.completion(
            "",
            tool_calls=[
                task("one", prompt="first", harness="worker"),
                task("two", prompt="second", harness="worker"),
            ],
        )
    )
    async with world(store, endpoint, settings(max_children=1)) as host:
        uid, _ = await delegate(host)
        records = await settled(host, uid)
        assert output(records).splitlines() == [
            "ok done first",
            "error task refused: the turn already started 1 children, "
            "the limit per turn (--subagent-max-children)",
        ]
        assert await host.store.get_session(child_uid(uid, execution_of(records), "two")) is None


async def test_a_child_may_not_delegate_past_the_depth_limit(
    host: LiveHost, endpoint: ScriptedEndpoint
) -> None:
    endpoint.script(
        Reply.completion("", tool_calls=[task("outer", prompt="delegate further", harness="delegator")]),
        Reply.completion("", tool_calls=[task("inner", prompt="x", harness="worker")]),
    )
    uid, _ = await delegate(host)
    records = await settled(host, uid)
    child = child_uid(uid, execution_of(records), "outer")
    child_records = await host.records(child)
    assert output(child_records) == (
        "error task refused: a child at depth 2 would pass the subagent depth limit 1 (--subagent-max-depth)"
    )
    assert output(records) == "ok " + output(child_records)
    row = await host.store.get_session(child)
    assert row is not None and row.labels["agentsessions.io/subagent-depth"] == "1"


async def test_a_fork_child_starts_from_the_parent_before_the_delegating_turn(
    host: LiveHost, endpoint: ScriptedEndpoint
) -> None:
    endpoint.script(
        Reply.completion("first turn"),
        Reply.completion("", tool_calls=[task("f", prompt="think it over", fork=True)]),
        Reply.completion("the fork's answer"),
    )
    uid = await host.create("delegator")
    [u async for u in host.sessions.Exec(exec_request(uid, "hello"), timeout=30)]
    before = (await host.store.head(uid)).seq
    [u async for u in host.sessions.Exec(exec_request(uid, "now fork"), timeout=30)]
    records = await host.wait_for(uid, lambda rs: len(ends(rs)) == 2, "the second turn's END")
    assert output(records) == "ok the fork's answer"
    second = of_kind(records, K.EVENT_EXECUTION_START)[1].event.execution_id
    row = await host.store.get_session(child_uid(uid, second, "f"))
    assert row is not None and row.parent_uid == uid and row.fork_seq == before


async def test_cancel_of_a_waiting_parent_cascades_to_its_children(
    host: LiveHost, endpoint: ScriptedEndpoint
) -> None:
    endpoint.script(Reply.completion("", tool_calls=[task("slow", prompt="hold me", harness="gated")]))
    uid, updates = await delegate(host)
    assert updates[-1].session.exec_state == session_pb2.EXEC_AWAITING
    assert await host.harness.next_started() == "hold me"  # the child runs, held by the test
    child = child_uid(uid, updates[-1].session.pending_approval.execution_id, "slow")
    # A person cannot decide the wait: only the child's end does.
    ref = updates[-1].session.pending_approval
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await host.sessions.Approve(
            session_pb2.ApproveRequest(
                session=uid,
                execution_id=ref.execution_id,
                tool_call_id=ref.tool_call_id,
                request_seq=ref.request_seq,
                approved=True,
            )
        )
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"waits for subagent session {child}" in (refused.value.details() or "")

    await host.sessions.Cancel(session_pb2.CancelRequest(session=uid, reason="stop"))
    parent_end = ends(await host.records(uid))
    assert [e.event.end.state for e in parent_end] == ["CANCELED"]
    kid = await settled(host, child)
    (end,) = ends(kid)
    assert end.event.end.state == "CANCELED"
    assert end.event.end.error.description == f"its parent session {uid} was cancelled"


async def test_submit_interrupt_of_a_waiting_parent_cancels_its_children_and_nothing_wakes_it(
    store: JournalStore, endpoint: ScriptedEndpoint
) -> None:
    endpoint.script(
        Reply.completion("", tool_calls=[task("c", prompt="delegate further", harness="delegator")]),
        Reply.completion("", tool_calls=[task("g", prompt="hold me", harness="gated")]),
        Reply.completion("a fresh answer"),
    )
    async with world(store, endpoint, settings(max_depth=2)) as host:
        uid, updates = await delegate(host)
        first = updates[-1].session.pending_approval.execution_id
        child = child_uid(uid, first, "c")
        assert await host.harness.next_started() == "hold me"  # the grandchild runs, held by the test
        waiting = await host.wait_for(
            child, lambda rs: of_kind(rs, K.EVENT_APPROVAL_REQUEST), "the child's wait"
        )
        grandchild = child_uid(child, execution_of(waiting), "g")

        answer = await host.live.Submit(
            live_pb2.SubmitRequest(
                exec=exec_request(uid, "never mind, answer this"), on_busy=live_pb2.ON_BUSY_INTERRUPT
            ),
            timeout=30,
        )
        assert answer.execution_id != first
        # Each child's turn ended CANCELED, saying which parent's interruption or cancel ended it.
        for session, why in (
            (child, f"its parent session {uid} was interrupted by a newer turn (Submit ON_BUSY_INTERRUPT)"),
            (grandchild, f"its parent session {child} was cancelled"),
        ):
            (end,) = ends(await settled(host, session))
            assert (end.event.end.state, end.event.end.error.description) == ("CANCELED", why)
        records = await host.wait_for(uid, lambda rs: len(ends(rs)) == 2, "the new turn's END")
        assert [(e.event.execution_id, e.event.end.state) for e in ends(records)] == [
            (first, "CANCELED"),
            (answer.execution_id, "COMPLETED"),
        ]
        assert output(records) == "a fresh answer"
        # Nothing decides the interrupted parent's call, now or when the subagent loop looks again.
        assert host.controller.live is not None
        assert await host.controller.live.subagents.wake(uid) is False
        after = await host.records(uid)
        assert after == records
        assert of_kind(after, K.EVENT_APPROVAL_RESULT) == [] and of_kind(after, K.EVENT_TOOL_RESULT) == []
        assert host.harness.runs == ["hold me"]  # the grandchild ran once and was never re-driven
        assert len(endpoint.received) == 3


async def test_delete_of_a_parent_deletes_its_children(host: LiveHost, endpoint: ScriptedEndpoint) -> None:
    endpoint.script(Reply.completion("", tool_calls=[task("slow", prompt="hold me too", harness="gated")]))
    uid, updates = await delegate(host)
    assert await host.harness.next_started() == "hold me too"
    child = child_uid(uid, updates[-1].session.pending_approval.execution_id, "slow")
    await host.sessions.DeleteSession(session_pb2.DeleteSessionRequest(uid=uid))
    for gone in (uid, child):
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await host.sessions.GetSession(session_pb2.GetSessionRequest(uid=gone))
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert [e.event.end.state for e in ends(await host.records(child))] == ["CANCELED"]


async def test_a_child_that_does_not_settle_in_time_is_cancelled_and_the_call_gets_an_error(
    store: JournalStore, endpoint: ScriptedEndpoint
) -> None:
    endpoint.script(Reply.completion("", tool_calls=[task("late", prompt="never released", harness="gated")]))
    async with world(store, endpoint, settings(wait_timeout_s=0.5)) as host:
        uid, updates = await delegate(host)
        child = child_uid(uid, updates[-1].session.pending_approval.execution_id, "late")
        records = await settled(host, uid)
        (result,) = of_kind(records, K.EVENT_TOOL_RESULT)
        assert result.event.result.is_error
        assert result.event.result.error == (
            f"subagent {child} did not settle within 0.5 s (--subagent-wait-timeout); it was cancelled"
        )
        kid = await settled(host, child)
        assert ends(kid)[0].event.end.state == "CANCELED"


async def test_the_links_are_served_over_grpc(host: LiveHost, endpoint: ScriptedEndpoint) -> None:
    endpoint.script(Reply.completion("", tool_calls=[task("a", prompt="alpha", harness="worker")]))
    uid, _ = await delegate(host)
    await settled(host, uid)
    execution = execution_of(await host.records(uid))
    server = aio.server()
    subagents_pb2_grpc.add_SubagentsServicer_to_server(SubagentsServicer(host.controller), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await check_links(subagents_pb2_grpc.SubagentsStub(channel), uid, execution)
    await server.stop(None)


async def check_links(stub: subagents_pb2_grpc.SubagentsStub, uid: str, execution: str) -> None:
    child = child_uid(uid, execution, "a")
    parent_view = await stub.GetSubagents(subagents_pb2.GetSubagentsRequest(session=uid))
    assert not parent_view.HasField("parent")
    (link,) = parent_view.children
    assert (link.parent, link.execution_id, link.tool_call_id, link.child, link.depth) == (
        uid,
        execution,
        "a",
        child,
        1,
    )
    assert link.child_state == session_pb2.EXEC_COMPLETED
    child_view = await stub.GetSubagents(subagents_pb2.GetSubagentsRequest(session=child))
    assert child_view.parent == link and list(child_view.children) == []
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await stub.GetSubagents(subagents_pb2.GetSubagentsRequest(session=""))
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await stub.GetSubagents(subagents_pb2.GetSubagentsRequest(session="sess-none"))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_child_that_ended_while_nothing_watched_its_parent_wakes_it_after_a_restart(
    store: JournalStore, endpoint: ScriptedEndpoint
) -> None:
    endpoint.script(
        Reply.completion("", tool_calls=[task("c", prompt="finish alone", harness="gated")]),
        Reply.completion("finished"),
    )
    async with world(store, endpoint, settings()) as first_host:
        uid, updates = await delegate(first_host)
        child = child_uid(uid, updates[-1].session.pending_approval.execution_id, "c")
        assert await first_host.harness.next_started() == "finish alone"
        # This host stops looking at waiting parents (as a host does when it goes away), then the child
        # finishes: its end is journaled, its parent is not decided.
        assert first_host.controller.live is not None
        await first_host.controller.live.subagents.close()
        first_host.harness.open("finish alone")
        await settled(first_host, child)
        state = await first_host.sessions.GetSession(session_pb2.GetSessionRequest(uid=uid))
        assert state.exec_state == session_pb2.EXEC_AWAITING
        assert of_kind(await first_host.records(uid), K.EVENT_APPROVAL_RESULT) == []
    # The next host on the journal finds the child by its row and continues the parent by itself.
    async with world(store, endpoint, settings()) as second_host:
        records = await settled(second_host, uid)
        assert output(records) == "ok finished"
        assert len(of_kind(await second_host.records(child), K.EVENT_EXECUTION_START)) == 1


class OwnCalls:
    """A harness that makes task calls of its own (no model proposes them): one per line of its input."""

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return await Delegator().describe()

    async def run(self, start: Start, sink: EventSink) -> None:
        answers = []
        for i, prompt in enumerate(start.last_input_text().splitlines()):
            args = struct_pb2.Struct()
            args.update({"prompt": prompt, "harness": "worker"})
            result = await sink.tool_call(
                common_pb2.ToolCall(
                    id=f"own-{i}",
                    tool="task",
                    args=args,
                    mediation=common_pb2.MEDIATION_REQUIRES_APPROVAL,
                    idempotency_key=f"{start.execution_id}/own-{i}",
                )
            )
            answers.append("".join(p.text.text for p in result.content))
        await sink.output(" | ".join(answers))


async def test_task_calls_nobody_proposed_run_one_after_the_other(
    store: JournalStore, endpoint: ScriptedEndpoint
) -> None:
    model = OpenAIModel("scripted", base_url=endpoint.base_url)
    local: dict[str, Harness] = {"own": OwnCalls(), "worker": Worker()}
    async with live_host(store, settings=settings(), model=model, local=local) as host:
        uid = await host.create("own")
        [u async for u in host.sessions.Exec(exec_request(uid, "first\nsecond"), timeout=30)]
        records = await settled(host, uid)
        assert output(records) == "done first | done second"
        execution = execution_of(records)
        first = await host.records(child_uid(uid, execution, "own-0"))
        second = await host.records(child_uid(uid, execution, "own-1"))
        # The second child was started only once the first call had its receipt.
        (receipt,) = [r for r in of_kind(records, K.EVENT_TOOL_RESULT) if r.event.result.id == "own-0"]
        (second_call,) = [r for r in of_kind(records, K.EVENT_TOOL_CALL) if r.event.tool.id == "own-1"]
        assert receipt.seq < second_call.seq
        assert (
            len(of_kind(first, K.EVENT_EXECUTION_START)) == len(of_kind(second, K.EVENT_EXECUTION_START)) == 1
        )


async def test_a_deleted_child_answers_its_call_with_an_error(
    host: LiveHost, endpoint: ScriptedEndpoint
) -> None:
    endpoint.script(Reply.completion("", tool_calls=[task("doomed", prompt="hold me", harness="gated")]))
    uid, updates = await delegate(host)
    assert await host.harness.next_started() == "hold me"
    child = child_uid(uid, updates[-1].session.pending_approval.execution_id, "doomed")
    await host.sessions.DeleteSession(session_pb2.DeleteSessionRequest(uid=child))
    records = await settled(host, uid)
    (result,) = of_kind(records, K.EVENT_TOOL_RESULT)
    # The delete cancels the child's turn before it drops the row: the parent hears of whichever came
    # first, the cancelled turn or the deleted session.
    assert result.event.result.error in (
        f"subagent {child} was deleted",
        f"subagent {child} ended CANCELED: session deleted",
    )


async def test_a_child_bound_to_a_result_schema_returns_its_validated_data(
    host: LiveHost, endpoint: ScriptedEndpoint
) -> None:
    """The call's result_schema binds the child's turn (controller/results.py): its first answer does
    not validate, one corrective turn later it does, and the parent's receipt is that data."""
    schema = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}
    endpoint.script(
        Reply.completion(
            "", tool_calls=[task("call-d", prompt="count", harness="echo", result_schema=schema)]
        ),
        Reply.completion("about three"),
        Reply.completion('{"n": 3}'),
    )
    uid, _ = await delegate(host)
    records = await settled(host, uid)
    assert ends(records)[0].event.end.state == "COMPLETED"
    (result,) = of_kind(records, K.EVENT_TOOL_RESULT)
    assert not result.event.result.is_error
    [part] = result.event.result.content
    assert part.WhichOneof("part") == "data"
    assert json.loads(json.dumps(dict(part.data.data))) == {"n": 3}
    child = await host.records(child_uid(uid, execution_of(records), "call-d"))
    assert [e.event.end.state for e in ends(child)] == ["COMPLETED", "COMPLETED"]  # one correction
    assert len(endpoint.received) == 3


async def test_a_task_call_with_an_invalid_result_schema_is_an_argument_error(
    host: LiveHost, endpoint: ScriptedEndpoint
) -> None:
    bad = {"type": "integer-ish"}
    endpoint.script(
        Reply.completion("", tool_calls=[task("call-x", prompt="count", harness="echo", result_schema=bad)]),
        Reply.completion("done"),
    )
    uid, _ = await delegate(host)
    records = await settled(host, uid)
    (result,) = of_kind(records, K.EVENT_TOOL_RESULT)
    assert result.event.result.is_error
    assert (
        "result_schema" in result.event.result.error
        and "is not a valid JSON Schema" in result.event.result.error
    )
    assert await host.controller.store.get_session(child_uid(uid, execution_of(records), "call-x")) is None


async def test_the_scan_cancels_the_children_of_an_ended_turn_and_theirs_and_leaves_waiting_ones(
    store: JournalStore, endpoint: ScriptedEndpoint
) -> None:
    endpoint.script(
        *delegating_twice(),
        Reply.completion("", tool_calls=[task("k", prompt="keep me", harness="gated")]),
        Reply.completion("kept"),
    )
    async with world(store, endpoint, settings(max_depth=2)) as host:
        live = host.controller.live
        assert live is not None
        uid, child, grandchild = await delegated_twice(host)
        other, other_updates = await delegate(host, "another split")  # a parent that still waits
        kept = child_uid(other, other_updates[-1].session.pending_approval.execution_id, "k")
        assert await host.harness.next_started() == "keep me"

        # The parent's turn ends with no cascade (what a host killed right after that END leaves), then
        # the host's subagent scan runs as it does at start-up and in its periodic look.
        await live.subagents.close()
        await cancel.cancel(live.core, live.settings.host_call, uid, "", "stopped by its owner")
        assert ends(await host.records(child)) == []
        await live.subagents._adopt()

        (end,) = ends(await settled(host, child))
        assert (end.event.end.state, end.event.end.error.description) == (
            "CANCELED",
            f"its parent session {uid} ended the turn that started it CANCELED: stopped by its owner",
        )
        (end,) = ends(await settled(host, grandchild))
        assert (end.event.end.state, end.event.end.error.description) == (
            "CANCELED",
            f"its parent session {child} was cancelled",
        )
        # The waiting parent's child is left alone: it runs on, and its parent completes with its result.
        assert ends(await host.records(kept)) == []
        assert (
            await host.sessions.GetSession(session_pb2.GetSessionRequest(uid=other))
        ).exec_state == session_pb2.EXEC_AWAITING
        await live.subagents.start()
        host.harness.open("keep me")
        records = await settled(host, other)
        assert [e.event.end.state for e in ends(records)] == ["COMPLETED"]
        assert output(records) == "ok kept"
        assert host.harness.runs == ["hold me", "keep me"]


@pytest.mark.parametrize(
    "surprise",
    [RuntimeError("a surprise"), asyncio.CancelledError()],
    ids=["error", "a call cancelled under the scan"],
)
async def test_a_child_the_scan_could_not_cancel_is_tried_again_at_the_next_scan(
    store: JournalStore, endpoint: ScriptedEndpoint, monkeypatch: pytest.MonkeyPatch, surprise: BaseException
) -> None:
    """A surprise while cancelling one orphaned child neither stops the scan nor waits for the next
    full one (a minute of scans): the child is looked at again by the next scan. A CancelledError
    the scan's task was not asked for (grpc raises one from a call whose channel was closed under
    it) is such a surprise too."""
    endpoint.script(Reply.completion("", tool_calls=[task("slow", prompt="hold me", harness="gated")]))
    monkeypatch.setattr(subagents, "ADOPT_EVERY", 10**9)  # only the start-up scan reads every row
    async with world(store, endpoint, settings()) as host:
        live = host.controller.live
        assert live is not None
        uid, updates = await delegate(host)
        assert await host.harness.next_started() == "hold me"
        child = child_uid(uid, updates[-1].session.pending_approval.execution_id, "slow")
        await live.subagents.close()
        await cancel.cancel(live.core, live.settings.host_call, uid, "", "stopped by its owner")

        cascade = live.submitter.cancel_child
        assert cascade is not None
        calls: list[str] = []

        async def first_fails(child: str, reason: str, call: CallContext) -> None:
            calls.append(child)
            if len(calls) == 1:
                raise surprise
            await cascade(child, reason, call)

        live.submitter.cancel_child = first_fails
        await live.subagents.start()
        (end,) = ends(await settled(host, child))
        assert end.event.end.state == "CANCELED"
        assert calls == [child, child]


async def test_a_child_whose_wait_timed_out_is_cancelled_with_its_own_children(
    store: JournalStore, endpoint: ScriptedEndpoint
) -> None:
    endpoint.script(*delegating_twice())
    async with world(store, endpoint, settings(max_depth=2)) as host:
        live = host.controller.live
        assert live is not None
        uid, child, grandchild = await delegated_twice(host)
        # The parent's wait expires (looked at by hand, the scan stopped): its child is cancelled,
        # and the child's own child with it.
        await live.subagents.close()
        live.subagents.settings = dataclasses.replace(live.subagents.settings, wait_timeout_s=0.0)
        assert await live.subagents.wake(uid)
        (end,) = ends(await host.records(child))
        assert (end.event.end.state, end.event.end.error.description) == (
            "CANCELED",
            "its wait timed out after 0 s",
        )
        (end,) = ends(await settled(host, grandchild))
        assert (end.event.end.state, end.event.end.error.description) == (
            "CANCELED",
            f"its parent session {child} was cancelled",
        )
