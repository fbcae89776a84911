"""Subprocess tools confined with bubblewrap: no network, only the workspace writable.

Each confinement test first runs the same tool unconfined (``confine = false``) and asserts that
the effect happens, then confined, and asserts that it does not: so each would fail on a host that
did not confine. Without bwrap installed they skip; with ``CI`` set they fail (tests/tools/bwrap.py).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format, struct_pb2

from agentsessions.host.journal.store import JournalStore
from agentsessions.host.tools import (
    Bubblewrap,
    SubprocessExecutor,
    SubprocessTool,
    WorkspaceRule,
    tools_config_from_mapping,
)
from agentsessions.v1 import common_pb2
from tests.tools.bwrap import bwrap_or_skip

WAIT_S = 30.0  # bounds every wait on the test's own server

CONNECT = """
import socket, sys
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10) as s:
    s.sendall(sys.argv[2].encode() + b"\\n")
print("connected")
"""


def call(tool: str, **args: Any) -> common_pb2.ToolCall:
    struct = struct_pb2.Struct()
    struct.update(args)
    return common_pb2.ToolCall(
        id=f"{tool}-1",
        tool=tool,
        args=struct,
        mediation=common_pb2.MEDIATION_CONTROLLER_MEDIATED,
        idempotency_key=f"{tool}-key",
    )


def output(result: common_pb2.ToolResult) -> dict[str, Any]:
    return json_format.MessageToDict(result.output)


async def started(tools: list[SubprocessTool], bwrap: str) -> SubprocessExecutor:
    executor = SubprocessExecutor(tools, bubblewrap=Bubblewrap(bwrap))
    await executor.start()
    return executor


class Listener:
    """A loopback TCP server that notes the name each client sends, in the order accepted."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.arrived = asyncio.Condition()
        self.server: asyncio.Server | None = None

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        name = (await reader.readline()).decode().strip()
        writer.close()
        async with self.arrived:
            self.names.append(name)
            self.arrived.notify_all()

    async def seen(self, name: str) -> None:
        async with asyncio.timeout(WAIT_S), self.arrived:
            await self.arrived.wait_for(lambda: name in self.names)

    @property
    def port(self) -> int:
        assert self.server is not None
        port: int = self.server.sockets[0].getsockname()[1]
        return port


@pytest.fixture
async def listener() -> AsyncIterator[Listener]:
    found = Listener()
    found.server = await asyncio.start_server(found._client, "127.0.0.1", 0)
    try:
        yield found
    finally:
        found.server.close()
        await found.server.wait_closed()


def connect_tool(workspace: Path, *, confine: bool) -> SubprocessTool:
    return SubprocessTool(
        name="connect" if confine else "connect_unconfined",
        command=(sys.executable, "-c", CONNECT, "{port}", "{name}"),
        workspace=WorkspaceRule(directory=str(workspace)),
        confine=confine,
    )


async def test_a_confined_subprocess_cannot_reach_a_loopback_server(
    tmp_path: Path, listener: Listener
) -> None:
    bwrap = await bwrap_or_skip()
    executor = await started(
        [connect_tool(tmp_path, confine=False), connect_tool(tmp_path, confine=True)], bwrap
    )

    control = output(
        await executor.execute("s", call("connect_unconfined", port=str(listener.port), name="unconfined"))
    )
    assert control["exit_code"] == 0 and control["stdout"] == "connected\n"
    assert control["confinement"]["confined"] is False
    await listener.seen("unconfined")

    confined = output(await executor.execute("s", call("connect", port=str(listener.port), name="confined")))
    assert confined["confinement"]["confined"] is True
    assert confined["exit_code"] != 0, confined
    assert "connected" not in confined["stdout"]
    # A connection the confined run made would be accepted before this one: the server saw none.
    _, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    writer.write(b"sentinel\n")
    await writer.drain()
    writer.close()
    await listener.seen("sentinel")
    assert listener.names == ["unconfined", "sentinel"]


def write_tool(workspace: Path, *, confine: bool, private_tmp: bool = True) -> SubprocessTool:
    return SubprocessTool(
        name=f"scribble_{'confined' if confine else 'unconfined'}_{'private' if private_tmp else 'shared'}",
        command=("/bin/sh", "-c", 'echo in > inside.txt; echo out > "$1"/escaped.txt', "sh", "{outside}"),
        workspace=WorkspaceRule(directory=str(workspace)),
        confine=confine,
        private_tmp=private_tmp,
    )


@pytest.mark.parametrize("private_tmp", [True, False], ids=["private-tmp", "read-only-tmp"])
async def test_a_confined_subprocess_writes_only_its_workspace(tmp_path: Path, private_tmp: bool) -> None:
    bwrap = await bwrap_or_skip()
    workspace, outside = tmp_path / "workspace", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    unconfined = write_tool(workspace, confine=False, private_tmp=private_tmp)
    confined = write_tool(workspace, confine=True, private_tmp=private_tmp)
    executor = await started([unconfined, confined], bwrap)

    control = output(await executor.execute("s", call(unconfined.name, outside=str(outside))))
    assert control["exit_code"] == 0, control
    assert (outside / "escaped.txt").read_text() == "out\n"
    (outside / "escaped.txt").unlink()
    (workspace / "inside.txt").unlink()

    ran = output(await executor.execute("s", call(confined.name, outside=str(outside))))
    assert ran["confinement"]["confined"] is True
    assert (workspace / "inside.txt").read_text() == "in\n", "the workspace is writable"
    assert not (outside / "escaped.txt").exists(), "nothing beside it is"
    assert ran["exit_code"] != 0
    # With the host's /tmp in view the directory is there, and read-only.
    said = "Read-only file system" if not private_tmp else "nonexistent"
    assert said in ran["stderr"], ran["stderr"]
    assert ran["workspace"] == str(workspace.resolve())


async def test_a_confined_run_that_outlives_its_bound_is_killed(tmp_path: Path) -> None:
    bwrap = await bwrap_or_skip()
    tool = SubprocessTool(
        name="hang",
        command=("/bin/sh", "-c", "echo started; sleep 600"),
        workspace=WorkspaceRule(directory=str(tmp_path)),
        timeout_s=0.5,
    )
    executor = await started([tool], bwrap)
    result = output(await executor.execute("s", call("hang")))
    assert result["timed_out"] is True and result["exit_code"] is None
    assert result["confinement"]["confined"] is True


async def test_without_bubblewrap_the_profile_says_the_tool_cannot_be_confined(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such" / "bwrap")
    status = await Bubblewrap(missing).probe()
    assert not status.confined and status.detail == f"no bubblewrap at {missing}"
    status = await Bubblewrap("agentsessions-no-such-bwrap").probe()
    assert status.detail == "no bubblewrap named 'agentsessions-no-such-bwrap' on PATH"

    # A bubblewrap that cannot set up its namespaces (a stand-in program that fails as it would).
    broken = tmp_path / "bwrap"
    broken.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    broken.chmod(0o755)
    status = await Bubblewrap(str(broken)).probe()
    assert not status.confined
    assert status.detail == (
        f"bubblewrap at {broken} cannot confine here (exit 1: bwrap: No permissions to create new namespace)"
    )

    tool = write_tool(tmp_path, confine=True)
    executor = await started([tool], missing)
    profile = executor.profile(tool.name)
    assert profile is not None and profile.confinement is not None
    assert (profile.confinement.confined, profile.confinement.detail) == (
        False,
        f"no bubblewrap at {missing}",
    )
    assert profile.classes == {"subprocess"}


async def test_a_subprocess_tool_from_the_tools_config(store: JournalStore, tmp_path: Path) -> None:
    """The whole path a host takes: a [[subprocess]] entry, the registry, its profile and a run."""
    bwrap = await bwrap_or_skip()
    workspace = tmp_path / "repos" / "one"
    workspace.mkdir(parents=True)
    document = {
        "subprocess": [
            {
                "name": "run_shell",
                "command": ["/bin/sh", "-c", "{command}"],
                "workspace_arg": "workspace",
                "workspace_roots": [str(tmp_path / "repos")],
                "timeout_arg": "timeout_s",
                "timeout_s": 30,
            }
        ],
        "confinement": {"bwrap": bwrap},
    }
    registry = tools_config_from_mapping(document).build_registry(store)
    await registry.start()
    try:
        (spec,) = registry.tools()
        assert spec.input_schema == {
            "type": "object",
            "properties": {
                "command": {"type": "string"},
                "workspace": {"type": "string"},
                "timeout_s": {"type": "number"},
            },
            "required": ["command", "workspace"],
        }
        profile = await registry.profile("run_shell")
        assert profile is not None and profile.confinement is not None and profile.confinement.confined
        result = await registry.execute(
            "sess-1", call("run_shell", command="pwd; echo $HOME", workspace=str(workspace))
        )
        ran = output(result)
        assert ran["stdout"] == f"{workspace}\n{workspace}\n"
        assert ran["confinement"]["confined"] is True and not result.is_error
    finally:
        await registry.stop()
