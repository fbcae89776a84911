"""The echo and chat harnesses in the SDK's test environment: what each one asks the host's model."""

from __future__ import annotations

import pytest

from agentsessions.harnesses.chat import ChatConfigError, ChatHarness
from agentsessions.harnesses.echo import EchoHarness
from agentsessions.sdk import Message, ModelCall
from agentsessions.sdk.testing import HarnessEnvironment, check_replay
from agentsessions.v1 import harness_pb2


def echo(call: ModelCall) -> str:
    """Answers like the host's embedded echo model."""
    return "echo:" + (call.messages[-1].text() if call.messages else "")


async def test_echo_describes_itself_as_the_reference_echo() -> None:
    descriptor = await EchoHarness().describe()
    assert (descriptor.id, descriptor.version) == ("echo", "1")
    assert descriptor.capabilities.resumability == harness_pb2.RESUMABILITY_STATELESS_REPLAY


async def test_echo_sends_only_the_last_input() -> None:
    env = HarnessEnvironment(EchoHarness(), model=echo)
    outcome = await env.run("first", "second")
    (call,) = env.requests
    assert call.model == "echo"
    assert list(call.messages) == [Message.user("second")]
    assert outcome.kinds() == ["EXECUTION_START", "INPUT", "INPUT", "MODEL_CALL", "OUTPUT", "END"]
    assert outcome.outputs == ["echo:second"]


async def test_echo_without_inputs_sends_an_empty_prompt() -> None:
    env = HarnessEnvironment(EchoHarness(), model=echo)
    await env.run()
    assert list(env.requests[0].messages) == [Message.user("")]


async def test_chat_builds_system_history_then_inputs() -> None:
    env = HarnessEnvironment(ChatHarness(model="gpt-test"), model=["hi there", "fine"])
    await env.run("hello")
    await env.run("and now?", config={"system_prompt": "be brief"})
    second = env.requests[1]
    assert second.model == "gpt-test"
    assert list(second.messages) == [
        Message.system("be brief"),
        Message.user("hello"),
        Message.assistant("hi there"),
        Message.user("and now?"),
    ]


async def test_chat_replays_a_conversation() -> None:
    report = await check_replay(ChatHarness(), "one", "two", "three", model=echo)
    assert (report.executions, report.model_calls) == (3, 0)
    assert report.outputs == ["echo:one", "echo:two", "echo:three"]


async def test_chat_without_config_has_no_system_message() -> None:
    env = HarnessEnvironment(ChatHarness(), model=echo)
    await env.run("q")
    assert [m.role for m in env.requests[0].messages] == ["user"]
    assert env.requests[0].model == ""


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (b"{not json", "not JSON"),
        (b'["a list"]', "must be a JSON object"),
        (b'{"system_prompt": 3}', "must be a string"),
        (b"\xff\xfe", "not JSON"),
    ],
)
async def test_chat_refuses_malformed_config_before_any_model_call(config: bytes, message: str) -> None:
    env = HarnessEnvironment(ChatHarness(), model=echo)
    outcome = await env.run("q", config=config)
    assert outcome.state == "FAILED" and isinstance(outcome.error, ChatConfigError)
    assert message in str(outcome.error)
    assert env.requests == [] and env.model_calls == 0


async def test_chat_describes_itself() -> None:
    descriptor = await ChatHarness(model="gpt-test").describe()
    assert (descriptor.id, descriptor.version, list(descriptor.models)) == ("chat", "1", ["gpt-test"])
