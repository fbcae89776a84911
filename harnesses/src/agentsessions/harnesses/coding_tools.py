"""The coding harness's workspace tools, usable on both sides of the contract.

The harness runs them itself for IN_HARNESS_REPORTED calls (:func:`run_workspace_tool`). For
REQUIRES_APPROVAL calls the host runs them after a recorded approval, through its Python
executor; the module-level ``read_file``/``list_dir``/``write_file``/``edit_file``/``run_shell``
functions are those executor targets::

    agentsessions serve \\
      --tool-executor python:agentsessions.harnesses.coding_tools:write_file \\
      --tool-executor python:agentsessions.harnesses.coding_tools:edit_file \\
      --tool-executor python:agentsessions.harnesses.coding_tools:run_shell

A host-run call names its workspace in ``args["workspace"]`` (the harness fills it from its
execution config, so the journaled call says exactly where it acts and what the approver
approved). When ``AGENTSESSIONS_CODING_WORKSPACES`` is set in the host's environment (paths
separated by ``os.pathsep``), the workspace must lie inside one of them; unset, any existing
directory is accepted and the approval decision is the only gate.

Every path is resolved inside the workspace; absolute paths, ``..`` and symlinks leading out
are refused. Reads, listings and shell output are capped; shell commands run under ``/bin/sh``
in the workspace with a bounded timeout, in their own process group, killed whole on timeout.

Re-running after a crash (the one window the host's receipts cannot close): ``write_file`` is
naturally idempotent; ``edit_file`` requires ``old_string`` to occur exactly once, so a repeat
usually fails loudly instead of editing twice; ``run_shell`` repeats its command.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentsessions.sdk.structs import struct

READ_LIMIT_BYTES = 256 * 1024
LIST_LIMIT = 1000
SHELL_OUTPUT_LIMIT_BYTES = 64 * 1024
DEFAULT_SHELL_TIMEOUT_S = 30.0
MAX_SHELL_TIMEOUT_S = 600.0
WORKSPACES_ENV = "AGENTSESSIONS_CODING_WORKSPACES"

# Seconds to wait for a killed process group to be reaped.
_REAP_TIMEOUT_S = 5.0

TOOL_NAMES = ("read_file", "list_dir", "write_file", "edit_file", "run_shell")


class CodingToolError(Exception):
    """A tool call broke a rule (bad argument, missing file, ...); the message is for the model."""


class WorkspaceEscapeError(CodingToolError):
    """A path resolves outside the workspace."""


def _string(args: Mapping[str, Any], name: str, *, default: str | None = None) -> str:
    value = args.get(name, default)
    if value is None:
        raise CodingToolError(f"argument {name!r} is required")
    if not isinstance(value, str):
        raise CodingToolError(f"argument {name!r} must be a string")
    return value


def _seconds(args: Mapping[str, Any], name: str, default: float) -> float:
    value = args.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= MAX_SHELL_TIMEOUT_S:
        raise CodingToolError(
            f"argument {name!r} must be a number of seconds in (0, {MAX_SHELL_TIMEOUT_S:g}]"
        )
    return float(value)


@struct(frozen=True)
class Workspace:
    """A directory the tools act in; every path argument is resolved inside it."""

    root: Path

    @classmethod
    def open(cls, directory: str | Path) -> Workspace:
        """The workspace at an existing directory (blocking: stats the filesystem)."""
        path = Path(directory)
        if not path.is_absolute():
            raise CodingToolError(f"workspace {str(directory)!r} must be an absolute path")
        root = path.resolve()
        if not root.is_dir():
            raise CodingToolError(f"workspace {str(directory)!r} is not an existing directory")
        return cls(root)

    def resolve(self, relative: str) -> Path:
        """The absolute path ``relative`` names, refusing any that leads outside the workspace."""
        if "\x00" in relative:
            raise CodingToolError("path must not contain NUL")
        candidate = (self.root / relative).resolve()
        if candidate != self.root and not candidate.is_relative_to(self.root):
            raise WorkspaceEscapeError(f"path {relative!r} escapes the workspace")
        return candidate

    def _shown(self, path: Path) -> str:
        return "." if path == self.root else path.relative_to(self.root).as_posix()

    def read_file(self, relative: str) -> dict[str, Any]:
        path = self.resolve(relative)
        if not path.is_file():
            raise CodingToolError(f"{relative!r} is not a file")
        with path.open("rb") as file:
            data = file.read(READ_LIMIT_BYTES + 1)
        truncated = len(data) > READ_LIMIT_BYTES
        text = data[:READ_LIMIT_BYTES].decode("utf-8", errors="replace")
        return {"path": self._shown(path), "content": text, "truncated": truncated}

    def list_dir(self, relative: str) -> dict[str, Any]:
        path = self.resolve(relative)
        if not path.is_dir():
            raise CodingToolError(f"{relative!r} is not a directory")
        names = sorted(entry.name + ("/" if entry.is_dir() else "") for entry in path.iterdir())
        return {
            "path": self._shown(path),
            "entries": names[:LIST_LIMIT],
            "truncated": len(names) > LIST_LIMIT,
        }

    def write_file(self, relative: str, content: str) -> dict[str, Any]:
        path = self.resolve(relative)
        if path.is_dir():
            raise CodingToolError(f"{relative!r} is a directory")
        created = not path.exists()
        path.parent.mkdir(parents=True, exist_ok=True)
        data = content.encode("utf-8")
        path.write_bytes(data)
        return {"path": self._shown(path), "bytes_written": len(data), "created": created}

    def edit_file(self, relative: str, old: str, new: str) -> dict[str, Any]:
        path = self.resolve(relative)
        if not path.is_file():
            raise CodingToolError(f"{relative!r} is not a file")
        if not old:
            raise CodingToolError("argument 'old_string' must not be empty")
        text = path.read_text(encoding="utf-8")
        count = text.count(old)
        if count == 0:
            raise CodingToolError(f"old_string does not occur in {relative!r}")
        if count > 1:
            raise CodingToolError(
                f"old_string occurs {count} times in {relative!r}; include more context so it is unique"
            )
        path.write_text(text.replace(old, new, 1), encoding="utf-8")
        return {"path": self._shown(path), "replacements": 1}

    async def run_shell(self, command: str, timeout_s: float) -> dict[str, Any]:
        if not command.strip():
            raise CodingToolError("argument 'command' must not be empty")
        process = await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            command,
            cwd=self.root,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        stdout, stderr = _Capture(), _Capture()
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
                await _kill_group(process)
        return {
            "command": command,
            "exit_code": None if timed_out else process.returncode,
            "stdout": stdout.text(),
            "stderr": stderr.text(),
            "timed_out": timed_out,
            "truncated": stdout.truncated or stderr.truncated,
        }


class _Capture:
    """Keeps the first SHELL_OUTPUT_LIMIT_BYTES of a stream, reading (and dropping) the rest."""

    def __init__(self) -> None:
        self._data = bytearray()
        self.truncated = False

    async def drain(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65536):
            room = SHELL_OUTPUT_LIMIT_BYTES - len(self._data)
            self._data += chunk[: max(room, 0)]
            if len(chunk) > room:
                self.truncated = True

    def text(self) -> str:
        return self._data.decode("utf-8", errors="replace")


async def _kill_group(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(process.wait(), _REAP_TIMEOUT_S)


async def run_workspace_tool(
    workspace: Workspace,
    tool: str,
    args: Mapping[str, Any],
    *,
    shell_timeout_s: float = DEFAULT_SHELL_TIMEOUT_S,
) -> dict[str, Any]:
    """Run one tool in ``workspace``; file work happens in a worker thread, never on the loop.

    Raises CodingToolError (a message for the model) when the call breaks a rule.
    """
    if tool == "read_file":
        return await asyncio.to_thread(workspace.read_file, _string(args, "path"))
    if tool == "list_dir":
        return await asyncio.to_thread(workspace.list_dir, _string(args, "path", default="."))
    if tool == "write_file":
        return await asyncio.to_thread(workspace.write_file, _string(args, "path"), _string(args, "content"))
    if tool == "edit_file":
        return await asyncio.to_thread(
            workspace.edit_file,
            _string(args, "path"),
            _string(args, "old_string"),
            _string(args, "new_string"),
        )
    if tool == "run_shell":
        timeout_s = min(_seconds(args, "timeout_s", shell_timeout_s), shell_timeout_s)
        return await workspace.run_shell(_string(args, "command"), timeout_s)
    raise CodingToolError(f"unknown tool {tool!r}; the tools are {', '.join(TOOL_NAMES)}")


def _allowed_roots() -> list[Path]:
    configured = os.environ.get(WORKSPACES_ENV, "")
    return [Path(entry).resolve() for entry in configured.split(os.pathsep) if entry]


def _host_workspace(args: Mapping[str, Any]) -> Workspace:
    workspace = Workspace.open(_string(args, "workspace"))
    allowed = _allowed_roots()
    if allowed and not any(workspace.root == root or workspace.root.is_relative_to(root) for root in allowed):
        raise WorkspaceEscapeError(f"workspace {str(workspace.root)!r} is outside {WORKSPACES_ENV}")
    return workspace


async def _host_run(tool: str, args: dict[str, Any]) -> dict[str, Any]:
    workspace = await asyncio.to_thread(_host_workspace, args)
    timeout_s = _seconds(args, "timeout_s", DEFAULT_SHELL_TIMEOUT_S)
    return await run_workspace_tool(workspace, tool, args, shell_timeout_s=timeout_s)


async def read_file(args: dict[str, Any], context: object) -> dict[str, Any]:
    """Read a UTF-8 text file in the workspace (capped at 256 KiB)."""
    return await _host_run("read_file", args)


async def list_dir(args: dict[str, Any], context: object) -> dict[str, Any]:
    """List a directory in the workspace (directories end with '/')."""
    return await _host_run("list_dir", args)


async def write_file(args: dict[str, Any], context: object) -> dict[str, Any]:
    """Create or overwrite a file in the workspace with the given content."""
    return await _host_run("write_file", args)


async def edit_file(args: dict[str, Any], context: object) -> dict[str, Any]:
    """Replace the single occurrence of old_string with new_string in a workspace file."""
    return await _host_run("edit_file", args)


async def run_shell(args: dict[str, Any], context: object) -> dict[str, Any]:
    """Run a /bin/sh command in the workspace with a bounded timeout and capped output."""
    return await _host_run("run_shell", args)
