"""McpExecutor against a real MCP server process over stdio (tests/tools/mcp_tool_server.py)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import struct_pb2

from agentsessions.host.tools import (
    McpExecutor,
    ToolExecutorStartError,
    ToolRegistry,
    parse_mcp_server_flag,
)
from agentsessions.v1 import common_pb2
from tests.tools.receipts import DictReceiptStore

SERVER = Path(__file__).with_name("mcp_tool_server.py")
SESSION = "sess-0000000000000000000000aa"


def server_executor(env: dict[str, str] | None = None) -> McpExecutor:
    return McpExecutor("test", sys.executable, [str(SERVER)], env=env, start_timeout_s=60, stop_timeout_s=15)


@pytest.fixture
async def executor() -> AsyncIterator[McpExecutor]:
    mcp = server_executor()
    await mcp.start()
    try:
        yield mcp
    finally:
        await mcp.stop()


def call(tool: str, args: dict[str, Any], *, key: str = "k1", call_id: str = "c1") -> common_pb2.ToolCall:
    s = struct_pb2.Struct()
    s.update(args)
    return common_pb2.ToolCall(
        id=call_id,
        tool=tool,
        args=s,
        mediation=common_pb2.MEDIATION_CONTROLLER_MEDIATED,
        idempotency_key=key,
    )


def texts(result: common_pb2.ToolResult) -> list[str]:
    return [part.text.text for part in result.content if part.WhichOneof("part") == "text"]


async def test_lists_the_servers_tools_with_schemas(executor: McpExecutor) -> None:
    specs = {spec.name: spec for spec in executor.tools()}
    assert set(specs) == {"add", "shout", "pixel", "fail", "append_marker", "whisper"}
    assert specs["add"].description == "Add two integers."
    schema = specs["add"].input_schema
    assert schema["type"] == "object"
    assert set(schema["properties"]) == {"a", "b"}
    assert sorted(schema["required"]) == ["a", "b"]
    assert specs["add"].definition().name == "add"


async def test_structured_and_text_results(executor: McpExecutor) -> None:
    added = await executor.execute(SESSION, call("add", {"a": 2, "b": 3}))
    assert added.id == "c1"
    assert not added.is_error
    assert dict(added.output) == {"result": 5.0}
    assert texts(added) == ["5"]
    shouted = await executor.execute(SESSION, call("shout", {"text": "quiet"}))
    assert texts(shouted) == ["QUIET"]
    assert not shouted.HasField("output")


async def test_image_content_becomes_a_file_part(executor: McpExecutor) -> None:
    result = await executor.execute(SESSION, call("pixel", {}))
    files = [part.file for part in result.content if part.WhichOneof("part") == "file"]
    assert [(f.mime, f.bytes) for f in files] == [("image/png", b"\x89")]


async def test_tool_errors_become_error_receipts(executor: McpExecutor) -> None:
    registry = ToolRegistry(DictReceiptStore(), [executor])
    result = await registry.execute(SESSION, call("fail", {"reason": "nope"}))
    assert result.is_error
    assert result.code == common_pb2.ToolResult.EXECUTOR_ERROR
    assert result.error == "\n".join(texts(result))
    assert "fail" in result.error


async def test_registry_dedups_mcp_effects_across_a_host_restart(tmp_path: Path) -> None:
    marker = tmp_path / "marker.txt"
    store = DictReceiptStore()
    for _ in range(2):  # two host lifetimes over one receipt store
        registry = ToolRegistry(store, [server_executor()])
        try:
            result = await registry.execute(
                SESSION, call("append_marker", {"path": str(marker), "line": "effect"}, key="once")
            )
        finally:
            await registry.stop()
        assert texts(result) == ["appended"]
    assert marker.read_text(encoding="utf-8") == "effect\n"


async def test_stop_ends_the_server_process(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    mcp = server_executor(env={"MCP_TEST_PID_FILE": str(pid_file)})
    await mcp.start()
    pid = int(pid_file.read_text(encoding="utf-8"))
    os.kill(pid, 0)  # alive while started
    await mcp.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert mcp.tools() == []
    with pytest.raises(RuntimeError, match="is not running"):
        await mcp.execute(SESSION, call("add", {"a": 1, "b": 1}))
    await mcp.stop()  # idempotent


async def test_a_missing_command_fails_start() -> None:
    mcp = McpExecutor("ghost", "/nonexistent/mcp-server-binary", start_timeout_s=10)
    with pytest.raises(ToolExecutorStartError, match="'ghost' failed to start"):
        await mcp.start()


async def test_a_server_that_exits_at_once_fails_start() -> None:
    mcp = McpExecutor("quitter", sys.executable, ["-c", "pass"], start_timeout_s=30)
    with pytest.raises(ToolExecutorStartError, match="'quitter'"):
        await mcp.start()


async def test_flag_syntax_launches_the_server() -> None:
    config = parse_mcp_server_flag(f"tools='{sys.executable}' '{SERVER}'")
    assert (config.name, config.command, config.args) == ("tools", sys.executable, (str(SERVER),))
    mcp = config.build()
    await mcp.start()
    try:
        assert "shout" in {spec.name for spec in mcp.tools()}
    finally:
        await mcp.stop()


# A host process in miniature: the host's logging on its stderr, one MCP executor, one call.
_WHISPER_HOST = """
import asyncio, sys
from agentsessions.host import logs
from agentsessions.host.tools import McpExecutor
from agentsessions.v1 import common_pb2
from google.protobuf import struct_pb2

async def main(level, server, secret):
    logs.configure(level, "json")
    mcp = McpExecutor("whisper", sys.executable, [server], start_timeout_s=60, stop_timeout_s=15)
    await mcp.start()
    args = struct_pb2.Struct()
    args.update({"secret": secret})
    call = common_pb2.ToolCall(id="c1", tool="whisper", args=args, idempotency_key="k1",
                               mediation=common_pb2.MEDIATION_CONTROLLER_MEDIATED)
    try:
        print((await mcp.execute("s", call)).content[0].text.text)
    finally:
        await mcp.stop()

asyncio.run(main(*sys.argv[1:]))
"""


@pytest.mark.parametrize("level", ["info", "debug"])
async def test_the_servers_stderr_is_logged_only_at_debug_and_marked(level: str) -> None:
    secret = "hunter2-" + os.urandom(4).hex()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _WHISPER_HOST,
        level,
        str(SERVER),
        secret,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(120):
        out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    assert out.decode().strip() == "ok"
    lines = [json.loads(line) for line in err.decode().splitlines() if line.startswith("{")]
    leaked = [line for line in err.decode().splitlines() if secret in line]
    if level == "info":
        # Not on the host's stderr at all: neither raw nor in a log line.
        assert leaked == []
    else:
        (logged,) = leaked
        entry = json.loads(logged)
        assert entry["msg"] == "mcp server stderr" and entry["level"] == "debug"
        assert entry["may_contain_payloads"] is True and entry["server"] == "whisper"
    assert all("msg" in line for line in lines)
