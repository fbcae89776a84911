"""Suspend and Resume (spec 1.1) and recovery of interrupted turns (spec 4.4) over the real wire.

Interrupted journals are written the way a host that crashed would have left them: records
appended through the store API with no END, then Resume is called over gRPC.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from agentsessions.harnesses.chat import ChatHarness
from agentsessions.host.controller.inputhash import model_input_hash
from agentsessions.host.journal.store import JournalStore
from agentsessions.host.models.echo import EchoModel
from agentsessions.sdk.harness import message_text, text_message
from agentsessions.v1 import common_pb2, session_pb2
from tests.durability.harnesses import ToolCaller, lookup_call, served
from tests.durability.models import CountingModel, FlakyModel
from tests.durability.wire import K, append_raw, chain, kinds, new_session, records, say, text_of
from tests.support.harnesses import GateHarness
from tests.support.host import HostUnderTest, counting_ids, running_host, text_input

EID = "00000000000000e1"


async def resume_refused(host: HostUnderTest, model: CountingModel, uid: str, why: str) -> None:
    """Resume answers FAILED_PRECONDITION naming ``why``, and writes nothing and asks no model."""
    before = await chain(host.store, uid)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await resume(host, uid)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert why in (err.value.details() or "")
    assert await chain(host.store, uid) == before
    assert model.calls == []


class TestMultiTurnResumeContinue:
    async def test_suspend_resume_then_the_next_turn_extends_the_same_chain(
        self, store: JournalStore, model: CountingModel
    ) -> None:
        async with (
            served(ChatHarness()) as address,
            running_host(store, remote={"wire-chat": address}, model=model, new_id=counting_ids()) as host,
        ):
            uid = await new_session(host, "wire-chat")
            first = records(await host.exec(say(uid, "one")))
            assert text_of(first[3]) == "echo:one"

            suspended = await host.sessions.Suspend(session_pb2.SuspendRequest(session=uid))
            assert suspended.compute_state == session_pb2.COMPUTE_COLD and suspended.last_seq == 6
            resumed = await host.sessions.Resume(session_pb2.ResumeRequest(session=uid))
            assert resumed.compute_state == session_pb2.COMPUTE_LIVE and resumed.last_seq == 7
            assert resumed.exec_state == session_pb2.EXEC_COMPLETED
            suspend, resume = (await store.read(uid))[5:]
            assert kinds([suspend, resume]) == [
                "EVENT_LIFECYCLE:LIFECYCLE_SUSPEND",
                "EVENT_LIFECYCLE:LIFECYCLE_RESUME",
            ]
            assert suspend.event.lifecycle.snapshot_local == uid and not suspend.event.execution_id
            assert not resume.event.execution_id and not resume.event.lifecycle.detail
            assert len(model.calls) == 1, "a completed turn is not re-driven"

            second = records(await host.exec(say(uid, "two", expected_last_seq=7)))
            assert second[0].seq == 8 and second[0].prev_hash == resume.content_hash
            assert text_of(second[3]) == "echo:two"
            assert [message_text(m) for m in model.calls[-1].messages] == ["one", "echo:one", "two"]
            assert await store.verify(uid) == 12

            report = await host.controller.replay(uid)
            assert report.outputs == ["echo:one", "echo:two"] and report.model_calls == 0
            assert len(model.calls) == 2


def echo_request(text: str) -> common_pb2.ModelCall:
    """The request the echo harness makes for an input ``text``."""
    return common_pb2.ModelCall(model="echo", messages=[text_message("user", text)])


def execution_start(input_count: int | None = 1, harness: str = "wire-echo") -> common_pb2.Event:
    start = common_pb2.ExecutionStart(harness=harness, harness_version="1")
    if input_count is not None:
        start.input_count = input_count
    return common_pb2.Event(execution_id=EID, kind=K.EVENT_EXECUTION_START, execution_start=start)


def user_input(text: str) -> common_pb2.Event:
    return common_pb2.Event(execution_id=EID, kind=K.EVENT_INPUT, message=text_input(text))


def model_call(asked: str) -> common_pb2.Event:
    recorded = common_pb2.ModelCall(
        model="echo", input_hash=model_input_hash(echo_request(asked)), id="aa" * 8
    )
    return common_pb2.Event(execution_id=EID, kind=K.EVENT_MODEL_CALL, model=recorded)


def output(text: str) -> common_pb2.Event:
    return common_pb2.Event(execution_id=EID, kind=K.EVENT_OUTPUT, message=text_message("assistant", text))


async def resume(host: HostUnderTest, uid: str) -> session_pb2.Session:
    resumed: session_pb2.Session = await host.sessions.Resume(session_pb2.ResumeRequest(session=uid))
    return resumed


class TestResumeInterruptedTurn:
    async def test_trailing_model_call_redrives_the_provider_once(
        self, host: HostUnderTest, model: CountingModel
    ) -> None:
        uid = await new_session(host, "wire-echo")
        written = await append_raw(host.store, uid, [execution_start(), user_input("hi"), model_call("hi")])

        resumed = await resume(host, uid)
        assert resumed.compute_state == session_pb2.COMPUTE_LIVE
        assert resumed.exec_state == session_pb2.EXEC_COMPLETED
        recs = await host.store.read(uid)
        assert recs[:3] == written
        assert kinds(recs[3:]) == ["EVENT_OUTPUT", "EVENT_END", "EVENT_LIFECYCLE:LIFECYCLE_RESUME"]
        assert text_of(recs[3]) == "echo:hi"
        assert [r.event.execution_id for r in recs[3:]] == [EID, EID, ""]
        assert recs[4].event.end.state == "COMPLETED"
        assert len(model.calls) == 1 and model.calls[0].messages == echo_request("hi").messages
        assert kinds(recs).count("EVENT_MODEL_CALL") == 1
        assert await host.store.verify(uid) == 6

        await resume(host, uid)
        assert len(model.calls) == 1, "a completed turn is not re-driven"
        assert kinds(await host.store.read(uid))[6:] == ["EVENT_LIFECYCLE:LIFECYCLE_RESUME"]

    async def test_recorded_output_is_served_without_a_call(
        self, host: HostUnderTest, model: CountingModel
    ) -> None:
        uid = await new_session(host, "wire-echo")
        await append_raw(
            host.store, uid, [execution_start(), user_input("hi"), model_call("hi"), output("echo:hi")]
        )
        await resume(host, uid)
        recs = await host.store.read(uid)
        assert kinds(recs[4:]) == ["EVENT_END", "EVENT_LIFECYCLE:LIFECYCLE_RESUME"]
        assert recs[4].event.execution_id == EID
        assert model.calls == []

    async def test_trailing_model_call_with_another_input_hash_diverges_without_a_call(
        self, host: HostUnderTest, model: CountingModel
    ) -> None:
        uid = await new_session(host, "wire-echo")
        await append_raw(host.store, uid, [execution_start(), user_input("hi"), model_call("something else")])
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await resume(host, uid)
        assert err.value.code() == grpc.StatusCode.INTERNAL
        assert "model input hash mismatch" in (err.value.details() or "")
        assert model.calls == []
        appended = kinds((await host.store.read(uid))[3:])
        assert "EVENT_OUTPUT" not in appended and "EVENT_END" not in appended
        assert "EVENT_LIFECYCLE:LIFECYCLE_RESUME" not in appended
        assert await host.store.verify(uid) == 3 + len(appended)

    @pytest.mark.parametrize(
        ("input_count", "why"),
        [
            (2, "committed 1 of 2 inputs; call Exec again with all inputs"),
            (None, "lacks a valid input_count"),
        ],
        ids=["inputs-missing", "no-input-count"],
    )
    async def test_incomplete_invocation_fails_precondition_and_appends_nothing(
        self, host: HostUnderTest, model: CountingModel, input_count: int | None, why: str
    ) -> None:
        uid = await new_session(host, "wire-echo")
        await append_raw(host.store, uid, [execution_start(input_count), user_input("hi")])
        await resume_refused(host, model, uid, why)


class TestResumeAfterProviderError:
    async def test_the_model_call_is_redriven_after_the_error_without_a_second_intent(
        self, store: JournalStore, wire_echo: str
    ) -> None:
        flaky = FlakyModel(EchoModel())
        async with running_host(store, remote={"wire-echo": wire_echo}, model=flaky) as host:
            uid = await new_session(host, "wire-echo")
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await host.exec(say(uid, "hi"))
            assert err.value.code() == grpc.StatusCode.INTERNAL
            assert "provider unavailable" in (err.value.details() or "")
            with pytest.raises(grpc.aio.AioRpcError):
                await resume(host, uid)  # still down: the failed re-drive is journaled, nothing else
            assert kinds(await store.read(uid)) == [
                "EVENT_EXECUTION_START",
                "EVENT_INPUT",
                "EVENT_MODEL_CALL",
                "EVENT_ERROR",
                "EVENT_ERROR",
            ]
            flaky.down = False
            resumed = await resume(host, uid)
            assert resumed.exec_state == session_pb2.EXEC_COMPLETED
            recs = await store.read(uid)
            assert kinds(recs[5:]) == ["EVENT_OUTPUT", "EVENT_END", "EVENT_LIFECYCLE:LIFECYCLE_RESUME"]
            assert text_of(recs[5]) == "echo:hi" and recs[5].event.execution_id == recs[0].event.execution_id
            assert kinds(recs).count("EVENT_MODEL_CALL") == 1
            assert flaky.attempts == 3
            report = await host.controller.replay(uid)
            assert report.outputs == ["echo:hi"] and flaky.attempts == 3


class TestRecoveryHarnessIdentity:
    @pytest.mark.parametrize(
        ("harness", "version", "why"),
        [
            ("wire-echo", "0.9", "version '0.9'"),
            ("retired-harness", "1", "'retired-harness', which this host does not serve"),
        ],
        ids=["other-version", "not-served"],
    )
    async def test_resume_refuses_a_harness_other_than_the_recorded_one(
        self, host: HostUnderTest, model: CountingModel, harness: str, version: str, why: str
    ) -> None:
        uid = await new_session(host, "wire-echo")
        start = execution_start(harness=harness)
        start.execution_start.harness_version = version
        await append_raw(host.store, uid, [start, user_input("hi")])
        await resume_refused(host, model, uid, why)

    async def test_a_complete_session_resumes_without_reaching_its_harness(self, store: JournalStore) -> None:
        async with (
            served(ChatHarness()) as address,
            running_host(store, remote={"gone-later": address}) as host,
        ):
            uid = await new_session(host, "gone-later")
            await host.exec(say(uid, "hi"))
        # The harness is gone; the journal holds only complete turns, so Resume does not need it.
        async with running_host(store, remote={"gone-later": "127.0.0.1:9"}) as host:
            resumed = await resume(host, uid)
            assert resumed.compute_state == session_pb2.COMPUTE_LIVE and resumed.last_seq == 6


class TestOverlap:
    async def test_suspend_and_resume_during_a_running_turn_are_aborted(self, store: JournalStore) -> None:
        gate = GateHarness()
        async with running_host(store, local={"gate": gate}) as host:
            uid = await new_session(host, "gate")
            running = asyncio.create_task(host.exec(say(uid, "hold")))
            async with asyncio.timeout(10):
                await gate.entered.wait()
            for call in (
                host.sessions.Suspend(session_pb2.SuspendRequest(session=uid)),
                host.sessions.Resume(session_pb2.ResumeRequest(session=uid)),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call
                assert err.value.code() == grpc.StatusCode.ABORTED
            gate.release.set()
            assert kinds(records(await running))[-1] == "EVENT_END"
            assert "EVENT_LIFECYCLE:LIFECYCLE_SUSPEND" not in kinds(await store.read(uid))


class CountingTools:
    """A host tool executor that answers every call and keeps it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, common_pb2.ToolCall]] = []

    async def execute(self, session_uid: str, call: common_pb2.ToolCall) -> common_pb2.ToolResult:
        self.calls.append((session_uid, call))
        return common_pb2.ToolResult(
            id=call.id, content=[common_pb2.Part(text=common_pb2.TextPart(text="sunny"))]
        )


@pytest.fixture
def tools() -> CountingTools:
    return CountingTools()


@pytest.fixture
async def tool_host(
    store: JournalStore, model: CountingModel, tools: CountingTools
) -> AsyncIterator[HostUnderTest]:
    async with (
        served(ToolCaller()) as address,
        running_host(store, remote={"tool-caller": address}, model=model, tools=tools) as host,
    ):
        yield host


async def interrupted_at_tool_intent(host: HostUnderTest) -> str:
    uid = await new_session(host, "tool-caller")
    intent = common_pb2.Event(execution_id=EID, kind=K.EVENT_TOOL_CALL, tool=lookup_call())
    await append_raw(
        host.store, uid, [execution_start(harness="tool-caller"), user_input("weather?"), intent]
    )
    return uid


class TestResumeToolIntent:
    async def test_inherited_tool_intent_in_a_fork_child_fails_precondition(
        self, tool_host: HostUnderTest, tools: CountingTools
    ) -> None:
        parent = await interrupted_at_tool_intent(tool_host)
        forked = await tool_host.sessions.Fork(session_pb2.ForkRequest(session=parent, at_seq=3))
        (child,) = [c.metadata.uid for c in forked.children]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await resume(tool_host, child)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "copied from the parent by a fork" in (err.value.details() or "")
        assert tools.calls == []
        # Refused from the journal before the harness ran: nothing written to the child.
        assert kinds((await tool_host.store.read(child))[4:]) == []

        # The child may still run a new turn of its own.
        fresh = records(await tool_host.exec(say(child, "new turn")))
        assert kinds(fresh)[-1] == "EVENT_END"
        assert [s for s, _ in tools.calls] == [child]

    async def test_the_parent_redrives_its_own_intent_once_with_the_recorded_key(
        self, tool_host: HostUnderTest, tools: CountingTools
    ) -> None:
        uid = await interrupted_at_tool_intent(tool_host)
        await resume(tool_host, uid)
        recs = await tool_host.store.read(uid)
        assert kinds(recs[3:]) == [
            "EVENT_TOOL_RESULT",
            "EVENT_OUTPUT",
            "EVENT_END",
            "EVENT_LIFECYCLE:LIFECYCLE_RESUME",
        ]
        assert recs[3].event.result.id == "call-1"
        assert text_of(recs[4]) == "tool said: sunny"
        assert tools.calls == [(uid, lookup_call())]
        assert kinds(recs).count("EVENT_TOOL_CALL") == 1
