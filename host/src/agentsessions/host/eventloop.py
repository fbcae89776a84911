"""The host's event loop: the accepting of calls before everything that waits.

asyncio runs ready callbacks first come, first served. On a host saturated by running turns the
ready queue holds hundreds of callbacks at a time, and a new call takes five or six steps of
grpc.aio's own before any code of ours sees it (the request task for its method, the server's
wait over every method's request, the call's task, the handler's task). Each of those steps waited
out the whole queue: under 200 turning sessions a ListSessions that takes 2 ms in its handler
waited ~10 ms at the median and over 100 ms at the 99th percentile before its handler began
(bench/NOTEBOOK.md, "The journal cache's events kept encoded" and "Accepting first").

:class:`AcceptFirstLoop` keeps a second queue that runs ahead of the ready queue, for the callbacks
whose context has :data:`ACCEPTING` set. The host sets it while it starts each gRPC server, so
grpc's serving task, its request tasks and each call's tasks inherit it; the access-log
interceptor, the first code of ours every call runs, clears it for the call's task. From there a
call's own work queues with everyone's: only the accepting goes first.

A callback that goes first runs right after the callback now running, and what it schedules to go
first runs right after it, in order: a call's whole accept path runs in one go once grpc's
completion for it is dispatched. At most :data:`DRAIN_BATCH` of them run before the ready queue
gets a turn, so a chain that never ends cannot starve the rest. Callbacks scheduled from other
threads (``call_soon_threadsafe``), I/O callbacks and timers keep their place in the ready queue
(I/O callbacks first too measured no better for the accepting and ~6% fewer turns under load).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
from collections.abc import Callable
from typing import TypeVarTuple

from agentsessions.sdk.grpcloop import GrpcEventLoop

_Ts = TypeVarTuple("_Ts")

ACCEPTING: contextvars.ContextVar[bool] = contextvars.ContextVar("agentsessions_accepting", default=False)

# Callbacks that go first run at most this many in a row before the ready queue gets a turn.
DRAIN_BATCH = 128


class AcceptFirstLoop(GrpcEventLoop):
    """A selector event loop that runs the accepting of calls first (and grpc.aio's completions in
    one pass per wake-up: ``agentsessions.sdk.grpcloop``)."""

    def __init__(self) -> None:
        super().__init__()
        self._first: collections.deque[asyncio.Handle] = collections.deque()
        self._draining = False  # a drain of ``_first`` is queued or running
        self._drain_context = contextvars.Context()

    def call_soon(
        self,
        callback: Callable[[*_Ts], object],
        *args: *_Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        accepting = ACCEPTING.get() if context is None else context.get(ACCEPTING, False)
        if self._closed or self._debug:  # type: ignore[attr-defined]
            # asyncio's own path: it raises on a closed loop and checks the caller in debug mode.
            if not accepting:
                return super().call_soon(callback, *args, context=context)
            self._check_closed()  # type: ignore[attr-defined]
            self._check_thread()  # type: ignore[attr-defined]
            self._check_callback(callback, "call_soon")  # type: ignore[attr-defined]
            handle = asyncio.Handle(callback, args, self, context)
            if handle._source_traceback:  # type: ignore[attr-defined]
                del handle._source_traceback[-1]  # type: ignore[attr-defined]
            self._go_first(handle)
            return handle
        # Every task step and future callback comes through here (~45 a turn at 32 sessions):
        # one frame, where asyncio's call_soon takes three (itself, _check_closed, _call_soon)
        # before the Handle's own.
        handle = asyncio.Handle(callback, args, self, context)
        if accepting:
            self._go_first(handle)
        else:
            self._ready.append(handle)  # type: ignore[attr-defined]
        return handle

    def _go_first(self, handle: asyncio.Handle) -> None:
        self._first.append(handle)
        if not self._draining:
            self._draining = True
            # Next in line: the pass now running takes it before anything already waiting.
            self._ready.appendleft(self._drain_handle())  # type: ignore[attr-defined]

    def _drain_handle(self) -> asyncio.Handle:
        return asyncio.Handle(self._drain, (), self, self._drain_context)

    def _drain(self) -> None:
        first = self._first
        ran = 0
        try:
            while first and ran < DRAIN_BATCH:
                handle = first.popleft()
                ran += 1
                if not handle.cancelled():
                    handle._run()
        finally:
            if first:
                # A long run of them: the ready queue goes first this once.
                self._ready.append(self._drain_handle())  # type: ignore[attr-defined]
            else:
                self._draining = False

    def close(self) -> None:
        super().close()
        self._first.clear()
        self._draining = False


def new_loop() -> asyncio.AbstractEventLoop:
    """The loop ``agentsessions serve`` runs on (``asyncio.Runner(loop_factory=new_loop)``)."""
    return AcceptFirstLoop()
