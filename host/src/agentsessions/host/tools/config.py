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

        class = "write"                      # optional tool class(es), see below
        workspace_arg = "workspace"          # optional: the argument naming the directory it acts in
        workspace_roots = ["/srv/repos"]     # optional: where that directory may lie without approval

        [[mcp]]
        name = "files"                       # required
        command = "npx"                      # required
        args = ["-y", "@modelcontextprotocol/server-filesystem", "/srv"]
        env = { LOG_LEVEL = "warn" }         # optional, merged over a minimal safe environment
        cwd = "/srv"                         # optional
        start_timeout_s = 30                 # optional
        call_timeout_s = 300                 # optional
        class = "read-only"                  # optional: the class(es) of every tool it serves
        tool_classes = { write_file = "write" }  # optional: per tool, over ``class``

        [[subprocess]]                       # a program the host starts per call, confined
        name = "run_tests"                   # required
        command = ["python", "-m", "pytest", "-q", "{target}"]  # required; "{arg}" elements are arguments
        workspace = "/srv/repo"              # the directory it runs in and may write, or:
        workspace_arg = "workspace"          #   the argument naming it, which must then lie under
        workspace_roots = ["/srv/repos"]     #   one of these to run without approval (required with it)
        description = "..."                  # optional
        input_schema = { type = "object" }   # optional (default: the placeholders, as strings)
        timeout_s = 60                       # optional: the time bound (and the most timeout_arg may ask)
        timeout_arg = "timeout_s"            # optional: an argument that may lower it
        network = false                      # optional: true keeps the host's network (class network)
        confine = true                       # optional: false always runs it unconfined (so gated)
        private_tmp = true                   # optional: an empty /tmp (false: the host's, read-only)
        env = { LANG = "C.UTF-8" }           # optional, over PATH/LANG/LC_ALL/TZ, HOME=workspace
        output_limit_bytes = 65536           # optional cap on stdout and on stderr

        [confinement]
        bwrap = "/usr/bin/bwrap"             # bubblewrap to confine subprocess tools with (default:
                                             # "bwrap" on PATH); "" turns confinement off

    The JSON form is ``{"python": [{...}], "mcp": [{...}], "subprocess": [{...}], "confinement":
    {...}}`` with the same keys. Unknown keys are errors, so a typo never silently drops a
    setting. Tool classes (``class``: one name or a list) are ``read-only``, ``write``,
    ``subprocess`` and ``network``; a tool without one is unclassified, which the mode check
    counts as write (docs/modes.md). A subprocess tool's classes are ``subprocess`` (plus
    ``network`` with ``network = true``).

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
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentsessions.host.tools.confinement import DEFAULT_BWRAP, Bubblewrap
from agentsessions.host.tools.errors import ToolConfigError
from agentsessions.host.tools.executor import (
    DEFAULT_TOOL_TIMEOUT_S,
    ToolExecutor,
    ToolReceiptStore,
    ToolRegistry,
)
from agentsessions.host.tools.profile import ToolProfile, WorkspaceRule, parse_tool_classes
from agentsessions.sdk.structs import struct

# The executors load when a configuration names them (a host without tools never does).
if TYPE_CHECKING:
    from agentsessions.host.tools.mcp_stdio import McpExecutor
    from agentsessions.host.tools.python_callable import PythonCallableExecutor
    from agentsessions.host.tools.subprocess_executor import SubprocessTool

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")


@struct(frozen=True)
class PythonToolConfig:
    """One Python-function tool."""

    target: str
    name: str | None = None
    description: str | None = None
    input_schema: Mapping[str, Any] | None = None
    profile: ToolProfile = field(default_factory=ToolProfile)

    def build(self) -> PythonCallableExecutor:
        from agentsessions.host.tools.python_callable import PythonCallableExecutor

        return PythonCallableExecutor.from_import_path(
            self.target,
            name=self.name,
            description=self.description,
            input_schema=self.input_schema,
            profile=self.profile,
        )


@struct(frozen=True)
class McpServerConfig:
    """One MCP server launched over stdio."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    start_timeout_s: float = 30.0
    call_timeout_s: float = 300.0
    classes: frozenset[str] = frozenset()
    tool_classes: Mapping[str, frozenset[str]] = field(default_factory=dict)

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
            classes=self.classes,
            tool_classes=self.tool_classes,
        )


@struct(frozen=True)
class ToolsConfig:
    """Every configured tool executor."""

    python: tuple[PythonToolConfig, ...] = ()
    mcp: tuple[McpServerConfig, ...] = field(default=())
    subprocess: tuple[SubprocessTool, ...] = ()
    # The bubblewrap binary subprocess tools are confined with ("": no confinement); None: unset.
    bwrap: str | None = None

    def merged(self, other: ToolsConfig) -> ToolsConfig:
        return ToolsConfig(
            python=self.python + other.python,
            mcp=self.mcp + other.mcp,
            subprocess=self.subprocess + other.subprocess,
            bwrap=other.bwrap if other.bwrap is not None else self.bwrap,
        )

    def build_executors(self) -> list[ToolExecutor]:
        """The executors, unstarted (imports happen here; MCP servers launch and confinement is
        probed on start)."""
        executors: list[ToolExecutor] = [tool.build() for tool in self.python]
        executors.extend(server.build() for server in self.mcp)
        if self.subprocess:
            from agentsessions.host.tools.subprocess_executor import SubprocessExecutor

            bwrap = DEFAULT_BWRAP if self.bwrap is None else self.bwrap
            executors.append(
                SubprocessExecutor(self.subprocess, bubblewrap=Bubblewrap(bwrap) if bwrap else None)
            )
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
        self._allowed = allowed

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

    def classes(self, key: str) -> frozenset[str]:
        value = self._table.get(key)
        return frozenset() if value is None else parse_tool_classes(value, f"{self._where}.{key}")

    def class_map(self, key: str) -> dict[str, frozenset[str]]:
        table = self.table(key) or {}
        return {
            name: parse_tool_classes(value, f"{self._where}.{key}.{name}") for name, value in table.items()
        }

    def flag(self, key: str, default: bool) -> bool:
        value = self._table.get(key, default)
        if not isinstance(value, bool):
            raise ToolConfigError(f"{self._where}.{key}: expected true or false")
        return value

    def count(self, key: str, default: int) -> int:
        value = self._table.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ToolConfigError(f"{self._where}.{key}: expected a positive integer")
        return value

    def directories(self, key: str) -> tuple[str, ...]:
        paths = self.strings(key)
        for path in paths:
            if not path.startswith("/"):
                raise ToolConfigError(f"{self._where}.{key}: {path!r} is not an absolute path")
        return paths

    def workspace(self, *, required: bool) -> WorkspaceRule | None:
        """The workspace settings (``workspace`` / ``workspace_arg`` / ``workspace_roots``)."""
        directory = self.string("workspace") if "workspace" in self._allowed else None
        argument = self.string("workspace_arg")
        roots = self.directories("workspace_roots")
        where = self._where
        if directory is not None and argument is not None:
            raise ToolConfigError(f"{where}: set workspace or workspace_arg, not both")
        if directory is not None:
            if not directory.startswith("/"):
                raise ToolConfigError(f"{where}.workspace: {directory!r} is not an absolute path")
            if roots:
                raise ToolConfigError(f"{where}.workspace_roots: only with workspace_arg")
            return WorkspaceRule(directory=directory)
        if argument is not None:
            if required and not roots:
                raise ToolConfigError(
                    f"{where}.workspace_roots: required with workspace_arg (the directories the "
                    "argument's workspace may lie under)"
                )
            return WorkspaceRule(argument=argument, roots=roots)
        if roots:
            raise ToolConfigError(f"{where}.workspace_roots: only with workspace_arg")
        if required:
            raise ToolConfigError(f"{where}: workspace or workspace_arg is required")
        return None

    def table_value(self, key: str) -> object:
        return self._table.get(key)

    def seconds(self, key: str, default: float) -> float:
        value = self._table.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ToolConfigError(f"{self._where}.{key}: expected a number of seconds")
        if not math.isfinite(value) or value <= 0:
            raise ToolConfigError(f"{self._where}.{key}: must be a positive number of seconds")
        return float(value)


def tools_config_from_mapping(document: object, where: str = "tools config") -> ToolsConfig:
    """A ToolsConfig from a parsed JSON/TOML document."""
    root = _Reader(document, where, {"python", "mcp", "subprocess", "confinement"})
    python: list[PythonToolConfig] = []
    for index, table in enumerate(root.tables("python")):
        at = f"{where}.python[{index}]"
        reader = _Reader(
            table,
            at,
            {"target", "name", "description", "input_schema", "class", "workspace_arg", "workspace_roots"},
        )
        target = reader.string("target", required=True)
        assert target is not None
        name = reader.string("name")
        python.append(
            PythonToolConfig(
                target=target,
                name=_check_name(name, at) if name is not None else None,
                description=reader.string("description"),
                input_schema=reader.table("input_schema"),
                profile=ToolProfile(reader.classes("class"), reader.workspace(required=False)),
            )
        )
    mcp: list[McpServerConfig] = []
    for index, table in enumerate(root.tables("mcp")):
        at = f"{where}.mcp[{index}]"
        reader = _Reader(
            table,
            at,
            {
                "name",
                "command",
                "args",
                "env",
                "cwd",
                "start_timeout_s",
                "call_timeout_s",
                "class",
                "tool_classes",
            },
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
                classes=reader.classes("class"),
                tool_classes=reader.class_map("tool_classes"),
            )
        )
    subprocess = [
        _subprocess_tool(table, f"{where}.subprocess[{index}]")
        for index, table in enumerate(root.tables("subprocess"))
    ]
    bwrap: str | None = None
    confinement = root.table("confinement")
    if confinement is not None:
        value = _Reader(confinement, f"{where}.confinement", {"bwrap"}).table_value("bwrap")
        if value is not None and not isinstance(value, str):
            raise ToolConfigError(f'{where}.confinement.bwrap: expected a path, a name on PATH, or ""')
        bwrap = value
    return ToolsConfig(python=tuple(python), mcp=tuple(mcp), subprocess=tuple(subprocess), bwrap=bwrap)


_SUBPROCESS_KEYS = {
    "name",
    "command",
    "description",
    "input_schema",
    "workspace",
    "workspace_arg",
    "workspace_roots",
    "timeout_s",
    "timeout_arg",
    "network",
    "confine",
    "private_tmp",
    "env",
    "output_limit_bytes",
}


def _subprocess_tool(table: object, at: str) -> SubprocessTool:
    from agentsessions.host.tools.subprocess_executor import (
        DEFAULT_OUTPUT_LIMIT_BYTES,
        DEFAULT_TIMEOUT_S,
        SubprocessTool,
    )

    reader = _Reader(table, at, _SUBPROCESS_KEYS)
    name = reader.string("name", required=True)
    assert name is not None
    command = reader.strings("command")
    if not command or not command[0]:
        raise ToolConfigError(f"{at}.command: required, a non-empty list of strings (the program first)")
    workspace = reader.workspace(required=True)
    assert workspace is not None
    return SubprocessTool(
        name=_check_name(name, at),
        command=command,
        workspace=workspace,
        description=reader.string("description") or "",
        input_schema=reader.table("input_schema"),
        timeout_s=reader.seconds("timeout_s", DEFAULT_TIMEOUT_S),
        timeout_arg=reader.string("timeout_arg") or "",
        network=reader.flag("network", False),
        env=reader.string_map("env") or {},
        confine=reader.flag("confine", True),
        private_tmp=reader.flag("private_tmp", True),
        output_limit_bytes=reader.count("output_limit_bytes", DEFAULT_OUTPUT_LIMIT_BYTES),
    )


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
