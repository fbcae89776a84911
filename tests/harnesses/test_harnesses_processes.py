"""Harnesses in their own processes, reached by the host over real gRPC on loopback.

Each test starts ``agentsessions-harness serve ...`` (or ``python -m ...``), waits for its
``listening on ADDRESS`` line, and drives it with ``RemoteHarness`` and a recording host sink
backed by the embedded echo model.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from agentsessions.host.harnesslink import RemoteHarness
from agentsessions.host.models.echo import EchoModel
from agentsessions.sdk import Start, text_message
from agentsessions.sdk.harness import message_text
from agentsessions.v1 import common_pb2, harness_pb2
from tests.support.processes import BIN, harness_process, stop

pytestmark = pytest.mark.e2e


class EchoHostSink:
    """The host side: answers model calls with the embedded echo model and records them."""

    def __init__(self) -> None:
        self.model_calls: list[common_pb2.ModelCall] = []
        self.completions: list[str] = []

    async def model(self, call: common_pb2.ModelCall) -> harness_pb2.ModelResult:
        self.model_calls.append(call)
        result = await EchoModel().complete(call)
        self.completions.append(message_text(result.message))
        return result

    async def output(self, text: str) -> None:
        raise AssertionError("not expected from echo or chat")

    async def tool_call(self, call: common_pb2.ToolCall) -> common_pb2.ToolResult:
        raise AssertionError("not expected from echo or chat")

    async def report(self, result: common_pb2.ToolResult) -> None:
        raise AssertionError("not expected from echo or chat")

    async def usage(self, usage: common_pb2.Usage) -> None:
        raise AssertionError("not expected from echo or chat")


async def test_echo_round_trip_with_the_console_script(tmp_path: Path) -> None:
    argv = [
        str(BIN / "agentsessions-harness"),
        "serve",
        "agentsessions.harnesses.echo:EchoHarness",
        "--listen",
        "127.0.0.1:0",
    ]
    async with harness_process(argv, tmp_path) as served:
        remote = RemoteHarness(served.address)
        try:
            descriptor = await remote.describe()
            sink = EchoHostSink()
            await remote.run(
                Start(
                    session="sess-e2e", execution_id="a1b2c3d4e5f60718", inputs=[text_message("user", "hi")]
                ),
                sink,
            )
            second = EchoHostSink()
            await remote.run(
                Start(
                    session="sess-e2e", execution_id="a1b2c3d4e5f60719", inputs=[text_message("user", "bye")]
                ),
                second,
            )
        finally:
            await remote.close()
        assert await stop(served) == 0
    assert (descriptor.id, descriptor.version) == ("echo", "1")
    assert sink.completions == ["echo:hi"]
    assert second.completions == ["echo:bye"]
    assert [call.model for call in sink.model_calls] == ["echo"]


async def test_chat_module_serves_on_a_unix_socket(tmp_path: Path) -> None:
    socket_path = tmp_path / "chat.sock"
    argv = [sys.executable, "-m", "agentsessions.harnesses.chat", "--listen", f"unix:{socket_path}"]
    history = [
        common_pb2.Event(kind=common_pb2.EVENT_INPUT, message=text_message("user", "earlier")),
        common_pb2.Event(kind=common_pb2.EVENT_OUTPUT, message=text_message("assistant", "echo:earlier")),
    ]
    async with harness_process(argv, tmp_path) as served:
        assert served.address == f"unix:{socket_path}"
        remote = RemoteHarness(f"unix://{socket_path}")
        try:
            sink = EchoHostSink()
            await remote.run(
                Start(
                    session="sess-chat",
                    execution_id="0000111122223333",
                    inputs=[text_message("user", "now")],
                    history=history,
                    config=b'{"system_prompt": "short answers"}',
                ),
                sink,
            )
        finally:
            await remote.close()
        assert await stop(served) == 0
    (call,) = sink.model_calls
    assert [(m.role, message_text(m)) for m in call.messages] == [
        ("system", "short answers"),
        ("user", "earlier"),
        ("assistant", "echo:earlier"),
        ("user", "now"),
    ]
    assert sink.completions == ["echo:now"]


async def test_unknown_target_exits_with_a_clear_error(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        str(BIN / "agentsessions-harness"),
        "serve",
        "agentsessions.harnesses.echo:NoSuchHarness",
        "--listen",
        "127.0.0.1:0",
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        stdout, stderr = await process.communicate()
    assert process.returncode == 1
    assert stdout == b""
    assert b"has no attribute 'NoSuchHarness'" in stderr
