"""Tools that are plain Python functions, named by import path ("package.module:function").

A tool function takes ``(args, context)``: the call's arguments as a dict (integral numbers as
``int``) and a :class:`ToolContext` carrying the session uid, call id and idempotency key. It
may be sync (run in a worker thread, never on the event loop) or async. It returns one of:

- a ``ToolResult`` (used as is; the registry forces its id and code),
- a mapping (becomes ``ToolResult.output``; must be JSON-shaped),
- a string (becomes one text part of ``ToolResult.content``),
- ``None`` (an empty, successful result),
- any other JSON value (becomes ``output = {"result": value}``).

Raising is a failed call: the registry records an EXECUTOR_ERROR receipt with the message.
A sync function that outlives the registry's timeout keeps running in its thread (Python
cannot stop a thread); its late result is discarded.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import field
from typing import Any

from agentsessions.host.tools.args import python_to_struct, struct_to_python
from agentsessions.host.tools.errors import ToolConfigError
from agentsessions.host.tools.executor import ToolContext, ToolSpec
from agentsessions.host.tools.profile import Confinement, ToolProfile
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2

ToolFunction = Callable[[dict[str, Any], ToolContext], Any]

_IN_PROCESS = Confinement(
    False, "a Python tool runs inside the host process, where the host cannot confine it"
)


def _object_schema() -> dict[str, Any]:
    return {"type": "object"}


@struct(frozen=True)
class CallableTool:
    """One tool backed by a Python function."""

    name: str
    function: ToolFunction
    description: str = ""
    input_schema: Mapping[str, Any] = field(default_factory=_object_schema)
    profile: ToolProfile = field(default_factory=ToolProfile)  # classes and workspace, as configured

    def spec(self) -> ToolSpec:
        return ToolSpec(name=self.name, description=self.description, input_schema=self.input_schema)


def import_tool_function(target: str) -> ToolFunction:
    """Resolve "package.module:attr[.attr...]" to a callable, or raise ToolConfigError."""
    module_name, sep, attr_path = target.partition(":")
    if not sep or not module_name or not attr_path:
        raise ToolConfigError(f"tool target {target!r}: expected 'package.module:function'")
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ToolConfigError(f"tool target {target!r}: cannot import {module_name!r}: {exc}") from exc
    for attr in attr_path.split("."):
        try:
            found = getattr(found, attr)
        except AttributeError as exc:
            raise ToolConfigError(f"tool target {target!r}: {module_name!r} has no {attr_path!r}") from exc
    if not callable(found):
        raise ToolConfigError(f"tool target {target!r}: {attr_path!r} is not callable")
    function: ToolFunction = found
    return function


def _first_doc_line(function: object) -> str:
    doc = inspect.getdoc(function) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def result_from_return(value: object) -> common_pb2.ToolResult:
    """A tool function's return value as a ToolResult (see the module doc for the mapping)."""
    if isinstance(value, common_pb2.ToolResult):
        result = common_pb2.ToolResult()
        result.CopyFrom(value)
        return result
    if value is None:
        return common_pb2.ToolResult()
    if isinstance(value, str):
        return common_pb2.ToolResult(content=[common_pb2.Part(text=common_pb2.TextPart(text=value))])
    if isinstance(value, Mapping):
        return common_pb2.ToolResult(output=python_to_struct(value))
    return common_pb2.ToolResult(output=python_to_struct({"result": value}))


class PythonCallableExecutor:
    """A :class:`ToolExecutor` over Python functions, one tool per function."""

    def __init__(self, tools: Sequence[CallableTool]) -> None:
        names = [tool.name for tool in tools]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ToolConfigError(f"tool names repeat in one executor: {', '.join(duplicates)}")
        if any(not name for name in names):
            raise ToolConfigError("tool name must not be empty")
        self._tools = {tool.name: tool for tool in tools}

    @classmethod
    def from_import_path(
        cls,
        target: str,
        *,
        name: str | None = None,
        description: str | None = None,
        input_schema: Mapping[str, Any] | None = None,
        profile: ToolProfile | None = None,
    ) -> PythonCallableExecutor:
        """One tool from "package.module:function"; the name defaults to the function's."""
        function = import_tool_function(target)
        tool_name = name or getattr(function, "__name__", "") or target.rpartition(":")[2]
        return cls(
            [
                CallableTool(
                    name=tool_name,
                    function=function,
                    description=_first_doc_line(function) if description is None else description,
                    input_schema=input_schema if input_schema is not None else _object_schema(),
                    profile=profile or ToolProfile(),
                )
            ]
        )

    def tools(self) -> list[ToolSpec]:
        return [tool.spec() for tool in self._tools.values()]

    def profile(self, name: str) -> ToolProfile | None:
        """The tool's configured classes and workspace; a Python tool runs inside the host
        process, so one of class subprocess can never be confined."""
        tool = self._tools.get(name)
        if tool is None:
            return None
        return ToolProfile(tool.profile.classes, tool.profile.workspace, _IN_PROCESS)

    async def execute(self, session_uid: str, call: common_pb2.ToolCall) -> common_pb2.ToolResult:
        tool = self._tools.get(call.tool)
        if tool is None:
            raise LookupError(f"tool {call.tool!r} is not served by this executor")
        args = struct_to_python(call.args if call.HasField("args") else None)
        context = ToolContext(
            session_uid=session_uid, call_id=call.id, tool=call.tool, idempotency_key=call.idempotency_key
        )
        if inspect.iscoroutinefunction(tool.function):
            value = await tool.function(args, context)
        else:
            value = await asyncio.to_thread(tool.function, args, context)
            if inspect.isawaitable(value):
                value = await value
        result = result_from_return(value)
        result.id = call.id
        return result
