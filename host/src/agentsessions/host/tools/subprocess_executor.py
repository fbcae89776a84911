"""Tools that are a program the host starts for each call, confined where the machine allows.

A ``[[subprocess]]`` entry of the tools configuration (``agentsessions.host.tools.config``) names a
command line whose elements may be argument placeholders: an element that is exactly ``{name}`` is
replaced by that argument's text (a string as it is, other values as compact JSON); the rest are
literal, and nothing passes through a shell unless the command names one (``["/bin/sh", "-c",
"{command}"]``). The process runs in its workspace (a fixed directory, or the one an argument
names) with a minimal environment, stdin closed, its output capped, and a bounded time.

Each run is confined with bubblewrap when the probe at start found it working
(``agentsessions.host.tools.confinement``); otherwise it runs unconfined, which the controller only
lets happen after an approval (the mode check gates an unconfinable subprocess). Either way the
receipt's ``output.confinement`` says which (``{"confined": ..., "detail": ...}``), and the log
says it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Any

from agentsessions.host.tools.args import python_to_struct, struct_to_python
from agentsessions.host.tools.confinement import Bubblewrap
from agentsessions.host.tools.executor import ToolSpec
from agentsessions.host.tools.profile import Confinement, ToolProfile, WorkspaceRule
from agentsessions.sdk.modes import NETWORK, SUBPROCESS
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2

log = logging.getLogger(__name__)

DEFAULT_OUTPUT_LIMIT_BYTES = 64 * 1024
DEFAULT_TIMEOUT_S = 60.0
_REAP_TIMEOUT_S = 5.0
# What a tool process sees of the host's environment unless its entry adds more: no secrets.
_PASSED_ENV = ("PATH", "LANG", "LC_ALL", "TZ")


@struct(frozen=True)
class SubprocessTool:
    """One program-backed tool (see the module docstring)."""

    name: str
    command: tuple[str, ...]
    workspace: WorkspaceRule
    description: str = ""
    input_schema: Mapping[str, Any] | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    timeout_arg: str = ""
    network: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    confine: bool = True
    private_tmp: bool = True
    output_limit_bytes: int = DEFAULT_OUTPUT_LIMIT_BYTES

    def placeholders(self) -> list[str]:
        return [element[1:-1] for element in self.command if _is_placeholder(element)]

    def schema(self) -> Mapping[str, Any]:
        if self.input_schema is not None:
            return self.input_schema
        properties: dict[str, Any] = {name: {"type": "string"} for name in self.placeholders()}
        required = list(properties)
        if self.workspace.argument:
            properties[self.workspace.argument] = {"type": "string"}
            required.append(self.workspace.argument)
        if self.timeout_arg:
            properties[self.timeout_arg] = {"type": "number"}
        return {"type": "object", "properties": properties, "required": required}


def _is_placeholder(element: str) -> bool:
    return len(element) > 2 and element.startswith("{") and element.endswith("}") and "{" not in element[1:-1]


class SubprocessExecutor:
    """A :class:`ManagedToolExecutor` over program-backed tools; ``start`` probes confinement."""

    def __init__(self, tools: Sequence[SubprocessTool], *, bubblewrap: Bubblewrap | None = None) -> None:
        self._tools = {tool.name: tool for tool in tools}
        self._bubblewrap = bubblewrap
        self._confinement = Confinement(False, "confinement has not been probed (executor not started)")

    async def start(self) -> None:
        if self._bubblewrap is None:
            self._confinement = Confinement(False, "confinement is turned off in the tools configuration")
        else:
            self._confinement = await self._bubblewrap.probe()

    async def stop(self) -> None:
        return None

    def tools(self) -> list[ToolSpec]:
        return [ToolSpec(tool.name, tool.description, tool.schema()) for tool in self._tools.values()]

    def confinement(self, tool: SubprocessTool) -> Confinement:
        """How the next run of ``tool`` goes."""
        if not tool.confine:
            return Confinement(False, f"confinement is turned off for tool {tool.name!r}")
        if not self._confinement.confined or self._bubblewrap is None:
            return self._confinement
        return Confinement(True, self._bubblewrap.describe(tool.network))

    def profile(self, name: str) -> ToolProfile | None:
        tool = self._tools.get(name)
        if tool is None:
            return None
        classes = {SUBPROCESS, NETWORK} if tool.network else {SUBPROCESS}
        return ToolProfile(frozenset(classes), tool.workspace, self.confinement(tool))

    async def execute(self, session_uid: str, call: common_pb2.ToolCall) -> common_pb2.ToolResult:
        tool = self._tools.get(call.tool)
        if tool is None:
            raise LookupError(f"tool {call.tool!r} is not served by this executor")
        args = struct_to_python(call.args if call.HasField("args") else None)
        argv = [_fill(element, args) for element in tool.command]
        workspace = await asyncio.to_thread(_open_workspace, tool.workspace, args)
        timeout_s = _timeout(tool, args)
        confinement = self.confinement(tool)
        if confinement.confined and self._bubblewrap is not None:
            log.info("tool %s: running confined: %s", call.tool, confinement.detail)
            argv = self._bubblewrap.command(
                argv, workspace, network=tool.network, private_tmp=tool.private_tmp
            )
        else:
            log.warning("tool %s: running unconfined (after approval): %s", call.tool, confinement.detail)
        outcome = await _run(
            argv, workspace, _environment(tool, workspace), timeout_s, tool.output_limit_bytes
        )
        outcome["workspace"] = workspace
        outcome["confinement"] = confinement.receipt()
        return common_pb2.ToolResult(id=call.id, output=python_to_struct(outcome))


def _fill(element: str, args: Mapping[str, Any]) -> str:
    if not _is_placeholder(element):
        return element
    name = element[1:-1]
    if name not in args:
        raise ValueError(f"argument {name!r} is required")
    value = args[name]
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _open_workspace(rule: WorkspaceRule, args: Mapping[str, Any]) -> str:
    workspace = rule.workspace_of(args)
    if workspace is None:
        raise ValueError(f"argument {rule.argument!r} is required (the workspace)")
    real = os.path.realpath(workspace)
    if not os.path.isabs(workspace) or not os.path.isdir(real):
        raise ValueError(f"workspace {workspace!r} is not an existing absolute directory")
    if real == "/":
        raise ValueError("the workspace may not be the root directory")
    return real


def _timeout(tool: SubprocessTool, args: Mapping[str, Any]) -> float:
    asked = args.get(tool.timeout_arg) if tool.timeout_arg else None
    if isinstance(asked, int | float) and not isinstance(asked, bool) and 0 < asked < tool.timeout_s:
        return float(asked)
    return tool.timeout_s


def _environment(tool: SubprocessTool, workspace: str) -> dict[str, str]:
    env = {name: os.environ[name] for name in _PASSED_ENV if name in os.environ}
    env.setdefault("PATH", os.defpath)
    env["HOME"] = workspace
    env["TMPDIR"] = "/tmp"
    env.update(tool.env)
    return env


class _Capture:
    """The first ``limit`` bytes of a stream; the rest is read and dropped."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._data = bytearray()
        self.truncated = False

    async def drain(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65536):
            room = self._limit - len(self._data)
            self._data += chunk[: max(room, 0)]
            if len(chunk) > room:
                self.truncated = True

    def text(self) -> str:
        return self._data.decode("utf-8", errors="replace")


async def _run(
    argv: list[str], workspace: str, env: dict[str, str], timeout_s: float, limit: int
) -> dict[str, Any]:
    process = await asyncio.create_subprocess_exec(
        *argv,
        cwd=workspace,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    stdout, stderr = _Capture(limit), _Capture(limit)
    timed_out = False
    try:
        async with asyncio.timeout(timeout_s):
            assert process.stdout is not None and process.stderr is not None
            await asyncio.gather(stdout.drain(process.stdout), stderr.drain(process.stderr))
            await process.wait()
    except TimeoutError:
        timed_out = True
    finally:
        if process.returncode is None:
            # The process group: a confined run's sandbox dies with bubblewrap (--die-with-parent).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_REAP_TIMEOUT_S):
                    await process.wait()
    return {
        "exit_code": None if timed_out else process.returncode,
        "stdout": stdout.text(),
        "stderr": stderr.text(),
        "timed_out": timed_out,
        "truncated": stdout.truncated or stderr.truncated,
    }
