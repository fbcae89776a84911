"""The harness side of ``Harness.Connect``: serve a :class:`Harness` over gRPC (spec section 5).

One Connect stream drives one execution. The first frame must be Start; the harness's ``run``
then talks to a stream-backed :class:`EventSink` whose calls become Events, and whose model and
tool calls wait for the host's reply frame. The stream ends with END (COMPLETED, FAILED or
CANCELED) or, after an approval park, with exactly one PARKED acknowledgement and no END.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import grpc

from agentsessions.sdk import tracing
from agentsessions.sdk.approval import host_owned_receipt_field, receipt_conflict
from agentsessions.sdk.errors import (
    ApprovalParkedError,
    CorrelationError,
    ExecutionCancelledError,
    ProtocolError,
    SinkClosedError,
    SinkError,
    ToolCallRejectedError,
)
from agentsessions.sdk.harness import Harness, Start, text_message
from agentsessions.sdk.limits import MESSAGE_SIZE_OPTIONS
from agentsessions.sdk.tls import ServerTLS, add_port
from agentsessions.v1 import common_pb2, harness_pb2, harness_pb2_grpc

logger = logging.getLogger(__name__)


# Kinds through the generated module's constants: an EnumTypeWrapper attribute costs ~1.5 us.
_KIND = common_pb2
_Result = common_pb2.ToolResult


@dataclass(frozen=True)
class _Interrupt:
    """Wakes a sink call waiting for a reply; the reason is already the sink's seal."""

    error: SinkError


class StreamSink:
    """An :class:`EventSink` backed by one Connect stream.

    Calls are serialized (one request outstanding). The first terminal condition seals the
    sink for good: an approval park, a host cancel, a protocol failure or the end of the
    stream; every later call raises that same error.
    """

    def __init__(self, session: str, execution_id: str, *, reply_timeout: float | None) -> None:
        self._session = session
        self._execution_id = execution_id
        self._reply_timeout = reply_timeout
        # (event, delivered) pairs for the stream handler; None marks the end of the run.
        self.outbox: asyncio.Queue[tuple[common_pb2.Event, asyncio.Future[None] | None] | None] = (
            asyncio.Queue()
        )
        self._inbox: asyncio.Queue[harness_pb2.ControllerFrame | _Interrupt] = asyncio.Queue()
        self._lock = asyncio.Lock()
        self._awaiting = False
        self._seal: SinkError | None = None
        self.parked: ApprovalParkedError | None = None
        self.cancel_reason: str | None = None

    # -- the EventSink protocol ------------------------------------------------------------

    async def model(self, call: common_pb2.ModelCall) -> harness_pb2.ModelResult:
        async with self._exclusive():
            request = common_pb2.ModelCall()
            request.CopyFrom(call)
            # The id only correlates the reply; the host records its own.
            request.id = secrets.token_hex(8)
            frame = await self._request(
                common_pb2.Event(execution_id=self._execution_id, kind=_KIND.EVENT_MODEL_CALL, model=request),
                "MODEL_CALL",
            )
            kind = frame.WhichOneof("frame")
            if kind != "model":
                raise self._fail(
                    ProtocolError(f"expected a ModelResult frame, got {kind or 'an empty'} frame")
                )
            if frame.model.model_call_id != request.id:
                raise self._fail(
                    CorrelationError(
                        f"model result correlation mismatch: got model_call_id "
                        f"{frame.model.model_call_id!r}, want {request.id!r}"
                    )
                )
            return frame.model

    async def output(self, text: str) -> None:
        async with self._exclusive():
            await self._send(
                common_pb2.Event(
                    execution_id=self._execution_id,
                    kind=_KIND.EVENT_OUTPUT,
                    message=text_message("assistant", text),
                )
            )

    async def tool_call(self, call: common_pb2.ToolCall) -> common_pb2.ToolResult:
        async with self._exclusive():
            approval = call.mediation == common_pb2.MEDIATION_REQUIRES_APPROVAL
            if call.mediation not in (
                common_pb2.MEDIATION_CONTROLLER_MEDIATED,
                common_pb2.MEDIATION_REQUIRES_APPROVAL,
            ):
                raise ToolCallRejectedError(
                    f"tool call {call.id!r} has mediation {common_pb2.Mediation.Name(call.mediation)}; "
                    "only CONTROLLER_MEDIATED and REQUIRES_APPROVAL calls go to the host (report the rest)"
                )
            if approval and (not self._session or not call.id):
                raise ToolCallRejectedError("approval requires session and call id")
            frame = await self._request(
                common_pb2.Event(execution_id=self._execution_id, kind=_KIND.EVENT_TOOL_CALL, tool=call),
                "TOOL_CALL",
            )
            if not approval:
                return self._tool_result(frame, call, decision=None)
            kind = frame.WhichOneof("frame")
            if kind == "park":
                self._check_envelope_session(frame, "park")
                raise self._park(frame.park, call)
            if kind != "approval":
                raise self._fail(
                    ProtocolError(f"expected an ApprovalResult or park frame, got {kind or 'an empty'} frame")
                )
            self._check_envelope_session(frame, "approval")
            decision = frame.approval
            if decision.tool_call_id != call.id or decision.request_seq <= 0:
                raise self._fail(
                    CorrelationError(
                        f"approval correlation mismatch: got tool_call_id {decision.tool_call_id!r} "
                        f"request_seq {decision.request_seq}, want {call.id!r} and a positive seq"
                    )
                )
            receipt = await self._next_frame("approval receipt")
            return self._tool_result(receipt, call, decision=decision)

    async def report(self, result: common_pb2.ToolResult) -> None:
        async with self._exclusive():
            field = host_owned_receipt_field(result)
            if field is not None:
                # A forged receipt would let a harness claim a decision nobody made.
                raise self._fail(
                    ProtocolError(
                        f"tool result {result.id!r} carries host-owned approval receipt field {field}"
                    )
                )
            await self._send(
                common_pb2.Event(execution_id=self._execution_id, kind=_KIND.EVENT_TOOL_RESULT, result=result)
            )

    async def usage(self, usage: common_pb2.Usage) -> None:
        async with self._exclusive():
            await self._send(
                common_pb2.Event(execution_id=self._execution_id, kind=_KIND.EVENT_USAGE, usage=usage)
            )

    # -- driven by the stream handler ------------------------------------------------------

    def deliver(self, frame: harness_pb2.ControllerFrame) -> None:
        """Hand a reply frame from the host to the waiting sink call."""
        if not self._awaiting:
            self.interrupt(
                ProtocolError(f"unsolicited {frame.WhichOneof('frame') or 'empty'} frame from host")
            )
            return
        self._inbox.put_nowait(frame)

    def cancel(self, reason: str) -> None:
        """The host asked to cancel: blocked and later sink calls raise ExecutionCancelledError."""
        if self.cancel_reason is None:
            self.cancel_reason = reason
        self.interrupt(
            ExecutionCancelledError(
                f"execution cancelled by host: {reason}" if reason else "execution cancelled by host"
            )
        )

    def host_closed(self) -> None:
        """The host half-closed its side; a call waiting for a reply will never get one."""
        self._inbox.put_nowait(_Interrupt(ProtocolError("host closed the Connect stream before replying")))

    def interrupt(self, error: SinkError) -> None:
        """Seal the sink (first seal wins) and wake a call waiting for a reply."""
        if self._seal is None:
            self._seal = error
        self._inbox.put_nowait(_Interrupt(self._seal))

    def close(self) -> None:
        """The stream is over: seal the sink and fail events that were never delivered."""
        if self._seal is None:
            self._seal = SinkClosedError("the execution has ended; the sink is closed")
        self._inbox.put_nowait(_Interrupt(self._seal))
        while not self.outbox.empty():
            item = self.outbox.get_nowait()
            if item is not None and item[1] is not None and not item[1].done():
                item[1].set_exception(SinkClosedError("the stream ended before the event was sent"))

    # -- internals -------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _exclusive(self) -> AsyncIterator[None]:
        self._raise_if_sealed()
        async with self._lock:
            self._raise_if_sealed()
            try:
                yield
            finally:
                # From the request until the call returns, host frames are replies; after, unsolicited.
                self._awaiting = False

    def _raise_if_sealed(self) -> None:
        if self._seal is not None:
            raise self._seal

    def _fail(self, error: SinkError) -> SinkError:
        """Make a protocol failure sticky and return it for raising."""
        if self._seal is None:
            self._seal = error
        return self._seal

    async def _send(self, event: common_pb2.Event) -> None:
        """Queue an event that needs no reply and wait until the stream has taken it."""
        delivered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.outbox.put_nowait((event, delivered))
        try:
            async with asyncio.timeout(self._reply_timeout):
                await delivered
        except TimeoutError:
            raise self._fail(
                ProtocolError(f"the host did not accept an event within {self._reply_timeout} s")
            ) from None

    async def _request(self, event: common_pb2.Event, what: str) -> harness_pb2.ControllerFrame:
        self._awaiting = True
        self.outbox.put_nowait((event, None))
        return await self._next_frame(f"reply to {what}")

    async def _next_frame(self, what: str) -> harness_pb2.ControllerFrame:
        try:
            async with asyncio.timeout(self._reply_timeout):
                item = await self._inbox.get()
        except TimeoutError:
            raise self._fail(ProtocolError(f"no {what} from host within {self._reply_timeout} s")) from None
        except asyncio.CancelledError:
            # A reply that arrives later would be taken as the answer to the next request.
            self._fail(ProtocolError(f"a sink call was abandoned while awaiting its {what}"))
            raise
        if isinstance(item, _Interrupt):
            raise self._fail(item.error)
        if item.execution_id != self._execution_id:
            raise self._fail(
                CorrelationError(
                    f"result execution_id mismatch: got {item.execution_id!r}, want {self._execution_id!r}"
                )
            )
        return item

    def _check_envelope_session(self, frame: harness_pb2.ControllerFrame, what: str) -> None:
        if frame.session != self._session:
            raise self._fail(
                CorrelationError(f"{what} session mismatch: got {frame.session!r}, want {self._session!r}")
            )

    def _park(self, ref: common_pb2.ApprovalRef, call: common_pb2.ToolCall) -> SinkError:
        if ref.execution_id != self._execution_id or ref.tool_call_id != call.id or ref.request_seq <= 0:
            return self._fail(
                CorrelationError(
                    f"park correlation mismatch: got execution_id {ref.execution_id!r} tool_call_id "
                    f"{ref.tool_call_id!r} request_seq {ref.request_seq}, want {self._execution_id!r} "
                    f"{call.id!r} and a positive seq"
                )
            )
        parked = ApprovalParkedError(ref)
        self.parked = parked
        return self._fail(parked)

    def _tool_result(
        self,
        frame: harness_pb2.ControllerFrame,
        call: common_pb2.ToolCall,
        *,
        decision: common_pb2.ApprovalResult | None,
    ) -> common_pb2.ToolResult:
        kind = frame.WhichOneof("frame")
        if kind != "tool":
            raise self._fail(ProtocolError(f"expected a ToolResult frame, got {kind or 'an empty'} frame"))
        self._check_envelope_session(frame, "tool result")
        result = frame.tool
        if result.id != call.id:
            raise self._fail(
                CorrelationError(f"tool result correlation mismatch: got id {result.id!r}, want {call.id!r}")
            )
        if decision is None:
            field = host_owned_receipt_field(result)
            if field is not None:
                raise self._fail(
                    ProtocolError(f"tool result for an ordinary call carries approval field {field}")
                )
        else:
            conflict = receipt_conflict(decision, result)
            if conflict is not None:
                raise self._fail(ProtocolError(conflict))
        return result


class HarnessServicer(harness_pb2_grpc.HarnessServicer):
    """``agentsessions.v1.Harness`` for one :class:`Harness` object.

    ``reply_timeout`` bounds each wait for a host reply; ``start_timeout`` bounds the wait for
    the Start frame; ``cancel_grace`` is how long a cancelled run may take to unwind before its
    task is cancelled.
    """

    def __init__(
        self,
        harness: Harness,
        *,
        reply_timeout: float | None = 600.0,
        start_timeout: float = 30.0,
        cancel_grace: float = 5.0,
    ) -> None:
        self._harness = harness
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

    async def Connect(
        self,
        request_iterator: AsyncIterator[harness_pb2.ControllerFrame],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[common_pb2.Event]:
        frames = aiter(request_iterator)
        try:
            async with asyncio.timeout(self._start_timeout):
                first = await anext(frames, None)
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"no Start frame within {self._start_timeout} s"
            )
            return
        if first is None or first.WhichOneof("frame") != "start":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "first ControllerFrame must be Start")
            return
        if not first.execution_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Start frame requires execution_id")
            return

        start = start_from_frame(first)
        sink = StreamSink(start.session, start.execution_id, reply_timeout=self._reply_timeout)
        # The run joins the host's trace (when OpenTelemetry is installed): see tracing.py.
        run_context, traced = tracing.start_run(
            context.invocation_metadata(), start.session, start.execution_id
        )
        run = asyncio.create_task(
            self._harness.run(start, sink), name=f"harness-run-{start.execution_id}", context=run_context
        )
        run.add_done_callback(traced)
        run.add_done_callback(lambda _: sink.outbox.put_nowait(None))
        grace: list[asyncio.TimerHandle] = []

        def on_cancel(reason: str) -> None:
            sink.cancel(reason)
            if not grace and not run.done():
                grace.append(asyncio.get_running_loop().call_later(self._cancel_grace, run.cancel))

        pump = asyncio.create_task(_pump(frames, start.execution_id, sink, on_cancel))
        try:
            while (item := await sink.outbox.get()) is not None:
                event, delivered = item
                yield event
                if delivered is not None and not delivered.done():
                    delivered.set_result(None)
            for handle in grace:
                handle.cancel()
            sink.close()
            async for event in self._finish(start, sink, run, context):
                yield event
        finally:
            sink.close()
            pump.cancel()
            if not run.done():
                run.cancel()
            await asyncio.wait({pump, run}, timeout=self._cancel_grace)
            if run.done() and not run.cancelled():
                run.exception()  # the stream is gone; nobody else will look at how the run ended

    async def _finish(
        self,
        start: Start,
        sink: StreamSink,
        run: asyncio.Task[None],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[common_pb2.Event]:
        """The closing event(s) and status, once the run has returned or raised."""
        error = _run_error(run)
        if sink.cancel_reason is not None:
            # Cancellation takes precedence over however the run unwound.
            yield _end(start.execution_id, "CANCELED", sink.cancel_reason)
            return
        if sink.parked is not None:
            if error is None or _is_only_park(error, sink.parked.ref):
                yield common_pb2.Event(
                    execution_id=start.execution_id, kind=_KIND.EVENT_PARKED, parked=sink.parked.ref
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
            yield _end(start.execution_id, "COMPLETED", "")
            return
        description = str(error) or type(error).__name__
        logger.info("execution %s failed: %s", start.execution_id, type(error).__name__)
        yield _end(start.execution_id, "FAILED", description)
        await context.abort(grpc.StatusCode.UNKNOWN, description)


async def _pump(
    frames: AsyncIterator[harness_pb2.ControllerFrame],
    execution_id: str,
    sink: StreamSink,
    on_cancel: Callable[[str], None],
) -> None:
    """Read host frames after Start: replies go to the sink, Cancel cancels the run."""
    try:
        async for frame in frames:
            kind = frame.WhichOneof("frame")
            if kind == "cancel":
                if frame.execution_id != execution_id:
                    sink.interrupt(
                        CorrelationError(
                            f"cancel execution_id mismatch: got {frame.execution_id!r}, want {execution_id!r}"
                        )
                    )
                    continue
                on_cancel(frame.cancel.reason)
            elif kind == "start":
                sink.interrupt(ProtocolError("unexpected second Start frame"))
            else:
                sink.deliver(frame)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the stream broke under us; the waiting call must not hang
        sink.interrupt(ProtocolError(f"host stream failed: {type(exc).__name__}"))
        return
    sink.host_closed()


def start_from_frame(frame: harness_pb2.ControllerFrame) -> Start:
    """The SDK's Start for a Start frame."""
    body = frame.start
    return Start(
        session=frame.session,
        execution_id=frame.execution_id,
        inputs=list(body.inputs),
        # The frame's own sequence: a Python object per event only for a harness that reads them
        # (a history grows by ~5 events a turn; an echo turn never looks at it).
        history=body.history,
        config=body.config,
        resume_from_seq=body.resume_from_seq,
        identity=body.identity if body.HasField("identity") else None,
    )


def _run_error(run: asyncio.Task[None]) -> BaseException | None:
    if run.cancelled():
        return ExecutionCancelledError("the harness run was cancelled")
    return run.exception()


def _is_only_park(error: BaseException, ref: common_pb2.ApprovalRef) -> bool:
    """Whether the run unwound with nothing but the park (possibly grouped by a TaskGroup)."""
    if isinstance(error, ApprovalParkedError):
        return error.ref == ref
    if isinstance(error, BaseExceptionGroup):
        return all(_is_only_park(inner, ref) for inner in error.exceptions)
    return False


def _end(execution_id: str, state: str, description: str) -> common_pb2.Event:
    end = common_pb2.HarnessEnd(state=state)
    if description:
        end.error.description = description
    return common_pb2.Event(execution_id=execution_id, kind=_KIND.EVENT_END, end=end)


@dataclass
class HarnessServer:
    """A running harness server: the address it is bound to and how to stop it."""

    server: grpc.aio.Server
    address: str

    async def stop(self, grace: float | None = 5.0) -> None:
        await self.server.stop(grace)

    async def wait_for_termination(self) -> None:
        await self.server.wait_for_termination()


async def start_server(
    harness: Harness,
    address: str,
    *,
    servicer: HarnessServicer | None = None,
    tls: ServerTLS | None = None,
) -> HarnessServer:
    """Bind ``address`` (``host:port``, port 0 picks one, or ``unix:path``) and start serving,
    over TLS (mutual TLS when ``tls`` names a client CA) when ``tls`` is given."""
    server = grpc.aio.server(options=MESSAGE_SIZE_OPTIONS)
    harness_pb2_grpc.add_HarnessServicer_to_server(servicer or HarnessServicer(harness), server)
    try:
        port = add_port(server, address, tls)
    except RuntimeError as exc:
        raise OSError(f"cannot listen on {address!r}: {exc}") from exc
    await server.start()
    return HarnessServer(server=server, address=_bound_address(address, port))


async def serve(
    harness: Harness,
    address: str,
    *,
    grace: float = 5.0,
    on_ready: Callable[[str], None] | None = None,
    tls: ServerTLS | None = None,
) -> None:
    """Serve ``harness`` on ``address`` until cancelled, then stop gracefully."""
    running = await start_server(harness, address, tls=tls)
    if on_ready is not None:
        on_ready(running.address)
    try:
        await running.wait_for_termination()
    finally:
        await asyncio.shield(running.stop(grace))


def run_server(
    harness: Harness,
    address: str,
    *,
    grace: float = 5.0,
    on_ready: Callable[[str], None] | None = None,
    tls: ServerTLS | None = None,
) -> None:
    """Blocking :func:`serve` that stops gracefully on SIGINT or SIGTERM."""
    import signal

    async def main() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signum, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await serve(harness, address, grace=grace, on_ready=on_ready, tls=tls)

    asyncio.run(main())


def _bound_address(address: str, port: int) -> str:
    if address.startswith("unix:"):
        return address
    host, _, _ = address.rpartition(":")
    return f"{host}:{port}"
