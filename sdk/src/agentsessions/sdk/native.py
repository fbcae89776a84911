"""Harnesses written in native values: a base class and a decorator over :class:`Execution`.

Either subclass :class:`NativeHarness` (set ``descriptor``, write ``execute``)::

    class Echo(NativeHarness):
        descriptor = HarnessDescriptor(id="my-echo", version="1", models=("echo",))

        async def execute(self, ex: Execution) -> None:
            await ex.model([Message.user(ex.input_text())], model="echo")

or decorate a function with :func:`define_harness`::

    @define_harness(id="my-echo", version="1", models=("echo",))
    async def echo(ex: Execution) -> None:
        await ex.model([Message.user(ex.input_text())], model="echo")

Both are ordinary harnesses (``describe``/``run``): serve them with ``agentsessions-harness
serve module:echo`` or run them in the host. ``cancellable = True`` (or
``@define_harness(cancellable=True)``) gives the harness a cancel hook: the host's Cancel then reaches
``ex.cancelled()`` / ``ex.cancel_reason`` even while the code is busy with its own work, and
the run is trusted to end by itself (behind Connect a watcher reads the stream for it, the one
case that costs a task per execution). Without it, a Cancel surfaces as
``ExecutionCancelledError`` from the next effect, or as the run being cancelled.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import ClassVar

from agentsessions.sdk import convert
from agentsessions.sdk.execution import Execution
from agentsessions.sdk.harness import EventSink, Start
from agentsessions.sdk.types import HarnessDescriptor, Resumability, ToolSpec
from agentsessions.v1 import harness_pb2

CancelHook = Callable[[str, str], Awaitable[bool]]


class NativeHarness:
    """Base of a harness in native values: ``descriptor`` says what it is, ``execute`` runs one
    execution (returning means COMPLETED, raising means FAILED)."""

    descriptor: HarnessDescriptor
    cancellable: ClassVar[bool] = False

    def __init__(self) -> None:
        self._running: dict[str, Execution] = {}
        self._described: harness_pb2.HarnessDescriptor | None = None

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        if self._described is None:
            self._described = convert.descriptor_to_proto(self.descriptor)
        return self._described

    async def run(self, start: Start, sink: EventSink) -> None:
        ex = Execution(start, sink, descriptor=self.descriptor)
        self._running[start.execution_id] = ex
        try:
            await self.execute(ex)
        finally:
            self._running.pop(start.execution_id, None)

    async def execute(self, ex: Execution) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement execute(ex)")

    @property
    def cancel(self) -> CancelHook | None:
        """The cancel hook (``agentsessions.sdk.harness``), present when ``cancellable``."""
        return self._cancel if self.cancellable else None

    async def _cancel(self, execution_id: str, reason: str) -> bool:
        ex = self._running.get(execution_id)
        if ex is None:
            return False
        ex.cancel(reason)
        return True


class FunctionHarness(NativeHarness):
    """A harness whose execution is one async function of an :class:`Execution`."""

    def __init__(
        self,
        execute: Callable[[Execution], Awaitable[None]],
        descriptor: HarnessDescriptor,
        *,
        cancellable: bool,
    ) -> None:
        super().__init__()
        self.descriptor = descriptor
        self._execute = execute
        self._cancellable = cancellable
        self.__doc__ = execute.__doc__
        self.__name__ = getattr(execute, "__name__", "harness")

    @property
    def cancel(self) -> CancelHook | None:
        return self._cancel if self._cancellable else None

    async def execute(self, ex: Execution) -> None:
        await self._execute(ex)


def define_harness(
    *,
    id: str,
    version: str,
    models: Sequence[str] = (),
    tools: Sequence[ToolSpec] = (),
    resumability: Resumability = Resumability.STATELESS_REPLAY,
    fork_safe: bool = False,
    streaming: bool = False,
    reasoning_replay: bool = False,
    requires_gpu: bool = False,
    cancellable: bool = False,
) -> Callable[[Callable[[Execution], Awaitable[None]]], FunctionHarness]:
    """Make an ``async def f(ex: Execution)`` a harness with this descriptor."""
    descriptor = HarnessDescriptor(
        id=id,
        version=version,
        models=tuple(models),
        tools=tuple(tools),
        resumability=resumability,
        fork_safe=fork_safe,
        requires_gpu=requires_gpu,
        streaming=streaming,
        reasoning_replay=reasoning_replay,
    )

    def wrap(execute: Callable[[Execution], Awaitable[None]]) -> FunctionHarness:
        return FunctionHarness(execute, descriptor, cancellable=cancellable)

    return wrap
