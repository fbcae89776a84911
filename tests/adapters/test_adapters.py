"""The framework adapters under the SDK's test kit: each framework's real agent loop, with the
host played by ``agentsessions.sdk.testing.HarnessEnvironment`` (the host's rules, a scripted model).

What a harness author relies on, per framework: a completion's concurrent tool calls reach the
host in the completion's order; an in-harness tool's side effect happens once, live, never on
Resume (after a park or a crash) nor on replay; the framework's approval primitive parks the turn
(and the park survives the framework's own exception handling); the framework's streaming API
is fed from the host's result; sampling settings are journaled as the call's params.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from agentsessions.sdk import Message, ToolCall, find_park
from agentsessions.sdk.testing import HarnessEnvironment, check_replay
from agentsessions.v1 import common_pb2
from tests.adapters.shops import FRAMEWORKS, build, host_tools

K = common_pb2


def completion(*calls: ToolCall) -> Message:
    return Message("assistant", calls)


def note(call_id: str, tool: str, text: str) -> ToolCall:
    return ToolCall(call_id, tool, {"text": text})


LOOKUP = ToolCall("call_lookup", "lookup_order", {"order_id": "A-1"})
REFUND = ToolCall("call_refund", "refund", {"order_id": "A-1", "amount_cents": 500})


def tool_effects(env: HarnessEnvironment) -> list[str]:
    """The journal's tool records in order: ``call:<tool>`` for an intent, ``result:<id>``."""
    out = []
    for event in env.events:
        if event.kind == K.EVENT_TOOL_CALL:
            out.append(f"call:{event.tool.tool}")
        elif event.kind == K.EVENT_TOOL_RESULT:
            out.append(f"result:{event.result.id}")
    return out


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_concurrent_tool_calls_reach_the_host_in_completion_order(framework: str) -> None:
    shop = build(framework)
    env = HarnessEnvironment(
        shop.harness,
        model=[
            completion(
                note("call_slow", "slow_note", "first"), note("call_fast", "fast_note", "second"), LOOKUP
            ),
            "done",
        ],
        tools=host_tools(),
    )
    outcome = await env.run("note twice, then look A-1 up")
    assert outcome.state == "COMPLETED", outcome.error
    # slow_note yields to the loop long enough for fast_note to finish first if it could.
    assert shop.effects == ["first", "second"]
    assert tool_effects(env) == [
        "result:call_slow",
        "result:call_fast",
        "call:lookup_order",
        "result:call_lookup",
    ]
    # The model saw the results in the completion's order too.
    answered = [r.id for m in env.requests[1].messages if m.role == "tool" for r in m.tool_results]
    assert answered == ["call_slow", "call_fast", "call_lookup"]
    report = await env.replay()
    assert report.model_calls == 0 and report.recorded_results_served == 2
    assert shop.effects == ["first", "second"], "an in-harness tool ran again on replay"


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_a_parked_completion_runs_no_in_harness_tool_until_the_decision(framework: str) -> None:
    shop = build(framework)
    env = HarnessEnvironment(
        shop.harness,
        model=[completion(REFUND, note("call_note", "fast_note", "refund asked")), "refunded"],
        tools=host_tools(),
    )
    parked = await env.run("refund A-1")
    assert parked.state == "PARKED", parked.error
    assert env.approval_reason() == "refund 500 of A-1"
    # The framework ran both calls at once; the note waited for the refund, which parked.
    assert shop.effects == [], "an in-harness tool ran while the turn was parking"
    env.approve("fine")
    resumed = await env.resume()
    assert resumed.state == "COMPLETED", resumed.error
    assert shop.effects == ["refund asked"]
    assert [c.name for c in env.tool_runs] == ["refund"]
    report = await env.replay()
    assert report.model_calls == 0 and report.outputs[-1] == "refunded"
    assert shop.effects == ["refund asked"]
    assert [c.name for c in env.tool_runs] == ["refund"], "a host tool ran again on replay"


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_an_in_harness_side_effect_is_not_repeated_when_a_crashed_turn_resumes(framework: str) -> None:
    shop = build(framework)
    env = HarnessEnvironment(
        shop.harness,
        model=[completion(note("call_note", "fast_note", "once"), LOOKUP), "done"],
        tools=host_tools(),
    )
    # Effects: the model call, the note's report, then the lookup: crash on the lookup.
    crashed = await env.run("note and look up", crash_after=2)
    assert crashed.state == "CRASHED", crashed.error
    assert shop.effects == ["once"]
    resumed = await env.resume()
    assert resumed.state == "COMPLETED", resumed.error
    assert shop.effects == ["once"], "Resume ran the in-harness tool again"
    assert env.model_calls == 2
    await env.replay()
    assert shop.effects == ["once"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_the_park_leaves_the_framework_as_a_park(framework: str) -> None:
    shop = build(framework)
    env = HarnessEnvironment(shop.harness, model=[completion(REFUND)], tools=host_tools())
    start, sink = await env.begin("refund A-1")
    with pytest.raises(BaseException) as raised:
        async with asyncio.timeout(30):
            await shop.harness.run(start, sink)
    park = find_park(raised.value)
    assert park is not None, f"{framework} hid the park in {raised.value!r}"
    assert park.ref.tool_call_id == "call_refund"
    requests = [e for e in env.events if e.kind == K.EVENT_APPROVAL_REQUEST]
    assert [r.approval.reason for r in requests] == ["refund 500 of A-1"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_a_denied_approval_reaches_the_model_and_runs_nothing(framework: str) -> None:
    shop = build(framework)
    env = HarnessEnvironment(shop.harness, model=[completion(REFUND), "sorry"], tools=host_tools())
    assert (await env.run("refund A-1")).state == "PARKED"
    env.deny("not this one")
    resumed = await env.resume()
    assert resumed.state == "COMPLETED", resumed.error
    assert env.tool_runs == []
    seen = [r for m in env.requests[-1].messages if m.role == "tool" for r in m.tool_results]
    assert len(seen) == 1 and "denied" in seen[0].text(), seen
    assert (await env.replay()).model_calls == 0


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_the_streaming_api_is_fed_from_the_host_result(framework: str) -> None:
    shop = build(framework, stream=True)
    report = await check_replay(
        shop.harness,
        "look A-1 up",
        "and refund it",
        model=[completion(LOOKUP), "delivered", completion(REFUND), "refunded"],
        tools=host_tools(),
    )
    assert report.model_calls == 0
    assert report.outputs == ["", "delivered", "", "refunded"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_a_later_turn_continues_the_journaled_conversation(framework: str) -> None:
    shop = build(framework)
    env = HarnessEnvironment(
        shop.harness, model=[completion(LOOKUP), "it was delivered", "you are welcome"], tools=host_tools()
    )
    assert (await env.run("where is A-1?")).state == "COMPLETED"
    assert (await env.run("thanks")).state == "COMPLETED"
    last = env.requests[-1].messages
    roles = [m.role for m in last if m.role != "system"]
    assert roles == ["user", "assistant", "tool", "assistant", "user"], roles
    assert last[-1].text() == "thanks"
    assert (await env.replay()).executions == 2


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_sampling_settings_are_the_calls_params(framework: str) -> None:
    shop = build(framework, temperature=0.25)
    env = HarnessEnvironment(shop.harness, model=["hello"])
    assert (await env.run("hi")).state == "COMPLETED"
    (call,) = [e.model for e in env.events if e.kind == K.EVENT_MODEL_CALL]
    assert dict(call.params) == {"temperature": "0.25", "max_tokens": "64"}


def test_importing_the_sdk_imports_no_framework() -> None:
    frameworks = ("pydantic_ai", "agents", "langgraph", "langchain_core", "pydantic", "openai")
    probe = (
        "import sys, agentsessions.sdk, agentsessions.sdk.testing, agentsessions.sdk.adapters; "
        f"print([m for m in {frameworks!r} if m in sys.modules])"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_cancel_ends_a_turn_blocked_in_an_in_harness_tool(framework: str) -> None:
    shop = build(framework)
    env = HarnessEnvironment(shop.harness, model=[completion(ToolCall("call_hold", "hold", {}))])
    turn = asyncio.create_task(env.run("wait"))
    async with asyncio.timeout(30):
        await shop.holding.wait()
        await env.cancel("the customer left")
        outcome = await turn
    assert outcome.state == "CANCELED", (outcome.state, outcome.error)
    assert [e for e in env.events if e.kind == K.EVENT_TOOL_RESULT] == []
