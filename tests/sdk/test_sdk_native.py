"""The native author API (``Execution``, ``define_harness``) against the SDK's test kit: the
replay rules it builds in, each shown with the failure a harness written on raw sink calls has."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from agentsessions.sdk import (
    ApprovalParkedError,
    EventSink,
    Execution,
    HarnessDescriptor,
    Mediation,
    Message,
    ModelResult,
    NativeHarness,
    Start,
    TextPart,
    ToolCall,
    ToolError,
    ToolResult,
    ToolSpec,
    Usage,
    convert,
    define_harness,
    find_park,
    run_server,
    serve,
    start_server,
)
from agentsessions.sdk.callids import completion_call_id, direct_call_id, idempotency_key
from agentsessions.sdk.execution import DUMP_DIR_ENV
from agentsessions.sdk.servicer import HarnessServicer
from agentsessions.sdk.testing import HarnessEnvironment, ReplayDiverged, Reply, check_replay
from agentsessions.v1 import common_pb2, harness_pb2

K = common_pb2
HOST_TOOLS = (
    ToolSpec("lookup", mediation=Mediation.CONTROLLER_MEDIATED),
    ToolSpec("deploy", mediation=Mediation.REQUIRES_APPROVAL),
)


def completion(*calls: ToolCall, text: str = "") -> Message:
    return Message("assistant", ((TextPart(text),) if text else ()) + calls)


def lookups(*ids: str) -> Message:
    return completion(*(ToolCall(id=i, name="lookup", args={"key": i}) for i in ids))


def kinds(env: HarnessEnvironment, kind: int) -> list[common_pb2.Event]:
    return [e for e in env.events if e.kind == kind]


# -- a completion's tool calls reach the host in the completion's order ------------------------------


class Concurrent:
    """Runs a completion's tool calls concurrently, as pydantic-ai does; live, the framework gets
    to the first call only after the last one has started (a scheduling accident the replay does
    not repeat)."""

    def __init__(self) -> None:
        self.live = True

    async def gather(self, calls: Sequence[ToolCall], make: Any) -> list[Any]:
        last_started = asyncio.Event()

        async def one(position: int, call: ToolCall) -> Any:
            if position == len(calls) - 1:
                last_started.set()
            elif position == 0 and self.live:
                await last_started.wait()
            return await make(call)

        return list(await asyncio.gather(*(one(i, c) for i, c in enumerate(calls))))


@pytest.mark.parametrize("raw", [False, True], ids=["native", "raw-sink-calls"])
async def test_concurrent_tool_calls_replay_because_they_reach_the_host_in_completion_order(
    raw: bool,
) -> None:
    framework = Concurrent()

    class Agent(NativeHarness):
        descriptor = HarnessDescriptor(id="concurrent", version="1", tools=HOST_TOOLS)

        async def execute(self, ex: Execution) -> None:
            result = await ex.model([Message.user(ex.input_text())])
            if raw:  # what a harness on today's protocol-level sink does
                wire = [
                    convert.tool_call_to_proto(
                        ToolCall(c.id, c.name, c.args, Mediation.CONTROLLER_MEDIATED, "k-" + c.id)
                    )
                    for c in result.tool_calls
                ]
                await framework.gather(
                    result.tool_calls,
                    lambda c: ex.sink.tool_call(wire[[x.id for x in result.tool_calls].index(c.id)]),
                )
            else:
                await framework.gather(result.tool_calls, ex.call_tool)
            await ex.model([Message.user("done")])

    env = HarnessEnvironment(
        Agent(), model=[lookups("a", "b", "c"), "ok"], tools={"lookup": lambda args: args}
    )
    assert (await env.run("go")).state == "COMPLETED"
    framework.live = False
    if raw:
        assert [e.tool.id for e in kinds(env, K.EVENT_TOOL_CALL)] == ["b", "c", "a"]
        with pytest.raises(ReplayDiverged, match="tool call 'a' differs from the recorded intent: id is 'a'"):
            await env.replay()
        return
    assert [e.tool.id for e in kinds(env, K.EVENT_TOOL_CALL)] == ["a", "b", "c"]
    assert [e.tool.idempotency_key for e in kinds(env, K.EVENT_TOOL_CALL)] == [
        idempotency_key(e.execution_id, e.tool.id) for e in kinds(env, K.EVENT_TOOL_CALL)
    ]
    report = await env.replay()
    assert (report.executions, report.model_calls) == (1, 0)


async def test_a_call_the_framework_never_makes_does_not_hold_the_others_up() -> None:
    @define_harness(id="skipper", version="1", tools=HOST_TOOLS)
    async def skipper(ex: Execution) -> None:
        result = await ex.model([Message.user("go")])
        first, _, third = result.tool_calls
        await asyncio.gather(ex.call_tool(third), ex.call_tool(first))  # the middle one is dropped

    env = HarnessEnvironment(skipper, model=[lookups("a", "b", "c")], tools={"lookup": lambda args: args})
    assert (await env.run()).state == "COMPLETED"
    assert [e.tool.id for e in kinds(env, K.EVENT_TOOL_CALL)] == ["a", "c"]


# -- in-harness tools run once -------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [False, True], ids=["native", "raw-sink-calls"])
async def test_an_in_harness_side_effect_runs_once_across_resume_and_replay(raw: bool) -> None:
    lines: list[str] = []

    def append(args: dict[str, Any]) -> dict[str, Any]:
        lines.append(args["line"])
        return {"lines": len(lines)}

    class Agent(NativeHarness):
        descriptor = HarnessDescriptor(id="side-effects", version="1", tools=HOST_TOOLS)

        async def execute(self, ex: Execution) -> None:
            result = await ex.model([Message.user(ex.input_text())])
            log, deploy = result.tool_calls
            if raw:  # run it, then report it: what today's sink offers
                await ex.sink.report(convert.tool_result_to_proto(ToolResult.ok(log.id, append(log.args))))
            else:
                await ex.call_tool(log, append)
            await ex.call_tool(deploy)

    script: list[Reply] = [
        completion(ToolCall("w1", "append", {"line": "x"}), ToolCall("d1", "deploy")),
        "shipped",
    ]
    env = HarnessEnvironment(Agent(), model=script, tools={"deploy": lambda args: {"ok": True}})
    parked = await env.run("ship it")
    assert parked.state == "PARKED" and lines == ["x"]
    env.approve("go ahead")
    assert (await env.resume()).state == "COMPLETED"
    await env.replay()
    assert lines == (["x", "x", "x"] if raw else ["x"])


async def test_a_crash_after_the_report_does_not_repeat_the_tool() -> None:
    runs: list[int] = []

    def count(args: dict[str, Any]) -> dict[str, Any]:
        runs.append(1)
        return {"runs": len(runs)}

    @define_harness(id="once", version="1")
    async def once(ex: Execution) -> None:
        result = await ex.model([Message.user("go")])
        answers = await ex.run_tools(result, {"count": count})
        await ex.model([Message.user("go"), result.message, answers])

    env = HarnessEnvironment(once, model=[completion(ToolCall("c", "count")), "done"])
    assert (await env.run(crash_after=2)).state == "CRASHED"
    resumed = await env.resume()
    assert resumed.state == "COMPLETED" and runs == [1]
    assert (await env.replay()).recorded_results_served == 1 and runs == [1]


# -- a park is a park, however a framework wraps it ----------------------------------------------------


def deploy_call() -> ToolCall:
    return ToolCall("d1", "deploy", mediation=Mediation.REQUIRES_APPROVAL)


@pytest.mark.parametrize("how", ["bare", "cause", "context", "group"])
async def test_a_wrapped_park_still_parks(how: str) -> None:
    @define_harness(id="wrapper", version="1")
    async def wrapper(ex: Execution) -> None:
        if how == "group":
            async with asyncio.TaskGroup() as group:
                group.create_task(ex.call_tool(deploy_call()))
            return
        try:
            await ex.call_tool(deploy_call())
        except ApprovalParkedError as park:
            if how == "bare":
                raise
            if how == "cause":
                raise RuntimeError("tool deploy failed") from park
            raise RuntimeError("tool deploy failed")  # noqa: B904 - a framework that forgets "from"

    env = HarnessEnvironment(wrapper, tools={"deploy": lambda args: {}})
    outcome = await env.run()
    assert outcome.state == "PARKED", outcome.error
    assert outcome.kinds()[-1] == "APPROVAL_REQUEST"


async def test_an_error_raised_from_none_after_a_park_is_a_failure() -> None:
    @define_harness(id="unrelated", version="1")
    async def unrelated(ex: Execution) -> None:
        try:
            await ex.call_tool(deploy_call())
        except ApprovalParkedError:
            raise RuntimeError("cleanup failed") from None

    outcome = await HarnessEnvironment(unrelated, tools={"deploy": lambda args: {}}).run()
    assert outcome.state == "FAILED" and "cleanup failed" in str(outcome.error)
    park = ApprovalParkedError(common_pb2.ApprovalRef(tool_call_id="x", request_seq=1))
    assert find_park(ExceptionGroup("two", [park, ValueError("other")])) is None


# -- approvals carry reasons both ways ---------------------------------------------------------------


async def test_an_approval_request_has_a_reason_and_the_harness_learns_the_decision() -> None:
    seen: list[ToolResult] = []

    @define_harness(id="asker", version="1", tools=HOST_TOOLS)
    async def asker(ex: Execution) -> None:
        seen.append(
            await ex.call_tool(ToolCall("d1", "deploy", {"env": "prod"}), reason="prod deploys need a human")
        )

    env = HarnessEnvironment(asker, tools={"deploy": lambda args: {"deployed": args["env"]}})
    await env.run()
    assert env.approval_reason() == "prod deploys need a human"
    env.approve("change window is open")
    await env.resume()
    (result,) = seen
    assert result.output == {"deployed": "prod"} and not result.denied
    assert result.decision is not None
    assert (result.decision.approved, result.decision.reason) == (True, "change window is open")


# -- usage, ids, params --------------------------------------------------------------------------------


async def test_provider_usage_is_journaled_once_and_served_on_replay() -> None:
    got: list[Usage | None] = []

    @define_harness(id="counter-of-tokens", version="1")
    async def tokens(ex: Execution) -> None:
        result = await ex.model([Message.user("hi")], params={"temperature": "0"})
        got.append(result.usage)
        assert result.usage is not None
        await ex.usage(result.usage)  # already journaled: not again
        await ex.usage(Usage("embedder", 9, 0))  # other accounting: journaled

    usage = Usage("m", 3, 4)
    env = HarnessEnvironment(tokens, model=[ModelResult(Message.assistant("hello"), usage)])
    await env.run()
    assert [convert.usage_from_proto(e.usage) for e in kinds(env, K.EVENT_USAGE)] == [
        usage,
        Usage("embedder", 9, 0),
    ]
    assert dict(kinds(env, K.EVENT_MODEL_CALL)[0].model.params) == {"temperature": "0"}
    assert env.requests[0].params == {"temperature": "0"}
    await env.replay()
    assert got == [usage, usage]


async def test_tool_call_ids_are_settled_deterministically() -> None:
    @define_harness(id="ids", version="1", tools=HOST_TOOLS)
    async def ids(ex: Execution) -> None:
        for _ in range(2):
            result = await ex.model([Message.user("go")])
            for call in result.tool_calls:
                await ex.call_tool(call)
        await ex.call_tool(ToolCall("", "lookup"))

    repeated = lookups("call_0", "")
    env = HarnessEnvironment(ids, model=[repeated, repeated], tools={"lookup": lambda args: {}})
    outcome = await env.run()
    execution = outcome.execution_id
    assert [e.tool.id for e in kinds(env, K.EVENT_TOOL_CALL)] == [
        "call_0",  # the model's own id
        completion_call_id(execution, 0, 1),  # none given
        completion_call_id(execution, 1, 0),  # a repeat of an id used before
        completion_call_id(execution, 1, 1),
        direct_call_id(execution, 0),  # a call the harness made on its own
    ]
    await env.replay()


# -- cancel hook, dumps, divergence reports ---------------------------------------------------------------


async def test_a_cancellable_harness_hears_the_cancel_while_busy() -> None:
    reasons: list[str] = []

    @define_harness(id="waiter", version="1", cancellable=True)
    async def waiter(ex: Execution) -> None:
        await ex.output("working")
        async with asyncio.timeout(30):
            reasons.append(await ex.cancelled())

    env = HarnessEnvironment(waiter)
    running = asyncio.create_task(env.run())
    async with asyncio.timeout(10):
        await env.journaled(K.EVENT_OUTPUT)
    await env.cancel("user pressed stop")
    outcome = await running
    assert outcome.state == "CANCELED" and reasons == ["user pressed stop"]
    assert waiter.cancel is not None, "cancellable harnesses expose the hook"


async def test_requests_are_dumped_with_the_hash_the_journal_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DUMP_DIR_ENV, str(tmp_path))

    @define_harness(id="dumped", version="1")
    async def dumped(ex: Execution) -> None:
        await ex.model([Message.system("rules"), Message.user(ex.input_text())], model="m")

    env = HarnessEnvironment(dumped, model=["hi"])
    outcome = await env.run("hello")
    await env.replay()
    files = sorted(p.name for p in (tmp_path / env.session).iterdir())
    assert files == [f"{outcome.execution_id}-live-001.json", f"{outcome.execution_id}-replay-001.json"]
    live = json.loads((tmp_path / env.session / files[0]).read_text())
    assert live["input_hash"] == kinds(env, K.EVENT_MODEL_CALL)[0].model.input_hash
    assert live["request"]["messages"][0] == {"role": "system", "parts": [{"text": {"text": "rules"}}]}


async def test_a_replay_divergence_names_the_message_and_the_character() -> None:
    class Prompted(NativeHarness):
        descriptor = HarnessDescriptor(id="prompted", version="1")
        prompt = "You are terse."

        async def execute(self, ex: Execution) -> None:
            await ex.model([Message.system(self.prompt), Message.user(ex.input_text())])

    harness = Prompted()
    env = HarnessEnvironment(harness, model=["ok"])
    await env.run("hi")
    harness.prompt = "You are tense."
    with pytest.raises(ReplayDiverged) as diverged:
        await env.replay()
    assert "model call 1 differs from the live one: messages differ: message 0 (system): " in str(
        diverged.value
    )
    assert "part 0 text differs from character 10: 'nse.', was 'rse.'" in str(diverged.value)


async def test_check_replay_runs_turns_and_decides_approvals() -> None:
    @define_harness(id="round", version="1", tools=HOST_TOOLS)
    async def round_trip(ex: Execution) -> None:
        result = await ex.model(ex.conversation())
        if result.tool_calls:
            await ex.run_tools(result, {})

    report = await check_replay(
        round_trip,
        "first",
        "second",
        model=[completion(ToolCall("d", "deploy"), ToolCall("u", "unknown")), "fine"],
        tools={"deploy": lambda args: {"ok": True}},
        decide=lambda call: (call.name == "deploy", "reviewed"),
    )
    assert (report.executions, report.model_calls, report.recorded_results_served) == (2, 0, 1)


async def test_conversation_rebuilds_tool_exchanges_and_drops_unanswered_calls() -> None:
    @define_harness(id="talker", version="1", tools=HOST_TOOLS)
    async def talker(ex: Execution) -> None:
        messages = ex.conversation()
        while (result := await ex.model(messages)).tool_calls:
            messages += [result.message, await ex.run_tools(result, {"echo": lambda args: args})]

    script: list[Reply] = [
        completion(ToolCall("e1", "echo", {"n": 3}), text="echoing"),
        "echoed",
        completion(ToolCall("d1", "deploy")),  # parks; later cancelled: never answered
        "third",
    ]
    env = HarnessEnvironment(talker, model=script, tools={"deploy": lambda args: {}})
    await env.run("one")
    await env.run("two")
    assert env.pending_approval() is not None
    env.events.append(
        common_pb2.Event(
            execution_id=kinds(env, K.EVENT_EXECUTION_START)[-1].execution_id,
            kind=K.EVENT_END,
            end=common_pb2.HarnessEnd(state="CANCELED"),
        )
    )
    await env.run("three")
    messages = env.requests[-1].messages
    assert [(m.role, m.text()) for m in messages] == [
        ("user", "one"),
        ("assistant", "echoing"),
        ("tool", ""),
        ("assistant", "echoed"),
        ("user", "two"),
        ("user", "three"),
    ]
    assert messages[2].tool_results[0].output == {"n": 3}


# -- refusing what is not a harness ---------------------------------------------------------------------


class NotAHarness:
    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return harness_pb2.HarnessDescriptor(id="x", version="1")


class AHarness:
    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return harness_pb2.HarnessDescriptor(id="x", version="1")

    async def run(self, start: Start, sink: EventSink) -> None:
        return None


async def test_serving_something_that_is_not_a_harness_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"start_server needs a harness.*got a NotAHarness without run"):
        await start_server(NotAHarness(), "127.0.0.1:0")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"got the class AHarness: pass an instance, AHarness\(\)"):
        await serve(AHarness, "127.0.0.1:0")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"decorate it with @agentsessions\.sdk\.define_harness"):
        run_server(lambda: None, "127.0.0.1:0")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="HarnessServicer needs a harness"):
        HarnessServicer(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="HarnessEnvironment needs a harness"):
        HarnessEnvironment(NotAHarness())  # type: ignore[arg-type]


async def test_a_tool_error_is_reported_and_other_exceptions_fail_the_execution() -> None:
    def broken(args: dict[str, Any]) -> Any:
        raise ToolError("disk full")

    @define_harness(id="tools", version="1")
    async def tools(ex: Execution) -> None:
        failed = await ex.call_tool(ToolCall("t1", "write"), broken)
        assert failed.is_error and failed.error == "disk full"
        await ex.call_tool(ToolCall("t2", "write"), lambda args: 1 / 0)

    outcome = await HarnessEnvironment(tools).run()
    assert outcome.state == "FAILED" and isinstance(outcome.error, ZeroDivisionError)
    assert [e.result.error for e in outcome.events if e.kind == K.EVENT_TOOL_RESULT] == ["disk full"]
