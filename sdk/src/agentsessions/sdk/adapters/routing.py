"""What every framework adapter shares: the execution a framework's code runs in, who runs each
tool, and a tool's result as the framework gets it back.

A framework calls its model and its tools from deep inside its own run loop, where the adapter
cannot pass arguments: the execution travels in a context variable instead (:func:`running`),
which asyncio copies into every task the framework starts, so concurrent tool calls of one
completion all see their execution.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

from agentsessions.sdk.execution import Execution, tool_result_of
from agentsessions.sdk.structs import struct
from agentsessions.sdk.types import Mediation, ToolCall, ToolResult

# Why an approval-gated call needs a decision: a fixed text, or one built from the call.
Reason = str | Callable[[ToolCall], str]

_CURRENT: contextvars.ContextVar[tuple[Execution, asyncio.AbstractEventLoop] | None] = contextvars.ContextVar(
    "agentsessions_execution", default=None
)


@contextlib.contextmanager
def running(ex: Execution) -> Iterator[Execution]:
    """Make ``ex`` the execution the framework's model and tool calls go to, for the block
    (which runs on ``ex``'s event loop)."""
    token = _CURRENT.set((ex, asyncio.get_running_loop()))
    try:
        yield ex
    finally:
        _CURRENT.reset(token)


def current_execution(where: str) -> Execution:
    """The execution the calling code runs in; a RuntimeError naming ``where`` outside one."""
    return _bound(where)[0]


def execution_loop(where: str) -> asyncio.AbstractEventLoop:
    """The event loop the current execution runs on (for a framework that calls from a thread)."""
    return _bound(where)[1]


def _bound(where: str) -> tuple[Execution, asyncio.AbstractEventLoop]:
    bound = _CURRENT.get()
    if bound is None:
        raise RuntimeError(
            f"{where} was used outside an agentsessions execution: run the agent through the "
            "adapter's harness (or inside agentsessions.sdk.adapters.routing.running(ex))"
        )
    return bound


@struct(frozen=True)
class ToolRoutes:
    """Who runs which tool, and the reason an approval request carries.

    ``host_tools`` are run by the host (CONTROLLER_MEDIATED; its ``--tools-config`` names their
    executors); a call the framework marks for approval is REQUIRES_APPROVAL (in v1 the host runs
    an approved call, so its executor is configured on the host too); every other tool runs in
    the harness and is reported (IN_HARNESS_REPORTED). ``reasons`` maps a tool to its approval
    reason (a text or a function of the call); ``reason`` is the one for the others."""

    host_tools: frozenset[str] = frozenset()
    reasons: Mapping[str, Reason] = dataclasses.field(default_factory=dict)
    reason: Reason | None = None

    @classmethod
    def of(
        cls,
        host_tools: Collection[str] = (),
        reasons: Mapping[str, Reason] | None = None,
        reason: Reason | None = None,
    ) -> ToolRoutes:
        if isinstance(host_tools, str):
            raise TypeError("host_tools: expected a collection of tool names, got one string")
        return cls(frozenset(host_tools), dict(reasons or {}), reason)

    def mediation(self, name: str, *, approval: bool = False, external: bool = False) -> Mediation:
        """The mediation of a call to ``name``: ``approval`` when the framework gates it,
        ``external`` when the framework says it is executed elsewhere."""
        if approval:
            return Mediation.REQUIRES_APPROVAL
        if external or name in self.host_tools:
            return Mediation.CONTROLLER_MEDIATED
        return Mediation.IN_HARNESS_REPORTED

    def approval_reason(self, call: ToolCall) -> str:
        given = self.reasons.get(call.name, self.reason)
        if given is None:
            return f"{call.name} needs a person's approval"
        return given(call) if callable(given) else given


async def route(
    routes: ToolRoutes,
    call: ToolCall,
    run: Callable[[dict[str, Any]], Any] | None,
    *,
    approval: bool = False,
    external: bool = False,
    where: str,
) -> ToolResult:
    """Make ``call`` through the current execution with the mediation ``routes`` give it;
    ``run`` is the framework's own invocation of the tool (used only for an in-harness call)."""
    ex = current_execution(where)
    mediation = routes.mediation(call.name, approval=approval, external=external)
    call = dataclasses.replace(call, mediation=mediation)
    if mediation == Mediation.IN_HARNESS_REPORTED:
        if run is None:
            raise TypeError(f"tool {call.name!r} runs in the harness but the framework gave no way to run it")
        return await ex.call_tool(call, run)
    reason = routes.approval_reason(call) if mediation == Mediation.REQUIRES_APPROVAL else ""
    return await ex.call_tool(call, reason=reason)


def jsonable(value: Any) -> Any:
    """A framework tool's return value as JSON (pydantic models, dataclasses, dates...): every
    framework adapted here depends on pydantic, whose encoder knows what the framework returns."""
    import pydantic_core  # every adapted framework installs pydantic; the thin SDK does not

    return pydantic_core.to_jsonable_python(value)


def reported(call_id: str, value: Any) -> ToolResult:
    """The result an in-harness tool's return value is journaled as (text, an object, or
    ``{"result": value}`` for any other JSON value)."""
    return tool_result_of(call_id, jsonable(value))


def result_value(result: ToolResult) -> str | dict[str, Any]:
    """What the framework gets back from a successful call: its text when it has text content,
    else its structured output (keys sorted), else "". The same on every run, since it is built
    from the journaled result (live, the result just reported; on replay, the recorded one) and a
    JSON object's key order does not survive the journal (a framework that writes the object out
    as JSON text for the model would otherwise send other bytes on replay)."""
    text = result.text()
    if text or result.output is None:
        return text
    ordered: dict[str, Any] = _sorted(result.output)
    return ordered


def _sorted(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted(item) for item in value]
    return value


def error_text(result: ToolResult) -> str:
    """What the model reads of a failed call (a denial, an executor error, a tool's failure)."""
    return result.error or result.text() or "the tool call failed"
