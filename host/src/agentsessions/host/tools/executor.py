"""The tool-executor seam and the registry that runs host-mediated calls at most once.

The controller journals a CONTROLLER_MEDIATED (or approved REQUIRES_APPROVAL) call's intent,
then hands it to :class:`ToolRegistry.execute`. The registry routes by tool name to an
executor and deduplicates on ``(session uid, idempotency key)`` through the journal store's
durable tool receipts (invariant I3):

1. a receipt for the key exists -> it is returned and nothing runs (a re-drive after a crash);
2. otherwise the executor runs, its outcome (success or failure) becomes the receipt, the
   receipt is written, and only then is it returned to the controller.

What remains is one window: a crash after the executor's effect and before the receipt write
re-runs the effect once on recovery. Executors close it themselves where they can: every call
carries the idempotency key (``call.idempotency_key``, and ``ToolContext.idempotency_key`` for
Python callables) so an executor can hand it to the system it changes (an HTTP
``Idempotency-Key`` header, a unique row, a marker file).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import field
from typing import Any, Protocol, runtime_checkable

from agentsessions.host.tools.args import python_to_struct, validate_tool_call
from agentsessions.host.tools.errors import DuplicateToolError, MissingToolExecutorError
from agentsessions.host.tools.profile import ToolProfile
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2

log = logging.getLogger(__name__)

DEFAULT_TOOL_TIMEOUT_S = 300.0


def _object_schema() -> dict[str, Any]:
    return {"type": "object"}


@struct(frozen=True)
class ToolSpec:
    """A tool an executor serves: its name, what it does, and the JSON Schema of its arguments."""

    name: str
    description: str = ""
    input_schema: Mapping[str, Any] = field(default_factory=_object_schema)

    def definition(self) -> common_pb2.ToolDefinition:
        """The tool as offered to a model in ``ModelCall.tools``."""
        return common_pb2.ToolDefinition(
            name=self.name,
            description=self.description,
            input_schema=python_to_struct(self.input_schema, path=f"{self.name}.input_schema"),
        )


@struct(frozen=True)
class ToolContext:
    """What a tool function learns about the call besides its arguments."""

    session_uid: str
    call_id: str
    tool: str
    idempotency_key: str


@runtime_checkable
class ToolExecutor(Protocol):
    """Runs host-mediated tool calls for the tools it lists.

    ``execute`` returns the call's outcome; a tool-level failure is a result with
    ``is_error`` set, and a raised exception is turned into one by the registry.
    """

    def tools(self) -> list[ToolSpec]:
        """The tools this executor serves (for executors with a lifecycle: after ``start``)."""
        ...

    async def execute(self, session_uid: str, call: common_pb2.ToolCall) -> common_pb2.ToolResult:
        """Run one call. ``call.idempotency_key`` identifies the effect across re-drives."""
        ...


@runtime_checkable
class ManagedToolExecutor(ToolExecutor, Protocol):
    """An executor with resources to acquire before use and release after (processes, sessions)."""

    async def start(self) -> None:
        """Acquire resources and learn the served tools; bounded in time."""
        ...

    async def stop(self) -> None:
        """Release resources; bounded in time, safe to call more than once."""
        ...


class ToolReceiptStore(Protocol):
    """The part of the journal store the registry needs (JournalStore satisfies it)."""

    async def get_tool_receipt(self, uid: str, idempotency_key: str) -> common_pb2.ToolResult | None:
        """The recorded outcome for (session, key), if any."""
        ...

    async def put_tool_receipt(self, uid: str, idempotency_key: str, result: common_pb2.ToolResult) -> None:
        """Record an outcome once; a second put for the same key keeps the first."""
        ...


class _KeyLocks:
    """One lock per (session, key) while in use, so concurrent duplicates run the effect once."""

    def __init__(self) -> None:
        self._locks: dict[tuple[str, str], tuple[asyncio.Lock, int]] = {}

    @asynccontextmanager
    async def hold(self, session_uid: str, key: str) -> AsyncIterator[None]:
        slot = (session_uid, key)
        lock, users = self._locks.get(slot, (asyncio.Lock(), 0))
        self._locks[slot] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[slot]
            if users == 1:
                del self._locks[slot]
            else:
                self._locks[slot] = (lock, users - 1)


def error_result(call: common_pb2.ToolCall, message: str) -> common_pb2.ToolResult:
    """An EXECUTOR_ERROR receipt for a call whose executor failed."""
    return common_pb2.ToolResult(
        id=call.id,
        is_error=True,
        code=common_pb2.ToolResult.EXECUTOR_ERROR,
        error=message,
        content=[common_pb2.Part(text=common_pb2.TextPart(text=message))],
    )


def _as_receipt(call: common_pb2.ToolCall, result: common_pb2.ToolResult) -> common_pb2.ToolResult:
    """The executor's result in receipt form: correlated, and with a host-owned code."""
    receipt = common_pb2.ToolResult()
    receipt.CopyFrom(result)
    receipt.id = call.id
    # Approval fields belong to the controller's receipt for a decided call, never to an executor.
    receipt.approval_request_seq = 0
    receipt.approval_decision_seq = 0
    if receipt.is_error:
        # An approved call's failed receipt must read EXECUTOR_ERROR (spec 5.5 receipt validity).
        receipt.code = common_pb2.ToolResult.EXECUTOR_ERROR
        if not receipt.error:
            receipt.error = f"tool {call.tool!r} reported an error"
    else:
        receipt.code = common_pb2.ToolResult.CODE_UNSPECIFIED
    return receipt


def _describe_failure(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class ToolRegistry:
    """Routes host-mediated calls to executors by tool name and runs each key at most once.

    The registry is itself a :class:`ToolExecutor` over the union of its executors' tools.
    ``start`` (called lazily by ``execute`` if needed) starts managed executors and indexes
    tool names; a name served twice is a :class:`DuplicateToolError`.
    """

    def __init__(
        self,
        receipts: ToolReceiptStore,
        executors: Sequence[ToolExecutor] = (),
        *,
        timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self._receipts = receipts
        self._executors = list(executors)
        self._timeout_s = timeout_s
        self._routes: dict[str, ToolExecutor] = {}
        self._started = False
        self._start_lock = asyncio.Lock()
        self._keys = _KeyLocks()

    async def start(self) -> None:
        """Start managed executors and index their tools; idempotent."""
        async with self._start_lock:
            if self._started:
                return
            started: list[ManagedToolExecutor] = []
            try:
                for executor in self._executors:
                    if isinstance(executor, ManagedToolExecutor):
                        await executor.start()
                        started.append(executor)
                self._routes = self._index()
            except BaseException:
                for executor in reversed(started):
                    await executor.stop()
                raise
            self._started = True

    async def stop(self) -> None:
        """Stop managed executors (each bounded by the executor itself); idempotent."""
        async with self._start_lock:
            for executor in reversed(self._executors):
                if isinstance(executor, ManagedToolExecutor):
                    await executor.stop()
            self._routes = {}
            self._started = False

    def _index(self) -> dict[str, ToolExecutor]:
        routes: dict[str, ToolExecutor] = {}
        for executor in self._executors:
            for spec in executor.tools():
                if spec.name in routes:
                    raise DuplicateToolError(f"tool {spec.name!r} is served by more than one executor")
                routes[spec.name] = executor
        return routes

    def tools(self) -> list[ToolSpec]:
        """Every served tool, in executor order (empty until started)."""
        if not self._started:
            return []
        return [spec for executor in self._executors for spec in executor.tools()]

    async def profile(self, tool: str) -> ToolProfile | None:
        """What the configuration says about a served tool (classes, workspace, confinement;
        unclassified when its executor says nothing), or None when no executor serves it."""
        if not self._started:
            await self.start()
        executor = self._routes.get(tool)
        if executor is None:
            return None
        described = getattr(executor, "profile", None)
        found = described(tool) if callable(described) else None
        return found if isinstance(found, ToolProfile) else ToolProfile()

    def serves(self, tool: str) -> bool:
        """Whether a started registry has an executor for ``tool``."""
        return tool in self._routes

    async def execute(self, session_uid: str, call: common_pb2.ToolCall) -> common_pb2.ToolResult:
        """The call's receipt: the recorded one for its key, else the executor's, made durable.

        Raises the typed errors of :func:`validate_tool_call` for a call the host must not
        run, and :class:`MissingToolExecutorError` when no executor serves the tool (nothing
        ran and nothing was recorded, so the call stays recoverable once one is configured).
        """
        validate_tool_call(call)
        if not session_uid:
            raise ValueError("session_uid is required to deduplicate tool effects")
        await self.start()
        key = call.idempotency_key
        async with self._keys.hold(session_uid, key):
            recorded = await self._receipts.get_tool_receipt(session_uid, key)
            if recorded is not None:
                log.info("tool %s: receipt already recorded for its key; not re-run", call.tool)
                return _as_receipt(call, recorded)
            executor = self._routes.get(call.tool)
            if executor is None:
                raise MissingToolExecutorError(call.tool, list(self._routes))
            receipt = _as_receipt(call, await self._run(executor, session_uid, call))
            await self._receipts.put_tool_receipt(session_uid, key, receipt)
            # Another host replica may have recorded first; its receipt is the one that counts.
            kept = await self._receipts.get_tool_receipt(session_uid, key)
            return receipt if kept is None else _as_receipt(call, kept)

    async def _run(
        self, executor: ToolExecutor, session_uid: str, call: common_pb2.ToolCall
    ) -> common_pb2.ToolResult:
        limit = asyncio.timeout(self._timeout_s)
        try:
            async with limit:
                return await executor.execute(session_uid, call)
        except Exception as exc:
            # A TimeoutError is the host's limit only when that limit expired: a tool may raise its own.
            if isinstance(exc, TimeoutError) and limit.expired():
                log.warning("tool %s timed out after %ss", call.tool, self._timeout_s)
                return error_result(call, f"tool {call.tool!r} timed out after {self._timeout_s:g}s")
            log.warning("tool %s failed: %s", call.tool, type(exc).__name__)
            return error_result(call, _describe_failure(exc))
