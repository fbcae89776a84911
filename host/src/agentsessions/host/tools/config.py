"""Tool-executor configuration: command-line flags and a JSON or TOML file.

Flags (repeatable; the host CLI adds them and passes the strings here):

``--tool-executor python:package.module:function[=toolname]``
    One tool backed by a Python function (see ``python_callable``). The tool is named
    ``toolname`` if given, else after the function; its description is the function's first
    docstring line. Example: ``--tool-executor python:agentsessions.harnesses.coding_tools:write_file``.

``--mcp-server name='command arg ...'``
    An MCP server launched over stdio; the part after the first ``=`` is split like a POSIX
    shell would (quotes group words). Every tool the server lists is served under its own
    name. Example: ``--mcp-server files='npx -y @modelcontextprotocol/server-filesystem /srv'``.

``--tools-config PATH``
    A file, TOML if it ends in ``.toml`` and JSON otherwise, holding either or both lists::

        [[python]]
        target = "package.module:function"   # required
        name = "toolname"                    # optional
        description = "what it does"         # optional, overrides the docstring
        input_schema = { type = "object" }   # optional JSON Schema for the arguments

        [[mcp]]
        name = "files"                       # required
        command = "npx"                      # required
        args = ["-y", "@modelcontextprotocol/server-filesystem", "/srv"]
        env = { LOG_LEVEL = "warn" }         # optional, merged over a minimal safe environment
        cwd = "/srv"                         # optional
        start_timeout_s = 30                 # optional
        call_timeout_s = 300                 # optional

    The JSON form is ``{"python": [{...}], "mcp": [{...}]}`` with the same keys. Unknown
    keys are errors, so a typo never silently drops a setting.

Tool and server names match ``[A-Za-z0-9_-]{1,64}`` (what model APIs accept as tool names).
A tool name served twice is refused when the registry starts.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentsessions.host.tools.errors import ToolConfigError
from agentsessions.host.tools.executor import (
    DEFAULT_TOOL_TIMEOUT_S,
    ToolExecutor,
    ToolReceiptStore,
    ToolRegistry,
)
from agentsessions.host.tools.python_callable import PythonCallableExecutor

if TYPE_CHECKING:
    from agentsessions.host.tools.mcp_stdio import McpExecutor

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")


@dataclass(frozen=True)
class PythonToolConfig:
    """One Python-function tool."""

    target: str
    name: str | None = None
    description: str | None = None
    input_schema: Mapping[str, Any] | None = None

    def build(self) -> PythonCallableExecutor:
        return PythonCallableExecutor.from_import_path(
            self.target, name=self.name, description=self.description, input_schema=self.input_schema
        )


@dataclass(frozen=True)
class McpServerConfig:
    """One MCP server launched over stdio."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    start_timeout_s: float = 30.0
    call_timeout_s: float = 300.0

    def build(self) -> McpExecutor:
        # Imported here: the mcp package is slow to import and only MCP users need it.
        from agentsessions.host.tools.mcp_stdio import McpExecutor

        return McpExecutor(
            self.name,
            self.command,
            self.args,
            env=self.env,
            cwd=self.cwd,
            start_timeout_s=self.start_timeout_s,
            call_timeout_s=self.call_timeout_s,
        )


@dataclass(frozen=True)
class ToolsConfig:
    """Every configured tool executor."""

    python: tuple[PythonToolConfig, ...] = ()
    mcp: tuple[McpServerConfig, ...] = field(default=())

    def merged(self, other: ToolsConfig) -> ToolsConfig:
        return ToolsConfig(python=self.python + other.python, mcp=self.mcp + other.mcp)

    def build_executors(self) -> list[ToolExecutor]:
        """The executors, unstarted (imports happen here; MCP servers launch on start)."""
        executors: list[ToolExecutor] = [tool.build() for tool in self.python]
        executors.extend(server.build() for server in self.mcp)
        return executors

    def build_registry(
        self, receipts: ToolReceiptStore, *, timeout_s: float = DEFAULT_TOOL_TIMEOUT_S
    ) -> ToolRegistry:
        """A registry over these executors, deduplicating through ``receipts``."""
        return ToolRegistry(receipts, self.build_executors(), timeout_s=timeout_s)


def _check_name(name: str, where: str) -> str:
    if not _NAME.match(name):
        raise ToolConfigError(f"{where}: name {name!r} must match [A-Za-z0-9_-]{{1,64}}")
    return name


def parse_tool_executor_flag(value: str) -> PythonToolConfig:
    """Parse ``python:package.module:function[=toolname]``."""
    where = f"--tool-executor {value!r}"
    kind, sep, rest = value.partition(":")
    if not sep or kind != "python":
        raise ToolConfigError(f"{where}: expected 'python:package.module:function[=toolname]'")
    target, eq, name = rest.partition("=")
    module, colon, function = target.partition(":")
    if not colon or not module or not function:
        raise ToolConfigError(f"{where}: expected 'python:package.module:function[=toolname]'")
    return PythonToolConfig(target=target, name=_check_name(name, where) if eq else None)


def parse_mcp_server_flag(value: str) -> McpServerConfig:
    """Parse ``name='command arg ...'`` (the command line split with POSIX shell rules)."""
    where = f"--mcp-server {value!r}"
    name, eq, command_line = value.partition("=")
    if not eq:
        raise ToolConfigError(f"{where}: expected name='command arg ...'")
    _check_name(name, where)
    try:
        words = shlex.split(command_line)
    except ValueError as exc:
        raise ToolConfigError(f"{where}: command line does not parse: {exc}") from exc
    if not words:
        raise ToolConfigError(f"{where}: command is empty")
    return McpServerConfig(name=name, command=words[0], args=tuple(words[1:]))


class _Reader:
    """Typed access to one table of the file, naming the path in every error."""

    def __init__(self, table: object, where: str, allowed: set[str]) -> None:
        if not isinstance(table, Mapping):
            raise ToolConfigError(f"{where}: expected a table/object")
        unknown = sorted(set(table) - allowed)
        if unknown:
            raise ToolConfigError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}")
        self._table: Mapping[str, Any] = table
        self._where = where

    def string(self, key: str, *, required: bool = False) -> str | None:
        value = self._table.get(key)
        if value is None:
            if required:
                raise ToolConfigError(f"{self._where}.{key}: required string")
            return None
        if not isinstance(value, str) or (required and not value):
            raise ToolConfigError(f"{self._where}.{key}: expected a non-empty string")
        return value

    def strings(self, key: str) -> tuple[str, ...]:
        value = self._table.get(key, [])
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise ToolConfigError(f"{self._where}.{key}: expected a list of strings")
        return tuple(value)

    def string_map(self, key: str) -> dict[str, str] | None:
        value = self._table.get(key)
        if value is None:
            return None
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise ToolConfigError(f"{self._where}.{key}: expected a table of strings")
        return dict(value)

    def table(self, key: str) -> Mapping[str, Any] | None:
        value = self._table.get(key)
        if value is not None and not isinstance(value, Mapping):
            raise ToolConfigError(f"{self._where}.{key}: expected a table/object")
        return value

    def tables(self, key: str) -> list[object]:
        value = self._table.get(key, [])
        if not isinstance(value, list):
            raise ToolConfigError(f"{self._where}.{key}: expected a list of tables")
        return value

    def seconds(self, key: str, default: float) -> float:
        value = self._table.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ToolConfigError(f"{self._where}.{key}: expected a number of seconds")
        if not math.isfinite(value) or value <= 0:
            raise ToolConfigError(f"{self._where}.{key}: must be a positive number of seconds")
        return float(value)


def tools_config_from_mapping(document: object, where: str = "tools config") -> ToolsConfig:
    """A ToolsConfig from a parsed JSON/TOML document."""
    root = _Reader(document, where, {"python", "mcp"})
    python: list[PythonToolConfig] = []
    for index, table in enumerate(root.tables("python")):
        at = f"{where}.python[{index}]"
        reader = _Reader(table, at, {"target", "name", "description", "input_schema"})
        target = reader.string("target", required=True)
        assert target is not None
        name = reader.string("name")
        python.append(
            PythonToolConfig(
                target=target,
                name=_check_name(name, at) if name is not None else None,
                description=reader.string("description"),
                input_schema=reader.table("input_schema"),
            )
        )
    mcp: list[McpServerConfig] = []
    for index, table in enumerate(root.tables("mcp")):
        at = f"{where}.mcp[{index}]"
        reader = _Reader(
            table, at, {"name", "command", "args", "env", "cwd", "start_timeout_s", "call_timeout_s"}
        )
        name = reader.string("name", required=True)
        command = reader.string("command", required=True)
        assert name is not None and command is not None
        mcp.append(
            McpServerConfig(
                name=_check_name(name, at),
                command=command,
                args=reader.strings("args"),
                env=reader.string_map("env"),
                cwd=reader.string("cwd"),
                start_timeout_s=reader.seconds("start_timeout_s", 30.0),
                call_timeout_s=reader.seconds("call_timeout_s", 300.0),
            )
        )
    return ToolsConfig(python=tuple(python), mcp=tuple(mcp))


def load_tools_file(path: str | Path) -> ToolsConfig:
    """Read a JSON or TOML tools file (blocking; call at startup, before serving)."""
    file = Path(path)
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise ToolConfigError(f"{file}: cannot read: {exc.strerror or exc}") from exc
    try:
        if file.suffix == ".toml":
            document: object = tomllib.loads(raw.decode("utf-8"))
        else:
            document = json.loads(raw)
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ToolConfigError(f"{file}: does not parse: {exc}") from exc
    return tools_config_from_mapping(document, str(file))


def tools_config_from_flags(
    tool_executors: Sequence[str] = (),
    mcp_servers: Sequence[str] = (),
    files: Sequence[str | Path] = (),
) -> ToolsConfig:
    """Everything the three flags configure, files first, then flags in order."""
    config = ToolsConfig()
    for path in files:
        config = config.merged(load_tools_file(path))
    return config.merged(
        ToolsConfig(
            python=tuple(parse_tool_executor_flag(value) for value in tool_executors),
            mcp=tuple(parse_mcp_server_flag(value) for value in mcp_servers),
        )
    )
