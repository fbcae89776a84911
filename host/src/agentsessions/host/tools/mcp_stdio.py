"""Tools served by an MCP server the host launches as a subprocess and talks to over stdio.

``start`` launches the server, completes the MCP handshake and lists its tools (name,
description, input schema), all within ``start_timeout_s``. ``execute`` calls a tool with the
call's arguments and maps the MCP result into a ToolResult:

- text content -> text parts; image/audio content -> file parts with the decoded bytes;
  resource links -> file parts by uri; embedded resources -> file parts with their bytes;
- structured content -> ``output`` (a non-object value is wrapped as ``{"result": value}``);
- ``isError`` -> ``is_error``, with the text content as the error message.

The client lives in one background task (MCP's transport is scoped to the task that opens it);
``stop`` ends that task within ``stop_timeout_s`` and the transport's own bounded shutdown stops
the process (stdin closed, then terminate, then kill).

The server's stderr does not go to the host's own: it is read from a pipe and, since a server may
quote tool arguments there (user input), logged line by line only at DEBUG, each line marked
``may_contain_payloads``; above DEBUG the host logs only how much the server wrote.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import mcp_types
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from agentsessions.host import logs
from agentsessions.host.tools.args import python_to_struct, struct_to_python
from agentsessions.host.tools.errors import ToolExecutorStartError
from agentsessions.host.tools.executor import ToolSpec
from agentsessions.host.tools.profile import Confinement, ToolProfile
from agentsessions.v1 import common_pb2

log = logging.getLogger(__name__)

# Servers that paginate their tool list forever are refused rather than followed.
_MAX_TOOL_PAGES = 100


class McpExecutor:
    """A :class:`ManagedToolExecutor` over one MCP server launched as ``command args...``."""

    def __init__(
        self,
        name: str,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        start_timeout_s: float = 30.0,
        call_timeout_s: float = 300.0,
        stop_timeout_s: float = 10.0,
        classes: frozenset[str] = frozenset(),
        tool_classes: Mapping[str, frozenset[str]] | None = None,
    ) -> None:
        if not command:
            raise ValueError(f"mcp server {name!r}: command is required")
        self.name = name
        self._params = StdioServerParameters(
            command=command, args=list(args), env=dict(env) if env is not None else None, cwd=cwd
        )
        self._start_timeout_s = start_timeout_s
        self._call_timeout_s = call_timeout_s
        self._stop_timeout_s = stop_timeout_s
        # Tool classes as configured: per tool, else the server's (docs/modes.md).
        self._classes = classes
        self._tool_classes = dict(tool_classes or {})
        self._tools: list[ToolSpec] = []
        self._client: Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._failure: BaseException | None = None

    def __repr__(self) -> str:
        return f"McpExecutor({self.name!r}, {self._params.command!r})"

    async def start(self) -> None:
        """Launch the server and list its tools, or raise ToolExecutorStartError."""
        if self._task is not None:
            return
        self._stopping = asyncio.Event()
        self._failure = None
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._serve(ready), name=f"mcp-server-{self.name}")
        await asyncio.wait(
            {ready, self._task}, timeout=self._start_timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        failure: BaseException | None = None
        if ready.done() and not ready.cancelled():
            failure = ready.exception()
            if failure is None:
                log.info("mcp server %s started with %d tools", self.name, len(self._tools))
                return
        await self.stop()
        if failure is not None:
            raise ToolExecutorStartError(f"mcp server {self.name!r} failed to start: {failure}") from failure
        raise ToolExecutorStartError(
            f"mcp server {self.name!r} did not initialize within {self._start_timeout_s:g}s"
        )

    async def _serve(self, ready: asyncio.Future[None]) -> None:
        stderr = _StderrRelay(self.name)
        relay = asyncio.create_task(stderr.run(), name=f"mcp-stderr-{self.name}")
        try:
            transport = stdio_client(self._params, errlog=stderr.writer)
            async with Client(transport, read_timeout_seconds=self._start_timeout_s) as client:
                self._tools = await _list_tools(client)
                self._client = client
                ready.set_result(None)
                await self._stopping.wait()
        except Exception as exc:
            self._failure = exc
            if not ready.done():
                ready.set_exception(exc)
            else:
                log.warning(
                    "mcp server %s stopped unexpectedly: %s (%d stderr lines, %d bytes; "
                    "--log-level debug shows them)",
                    self.name,
                    type(exc).__name__,
                    stderr.lines,
                    stderr.bytes,
                )
        finally:
            self._client = None
            if not ready.done():
                ready.cancel()
            # The server has exited: with our write end closed too, the relay reads to the end.
            stderr.writer.close()
            _, pending = await asyncio.wait({relay}, timeout=self._stop_timeout_s)
            for task in pending:
                task.cancel()

    async def stop(self) -> None:
        """Stop the server; bounded by ``stop_timeout_s`` (then the task is cancelled)."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping.set()
        _, pending = await asyncio.wait({task}, timeout=self._stop_timeout_s)
        if pending:
            task.cancel()
            await asyncio.wait({task}, timeout=self._stop_timeout_s)
        self._tools = []

    def tools(self) -> list[ToolSpec]:
        return list(self._tools)

    def profile(self, name: str) -> ToolProfile | None:
        """The configured classes of one of the server's tools; its process is the server's,
        shared by every call, so the host cannot confine one call of it."""
        if not any(spec.name == name for spec in self._tools):
            return None
        confinement = Confinement(
            False, f"MCP server {self.name!r} runs every call in its own long-lived process"
        )
        return ToolProfile(self._tool_classes.get(name, self._classes), None, confinement)

    async def execute(self, session_uid: str, call: common_pb2.ToolCall) -> common_pb2.ToolResult:
        client = self._client
        if client is None:
            why = f": {self._failure}" if self._failure is not None else ""
            raise RuntimeError(f"mcp server {self.name!r} is not running{why}")
        arguments = struct_to_python(call.args if call.HasField("args") else None)
        outcome = await client.call_tool(call.tool, arguments, read_timeout_seconds=self._call_timeout_s)
        result = result_from_mcp(outcome)
        result.id = call.id
        return result


class _StderrRelay:
    """An MCP server's stderr, through a pipe into the host's log at DEBUG (payloads marked)."""

    # Longer lines are cut in the log (a server may dump whole documents).
    MAX_LINE = 2000

    def __init__(self, name: str) -> None:
        self.name = name
        read_fd, write_fd = os.pipe()
        self._reader = os.fdopen(read_fd, "rb", buffering=0)
        # What the child's stderr is duplicated from; closed here once the child is gone.
        self.writer = os.fdopen(write_fd, "w")
        self.lines = 0
        self.bytes = 0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        stream = asyncio.StreamReader(limit=1 << 20, loop=loop)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(stream, loop=loop), self._reader
        )
        try:
            while True:
                try:
                    line = await stream.readline()
                except ValueError:  # a line longer than the stream's limit: take what is there
                    line = await stream.read(1 << 20)
                if not line:
                    return
                self.lines += 1
                self.bytes += len(line)
                if log.isEnabledFor(logging.DEBUG):
                    text = line.decode("utf-8", errors="replace").rstrip("\n")[: self.MAX_LINE]
                    log.debug(
                        "mcp server stderr",
                        extra=logs.fields(server=self.name, line=text, may_contain_payloads=True),
                    )
        finally:
            transport.close()


async def _list_tools(client: Client) -> list[ToolSpec]:
    specs: list[ToolSpec] = []
    cursor: str | None = None
    for _ in range(_MAX_TOOL_PAGES):
        page = await client.list_tools(cursor=cursor)
        specs.extend(
            ToolSpec(name=tool.name, description=tool.description or "", input_schema=tool.input_schema)
            for tool in page.tools
        )
        cursor = page.next_cursor
        if cursor is None:
            return specs
    raise RuntimeError(f"tool list did not end within {_MAX_TOOL_PAGES} pages")


def _decoded(data: str, what: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"MCP {what} content is not valid base64") from exc


def _part_from_mcp(block: Any) -> common_pb2.Part:
    if isinstance(block, mcp_types.TextContent):
        return common_pb2.Part(text=common_pb2.TextPart(text=block.text))
    if isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
        return common_pb2.Part(
            file=common_pb2.FilePart(mime=block.mime_type, bytes=_decoded(block.data, block.type))
        )
    if isinstance(block, mcp_types.ResourceLink):
        return common_pb2.Part(
            file=common_pb2.FilePart(mime=block.mime_type or "", uri=block.uri, name=block.name)
        )
    if isinstance(block, mcp_types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, mcp_types.TextResourceContents):
            data = resource.text.encode("utf-8")
            mime = resource.mime_type or "text/plain"
        else:
            data = _decoded(resource.blob, "resource")
            mime = resource.mime_type or "application/octet-stream"
        return common_pb2.Part(file=common_pb2.FilePart(mime=mime, bytes=data, name=resource.uri))
    raise ValueError(f"MCP content of type {type(block).__name__} is not supported")


def result_from_mcp(outcome: mcp_types.CallToolResult) -> common_pb2.ToolResult:
    """An MCP tool result as a ToolResult (id left for the caller to set)."""
    result = common_pb2.ToolResult(content=[_part_from_mcp(block) for block in outcome.content])
    structured = outcome.structured_content
    if structured is not None:
        output = structured if isinstance(structured, Mapping) else {"result": structured}
        result.output.CopyFrom(python_to_struct(output))
    if outcome.is_error:
        result.is_error = True
        texts = [part.text.text for part in result.content if part.WhichOneof("part") == "text"]
        result.error = "\n".join(texts) or "MCP tool reported an error"
    return result
