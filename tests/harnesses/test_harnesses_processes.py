"""Harnesses in their own processes, reached by the host over real gRPC on loopback.

Each test starts ``agentsessions-harness serve ...`` (or ``python -m ...``), waits for its
``listening on ADDRESS`` line, and drives it with ``RemoteHarness`` from the SDK's test
environment (a scripted host answering like the embedded echo model).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from agentsessions.host.harnesslink import RemoteHarness
from agentsessions.sdk import ModelCall, text_message
from agentsessions.sdk.testing import HarnessEnvironment
from agentsessions.v1 import common_pb2
from tests.support.processes import BIN, harness_process, stop

pytestmark = pytest.mark.e2e


def echo(call: ModelCall) -> str:
    """Answers like the host's embedded echo model."""
    return "echo:" + call.messages[-1].text()


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
            env = HarnessEnvironment(remote, model=echo, session="sess-e2e")
            first = await env.run("hi")
            second = await env.run("bye")
            report = await env.replay()
        finally:
            await remote.close()
        assert await stop(served) == 0
    assert (descriptor.id, descriptor.version) == ("echo", "1")
    assert (first.state, first.outputs) == ("COMPLETED", ["echo:hi"])
    assert second.outputs == ["echo:bye"]
    assert [call.model for call in env.requests] == ["echo", "echo"]
    assert (report.executions, report.model_calls) == (2, 0)


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
            env = HarnessEnvironment(remote, model=echo, journal=history, session="sess-chat")
            outcome = await env.run("now", config=b'{"system_prompt": "short answers"}')
        finally:
            await remote.close()
        assert await stop(served) == 0
    (call,) = env.requests
    assert [(m.role, m.text()) for m in call.messages] == [
        ("system", "short answers"),
        ("user", "earlier"),
        ("assistant", "echo:earlier"),
        ("user", "now"),
    ]
    assert outcome.outputs == ["echo:now"]


async def test_stop_on_stdin_eof_stops_gracefully_when_the_pipe_closes(tmp_path: Path) -> None:
    # What a host that started the process relies on: the pipe closes when the host goes away.
    argv = [
        str(BIN / "agentsessions-harness"),
        "serve",
        "agentsessions.harnesses.echo:EchoHarness",
        "--listen",
        "127.0.0.1:0",
        "--stop-on-stdin-eof",
    ]
    async with harness_process(argv, tmp_path, stdin=asyncio.subprocess.PIPE) as served:
        remote = RemoteHarness(served.address)
        try:
            assert (await remote.describe()).id == "echo"
        finally:
            await remote.close()
        process = served.process
        assert process.stdin is not None and process.stderr is not None
        process.stdin.close()
        async with asyncio.timeout(30):
            assert await process.wait() == 0
            error = (await process.stderr.read()).decode()
        assert "standard input closed: stopping" in error


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
