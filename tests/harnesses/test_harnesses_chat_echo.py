"""The echo and chat harnesses against a recording sink: what each one asks the host's model."""

from __future__ import annotations

import pytest

from agentsessions.harnesses.chat import ChatConfigError, ChatHarness
from agentsessions.harnesses.echo import EchoHarness
from agentsessions.sdk import Start, text_message
from agentsessions.sdk.harness import message_text
from agentsessions.v1 import common_pb2, harness_pb2

K = common_pb2.EventKind


class RecordingSink:
    """Stands in for the host: records model calls and answers like the echo model."""

    def __init__(self) -> None:
        self.calls: list[common_pb2.ModelCall] = []

    async def model(self, call: common_pb2.ModelCall) -> harness_pb2.ModelResult:
        self.calls.append(call)
        return harness_pb2.ModelResult(
            message=text_message("assistant", "echo:" + message_text(call.messages[-1]))
        )

    async def output(self, text: str) -> None:
        raise AssertionError("these harnesses only call the model")

    async def tool_call(self, call: common_pb2.ToolCall) -> common_pb2.ToolResult:
        raise AssertionError("these harnesses call no tools")

    async def report(self, result: common_pb2.ToolResult) -> None:
        raise AssertionError("these harnesses report nothing")

    async def usage(self, usage: common_pb2.Usage) -> None:
        raise AssertionError("these harnesses report no usage")


def start(*inputs: str, history: list[common_pb2.Event] | None = None, config: bytes = b"") -> Start:
    return Start(
        session="s",
        execution_id="e",
        inputs=[text_message("user", text) for text in inputs],
        history=history or [],
        config=config,
    )


async def test_echo_describes_itself_as_the_reference_echo() -> None:
    descriptor = await EchoHarness().describe()
    assert (descriptor.id, descriptor.version) == ("echo", "1")
    assert descriptor.capabilities.resumability == harness_pb2.RESUMABILITY_STATELESS_REPLAY


async def test_echo_sends_only_the_last_input() -> None:
    sink = RecordingSink()
    await EchoHarness().run(start("first", "second"), sink)
    (call,) = sink.calls
    assert call.model == "echo"
    assert list(call.messages) == [text_message("user", "second")]


async def test_echo_without_inputs_sends_an_empty_prompt() -> None:
    sink = RecordingSink()
    await EchoHarness().run(start(), sink)
    assert list(sink.calls[0].messages) == [text_message("user", "")]


async def test_chat_builds_system_history_then_inputs() -> None:
    history = [
        common_pb2.Event(
            kind=K.EVENT_EXECUTION_START, execution_start=common_pb2.ExecutionStart(input_count=1)
        ),
        common_pb2.Event(kind=K.EVENT_INPUT, message=text_message("user", "hello")),
        common_pb2.Event(kind=K.EVENT_MODEL_CALL, model=common_pb2.ModelCall(model="m", id="x")),
        common_pb2.Event(kind=K.EVENT_OUTPUT, message=text_message("assistant", "hi there")),
        common_pb2.Event(kind=K.EVENT_END, end=common_pb2.HarnessEnd(state="COMPLETED")),
    ]
    sink = RecordingSink()
    await ChatHarness(model="gpt-test").run(
        start("and now?", history=history, config=b'{"system_prompt": "be brief"}'), sink
    )
    (call,) = sink.calls
    assert call.model == "gpt-test"
    assert list(call.messages) == [
        text_message("system", "be brief"),
        text_message("user", "hello"),
        text_message("assistant", "hi there"),
        text_message("user", "and now?"),
    ]


async def test_chat_without_config_has_no_system_message() -> None:
    sink = RecordingSink()
    await ChatHarness().run(start("q"), sink)
    assert [m.role for m in sink.calls[0].messages] == ["user"]
    assert sink.calls[0].model == ""


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
    sink = RecordingSink()
    with pytest.raises(ChatConfigError, match=message):
        await ChatHarness().run(start("q", config=config), sink)
    assert sink.calls == []


async def test_chat_describes_itself() -> None:
    descriptor = await ChatHarness(model="gpt-test").describe()
    assert (descriptor.id, descriptor.version, list(descriptor.models)) == ("chat", "1", ["gpt-test"])
