"""``agentsessions.v1.Harness`` for one harness object: Describe, and Connect (spec section 5).

One Connect stream drives one execution. The first frame must be Start; the harness's ``run``
then talks to a :class:`~agentsessions.sdk.sink.StreamSink` whose calls become Events. The stream
ends with END (COMPLETED, FAILED or CANCELED) or, after an approval park, with exactly one PARKED
acknowledgement and no END.

The run is awaited in the stream's own handler, and its sink reads the host's replies with plain
awaits on the stream: an execution costs no task, queue or extra timer of its own. Two things
need a second task, and only they get one: a harness with a cancel hook (a watcher reads every
frame so the hook hears a Cancel while the harness is busy), and a traced run (it starts in the
host's trace context, see ``tracing``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from agentsessions.sdk import tracing
from agentsessions.sdk.errors import ExecutionCancelledError, find_park
from agentsessions.sdk.extensions import HISTORY_HELD, parse_connect_metadata
from agentsessions.sdk.harness import Harness, Start, require_harness
from agentsessions.sdk.sink import Frame, FrameWatcher, StreamSink
from agentsessions.sdk.startframe import HeldHistories, LazyHistory, parse_start_frame
from agentsessions.sdk.structs import replace
from agentsessions.v1 import common_pb2, harness_pb2, harness_pb2_grpc

logger = logging.getLogger("agentsessions.sdk.server")

_KIND = common_pb2
CancelHook = Callable[[str, str], Awaitable[bool]]


class HarnessServicer(harness_pb2_grpc.HarnessServicer):
    """``agentsessions.v1.Harness`` for one harness object.

    ``reply_timeout`` bounds each wait for a host reply (and for the host to take an event);
    ``start_timeout`` bounds the wait for the Start frame; ``cancel_grace`` is how long a
    cancelled run may take to unwind before it is cancelled as a task; ``held_history_bytes``
    bounds the session histories kept for the host's history-by-reference extension
    (``agentsessions.sdk.extensions``; 0 keeps none).
    """

    def __init__(
        self,
        harness: Harness,
        *,
        reply_timeout: float | None = 600.0,
        start_timeout: float = 30.0,
        cancel_grace: float = 5.0,
        held_history_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self._harness = require_harness(harness, "HarnessServicer")
        self._held = HeldHistories(held_history_bytes)
        hook = getattr(harness, "cancel", None)
        self._cancel_hook: CancelHook | None = hook if callable(hook) else None
        self._reply_timeout = reply_timeout
        self._start_timeout = start_timeout
        self._cancel_grace = cancel_grace

    async def Describe(
        self, request: harness_pb2.DescribeRequest, context: grpc.aio.ServicerContext
    ) -> harness_pb2.HarnessDescriptor:
        try:
            return await self._harness.describe()
        except Exception as exc:
            logger.warning("describe failed: %s", type(exc).__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"harness describe failed: {exc}")
            raise  # abort raises; this keeps type checkers honest

    # grpc.aio serves a coroutine handler that writes with context.write; the generated stub
    # types only the generator form.
    async def Connect(  # type: ignore[override]
        self,
        request_iterator: AsyncIterator[Frame],
        context: grpc.aio.ServicerContext[Frame, common_pb2.Event],
    ) -> None:
        async def read() -> Frame | None:
            item: Any = await context.read()
            if item is grpc.aio.EOF:
                return None
            return Frame.FromString(item) if isinstance(item, bytes) else item

        try:
            async with asyncio.timeout(self._start_timeout):
                first: Any = await context.read()
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"no Start frame within {self._start_timeout} s"
            )
            return
        if isinstance(first, bytes):  # served by add_to_server: the history stays unparsed for now
            try:
                first = parse_start_frame(first)
            except DecodeError as exc:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"first frame does not decode as agentsessions.v1.ControllerFrame: {exc}",
                )
                return
            is_start = first.HasField("start")
        else:
            is_start = first is not grpc.aio.EOF and first.WhichOneof("frame") == "start"
        if not is_start:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "first ControllerFrame must be Start")
            return
        if not first.execution_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Start frame requires execution_id")
            return

        start = start_from_frame(first)
        metadata = context.invocation_metadata()
        extensions = parse_connect_metadata(metadata)
        if extensions.history_base is not None:
            # History by reference (agentsessions.sdk.extensions): the held events, then the frame's.
            held, kept = (None, False)
            if not isinstance(first, Frame):
                held, kept = self._held.take(
                    start.session, start.execution_id, extensions.history_base, first.start
                )
            if held is None and extensions.history_base:
                context.set_trailing_metadata(((HISTORY_HELD, ""),))
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"history base {extensions.history_base!r} is not held by this harness process",
                )
                return
            if held is not None:
                start = replace(start, history=LazyHistory(held=held))
            if kept:
                # Said with the stream's status: no write of its own ahead of the first event.
                context.set_trailing_metadata(((HISTORY_HELD, start.execution_id),))
        writer = _Writer(context)
        sink = StreamSink(
            start.session,
            start.execution_id,
            write=writer.write,
            read=read,
            reply_timeout=self._reply_timeout,
            extensions=extensions,
        )
        # The run joins the host's trace (when OpenTelemetry is installed): see tracing.py.
        run_context, traced = tracing.start_run(metadata, start.session, start.execution_id)
        if self._cancel_hook is None and run_context is None:
            error = await self._run_inline(start, sink)
        else:
            error = await self._run_in_task(start, sink, read, run_context, traced)
        if not await writer.settled(self._cancel_grace):
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "the host did not accept the harness's last event in time"
            )
            return
        await self._finish(start, sink, error, context)

    async def _run_inline(self, start: Start, sink: StreamSink) -> BaseException | None:
        """Run in this handler's task; a host Cancel cancels it after the grace."""
        task = asyncio.current_task()
        assert task is not None
        grace: list[asyncio.TimerHandle] = []
        fired: list[bool] = []

        def cut() -> None:
            fired.append(True)
            task.cancel()

        def arm(reason: str) -> None:
            grace.append(asyncio.get_running_loop().call_later(self._cancel_grace, cut))

        sink.on_cancel = arm
        try:
            await self._harness.run(start, sink)
        except asyncio.CancelledError:
            # Only the grace's own cut is taken here: a timer armed and not fired yet says nothing,
            # and the host cutting the stream first (it does, its grace runs from before ours)
            # cancels the call itself.
            if not fired or task.cancelling() != 1:
                raise
            task.uncancel()
            return ExecutionCancelledError("the harness run was cancelled after the cancel grace")
        except Exception as exc:
            return exc
        finally:
            for handle in grace:
                handle.cancel()
            sink.close()
        return None

    async def _run_in_task(
        self,
        start: Start,
        sink: StreamSink,
        read: Callable[[], Awaitable[Frame | None]],
        run_context: Any,
        traced: tracing.Finish,
    ) -> BaseException | None:
        run = asyncio.create_task(
            self._harness.run(start, sink), name=f"harness-run-{start.execution_id}", context=run_context
        )
        run.add_done_callback(traced)
        grace: list[asyncio.TimerHandle] = []

        def arm(reason: str) -> None:
            if not run.done():
                grace.append(asyncio.get_running_loop().call_later(self._cancel_grace, run.cancel))

        sink.on_cancel = arm
        watch: asyncio.Task[None] | None = None
        hook = self._cancel_hook
        if hook is not None:

            async def on_cancel(reason: str) -> None:
                try:
                    ends_by_itself = await hook(start.execution_id, reason)
                except Exception as exc:
                    logger.warning("cancel hook of %s failed: %s", start.execution_id, type(exc).__name__)
                    ends_by_itself = False
                if not ends_by_itself:
                    run.cancel()

            watcher = FrameWatcher(start.execution_id, on_cancel)
            sink.reader = watcher.read
            watch = asyncio.create_task(watcher.watch(sink, read))
        try:
            await asyncio.wait({run})
        finally:
            for handle in grace:
                handle.cancel()
            sink.close()
            pending = {t for t in (run, watch) if t is not None and not t.done()}
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=self._cancel_grace)
        if run.cancelled():
            return ExecutionCancelledError("the harness run was cancelled")
        return run.exception()

    async def _finish(
        self,
        start: Start,
        sink: StreamSink,
        error: BaseException | None,
        context: grpc.aio.ServicerContext[Frame, common_pb2.Event],
    ) -> None:
        """The closing event(s) and status, once the run has returned or raised."""
        if sink.cancel_reason is not None:
            # Cancellation takes precedence over however the run unwound.
            await context.write(_end(start.execution_id, "CANCELED", sink.cancel_reason))
            return
        if sink.parked is not None:
            park = find_park(error) if error is not None else sink.parked
            if park is not None and park.ref == sink.parked.ref:
                await context.write(
                    common_pb2.Event(
                        execution_id=start.execution_id, kind=_KIND.EVENT_PARKED, parked=sink.parked.ref
                    )
                )
                return
            logger.info(
                "execution %s failed after an approval park: %s", start.execution_id, type(error).__name__
            )
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"harness run failed after approval park: {error}"
            )
            return
        if error is None:
            await context.write(_end(start.execution_id, "COMPLETED", ""))
            return
        description = str(error) or type(error).__name__
        logger.info("execution %s failed: %s", start.execution_id, type(error).__name__)
        await context.write(_end(start.execution_id, "FAILED", description))
        await context.abort(grpc.StatusCode.UNKNOWN, description)


class _Writer:
    """The stream's writes, each run to completion even when the task that started it is
    cancelled (a cancelled run, an abandoned sink call): gRPC takes one message write at a time,
    so the closing event must wait for one already under way, not race it."""

    def __init__(self, context: grpc.aio.ServicerContext[Frame, common_pb2.Event]) -> None:
        self._context = context
        self._inflight: asyncio.Future[None] | None = None

    async def write(self, event: common_pb2.Event) -> None:
        await self.settled(None)
        inflight = self._inflight = asyncio.ensure_future(self._context.write(event))
        # Its failure is its caller's to see, or nobody's once that caller was cancelled.
        inflight.add_done_callback(lambda f: f.cancelled() or f.exception())
        await asyncio.shield(inflight)

    async def settled(self, within: float | None) -> bool:
        """Wait (at most ``within`` s) for the write under way; False if it is still going."""
        inflight = self._inflight
        if inflight is None or inflight.done():
            return True
        await asyncio.wait({inflight}, timeout=within)
        return inflight.done()


def start_from_frame(frame: Any) -> Start:
    """The SDK's Start for a Start frame (a ControllerFrame, or the view ``startframe`` parses)."""
    body = frame.start
    return Start(
        session=frame.session,
        execution_id=frame.execution_id,
        inputs=body.inputs,
        # A Python object per event only for a harness that reads them (a history grows by ~5
        # events a turn; an echo turn never looks at it): the view leaves it unparsed till then.
        history=body.history if isinstance(frame, Frame) else LazyHistory(body),
        config=body.config,
        resume_from_seq=body.resume_from_seq,
        identity=body.identity if body.HasField("identity") else None,
    )


def add_to_server(servicer: HarnessServicer, server: grpc.aio.Server) -> None:
    """Serve ``servicer`` on ``server`` as ``agentsessions.v1.Harness``, taking Connect frames as
    bytes so that the Start frame's history is parsed only if the harness reads it (what
    ``add_HarnessServicer_to_server`` would do otherwise, frames fully parsed, works too)."""
    handler = grpc.method_handlers_generic_handler(
        harness_pb2.DESCRIPTOR.services_by_name["Harness"].full_name,
        {
            "Describe": grpc.unary_unary_rpc_method_handler(
                servicer.Describe,
                request_deserializer=harness_pb2.DescribeRequest.FromString,
                response_serializer=harness_pb2.HarnessDescriptor.SerializeToString,
            ),
            "Connect": grpc.stream_stream_rpc_method_handler(
                servicer.Connect,
                request_deserializer=bytes,
                response_serializer=common_pb2.Event.SerializeToString,
            ),
        },
    )
    server.add_generic_rpc_handlers((handler,))


def _end(execution_id: str, state: str, description: str) -> common_pb2.Event:
    end = common_pb2.HarnessEnd(state=state)
    if description:
        end.error.description = description
    return common_pb2.Event(execution_id=execution_id, kind=_KIND.EVENT_END, end=end)
