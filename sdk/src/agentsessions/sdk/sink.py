"""The harness side's sink over one ``Harness.Connect`` stream: the protocol's state machine.

:class:`StreamSink` turns each sink call into an Event written to the stream and, for model and
tool calls, waits for the host's reply frame and checks it (spec section 5). It reads replies
itself, with a plain await on the stream, unless a watcher (:class:`FrameWatcher`) reads every
frame for it; a watcher exists only for a harness with a cancel hook, which must hear a Cancel
while it is busy with its own work.

Calls are serialized (one request outstanding). The first terminal condition seals the sink for
good: an approval park, a host cancel, a protocol failure or the end of the stream; every later
call raises that same error.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable

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
from agentsessions.sdk.extensions import NONE, ConnectExtensions
from agentsessions.v1 import common_pb2, harness_pb2

# Kinds through the generated module's constants: an EnumTypeWrapper attribute costs ~1.5 us.
_KIND = common_pb2
_HOST_RUN = frozenset({common_pb2.MEDIATION_CONTROLLER_MEDIATED, common_pb2.MEDIATION_REQUIRES_APPROVAL})

Frame = harness_pb2.ControllerFrame
# Writes one event to the stream; reads the next host frame (None: the host closed its side).
Write = Callable[[common_pb2.Event], Awaitable[None]]
Read = Callable[[], Awaitable[Frame | None]]


class StreamSink:
    """An :class:`~agentsessions.sdk.harness.EventSink` (with the optional recorded-results and
    approval-details surfaces) backed by one Connect stream."""

    def __init__(
        self,
        session: str,
        execution_id: str,
        *,
        write: Write,
        read: Read,
        reply_timeout: float | None,
        extensions: ConnectExtensions = NONE,
    ) -> None:
        self._session = session
        self._execution_id = execution_id
        self._write = write
        self.reader = read
        self._reply_timeout = reply_timeout
        self._extensions = extensions
        self.recorded_effects = extensions.recorded_effects
        self.run_mode = extensions.run_mode
        self.host_mode = extensions.mode  # the session's mode, as the host announced it
        self._lock = asyncio.Lock()
        self._seal: SinkError | None = None
        self._calls = 0
        self._reasons: dict[str, str] = {}
        self._decisions: dict[str, common_pb2.ApprovalResult] = {}
        self.parked: ApprovalParkedError | None = None
        self.cancel_reason: str | None = None
        # Set while a call waits for its reply: a frame arriving at another time is unsolicited.
        self.awaiting = False
        # Told (once) when the host cancels, so the servicer can start the cancel grace.
        self.on_cancel: Callable[[str], None] | None = None

    # -- the EventSink protocol ------------------------------------------------------------

    async def model(self, call: common_pb2.ModelCall) -> harness_pb2.ModelResult:
        async with self._exclusive():
            event = common_pb2.Event(execution_id=self._execution_id, kind=_KIND.EVENT_MODEL_CALL, model=call)
            # The id only correlates the reply (the host records its own): unique in this stream.
            self._calls += 1
            call_id = event.model.id = f"{self._calls:016x}"
            frame = await self._request(event, "MODEL_CALL")
            kind = frame.WhichOneof("frame")
            if kind != "model":
                raise self.fail(
                    ProtocolError(f"expected a ModelResult frame, got {kind or 'an empty'} frame")
                )
            if frame.model.model_call_id != call_id:
                raise self.fail(
                    CorrelationError(
                        f"model result correlation mismatch: got model_call_id "
                        f"{frame.model.model_call_id!r}, want {call_id!r}"
                    )
                )
            return frame.model

    async def output(self, text: str) -> None:
        async with self._exclusive():
            message = common_pb2.Message(
                role="assistant", parts=[common_pb2.Part(text=common_pb2.TextPart(text=text))]
            )
            await self._send(
                common_pb2.Event(execution_id=self._execution_id, kind=_KIND.EVENT_OUTPUT, message=message)
            )

    async def tool_call(self, call: common_pb2.ToolCall) -> common_pb2.ToolResult:
        async with self._exclusive():
            approval = call.mediation == common_pb2.MEDIATION_REQUIRES_APPROVAL
            if call.mediation not in _HOST_RUN:
                raise ToolCallRejectedError(
                    f"tool call {call.id!r} has mediation {common_pb2.Mediation.Name(call.mediation)}; "
                    "only CONTROLLER_MEDIATED and REQUIRES_APPROVAL calls go to the host (report the rest)"
                )
            if approval and (not self._session or not call.id):
                raise ToolCallRejectedError("approval requires session and call id")
            reason = self._reasons.pop(call.id, "")
            if approval and reason and self._extensions.approval_reason:
                await self._send(
                    common_pb2.Event(
                        execution_id=self._execution_id,
                        kind=_KIND.EVENT_APPROVAL_REQUEST,
                        approval=common_pb2.ApprovalRequest(tool_call_id=call.id, reason=reason),
                    )
                )
            frame = await self._request(
                common_pb2.Event(execution_id=self._execution_id, kind=_KIND.EVENT_TOOL_CALL, tool=call),
                "TOOL_CALL",
            )
            if not approval:
                return self._tool_result(frame, call.id, decision=None)
            kind = frame.WhichOneof("frame")
            if kind == "park":
                self._check_envelope_session(frame, "park")
                raise self._park(frame.park, call)
            if kind != "approval":
                raise self.fail(
                    ProtocolError(f"expected an ApprovalResult or park frame, got {kind or 'an empty'} frame")
                )
            self._check_envelope_session(frame, "approval")
            decision = frame.approval
            if decision.tool_call_id != call.id or decision.request_seq <= 0:
                raise self.fail(
                    CorrelationError(
                        f"approval correlation mismatch: got tool_call_id {decision.tool_call_id!r} "
                        f"request_seq {decision.request_seq}, want {call.id!r} and a positive seq"
                    )
                )
            receipt = await self._next_frame("approval receipt")
            result = self._tool_result(receipt, call.id, decision=decision)
            self._decisions[call.id] = decision
            return result

    async def report(self, result: common_pb2.ToolResult) -> None:
        async with self._exclusive():
            field = host_owned_receipt_field(result)
            if field is not None:
                # A forged receipt would let a harness claim a decision nobody made.
                raise self.fail(
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

    # -- the optional surfaces (agentsessions.sdk.extensions) -------------------------------

    async def recorded_report(self, call: common_pb2.ToolCall) -> common_pb2.ToolResult:
        """The recorded result of an in-harness call, from a host that announced recorded effects."""
        async with self._exclusive():
            if self.recorded_effects <= 0:
                raise ToolCallRejectedError("the host announced no recorded effects for this execution")
            lookup = common_pb2.ToolCall()
            lookup.CopyFrom(call)
            lookup.mediation = common_pb2.MEDIATION_IN_HARNESS_REPORTED
            frame = await self._request(
                common_pb2.Event(execution_id=self._execution_id, kind=_KIND.EVENT_TOOL_CALL, tool=lookup),
                "recorded-result lookup",
            )
            return self._tool_result(frame, call.id, decision=None)

    def approval_reason(self, tool_call_id: str, reason: str) -> None:
        if reason:
            self._reasons[tool_call_id] = reason

    def approval_decision(self, tool_call_id: str) -> common_pb2.ApprovalResult | None:
        return self._decisions.get(tool_call_id)

    # -- driven by the servicer (and the watcher) -------------------------------------------

    def cancel(self, reason: str) -> ExecutionCancelledError:
        """The host asked to cancel: blocked and later sink calls raise ExecutionCancelledError."""
        first = self.cancel_reason is None
        if first:
            self.cancel_reason = reason
        error = ExecutionCancelledError(
            f"execution cancelled by host: {reason}" if reason else "execution cancelled by host"
        )
        if self._seal is None:
            self._seal = error
        if first and self.on_cancel is not None:
            self.on_cancel(reason)
        return error

    def fail(self, error: SinkError) -> SinkError:
        """Seal the sink with ``error`` unless it is sealed already; returns the seal, for raising."""
        if self._seal is None:
            self._seal = error
        return self._seal

    def close(self) -> None:
        """The stream is over: every later call raises SinkClosedError."""
        if self._seal is None:
            self._seal = SinkClosedError("the execution has ended; the sink is closed")

    # -- internals -------------------------------------------------------------------------

    def _exclusive(self) -> _Exclusive:
        return _Exclusive(self)

    async def _send(self, event: common_pb2.Event) -> None:
        """Write an event that needs no reply."""
        try:
            async with asyncio.timeout(self._reply_timeout):
                await self._write(event)
        except TimeoutError:
            raise self.fail(
                ProtocolError(f"the host did not accept an event within {self._reply_timeout} s")
            ) from None

    async def _request(self, event: common_pb2.Event, what: str) -> Frame:
        # Before the write: a watcher may read the reply before this coroutine resumes.
        self.awaiting = True
        return await self._next_frame(f"reply to {what}", event)

    async def _next_frame(self, what: str, request: common_pb2.Event | None = None) -> Frame:
        """The next host frame, checked; ``request`` is written first, under the same bound."""
        try:
            async with asyncio.timeout(self._reply_timeout):
                if request is not None:
                    await self._write(request)
                frame = await self.reader()
        except TimeoutError:
            raise self.fail(ProtocolError(f"no {what} from host within {self._reply_timeout} s")) from None
        except asyncio.CancelledError:
            # A reply that arrives later would be taken as the answer to the next request.
            self.fail(ProtocolError(f"a sink call was abandoned while awaiting its {what}"))
            raise
        except SinkError as error:
            raise self.fail(error) from None
        except Exception as exc:  # the stream broke under us
            raise self.fail(ProtocolError(f"host stream failed: {type(exc).__name__}")) from exc
        if frame is None:
            raise self.fail(ProtocolError("host closed the Connect stream before replying"))
        kind = frame.WhichOneof("frame")
        if kind == "cancel":
            if frame.execution_id != self._execution_id:
                raise self.fail(
                    CorrelationError(
                        f"cancel execution_id mismatch: got {frame.execution_id!r}, "
                        f"want {self._execution_id!r}"
                    )
                )
            raise self.cancel(frame.cancel.reason)
        if kind == "start":
            raise self.fail(ProtocolError("unexpected second Start frame"))
        if frame.execution_id != self._execution_id:
            raise self.fail(
                CorrelationError(
                    f"result execution_id mismatch: got {frame.execution_id!r}, want {self._execution_id!r}"
                )
            )
        return frame

    def _check_envelope_session(self, frame: Frame, what: str) -> None:
        if frame.session != self._session:
            raise self.fail(
                CorrelationError(f"{what} session mismatch: got {frame.session!r}, want {self._session!r}")
            )

    def _park(self, ref: common_pb2.ApprovalRef, call: common_pb2.ToolCall) -> SinkError:
        if ref.execution_id != self._execution_id or ref.tool_call_id != call.id or ref.request_seq <= 0:
            return self.fail(
                CorrelationError(
                    f"park correlation mismatch: got execution_id {ref.execution_id!r} tool_call_id "
                    f"{ref.tool_call_id!r} request_seq {ref.request_seq}, want {self._execution_id!r} "
                    f"{call.id!r} and a positive seq"
                )
            )
        parked = ApprovalParkedError(ref)
        self.parked = parked
        return self.fail(parked)

    def _tool_result(
        self, frame: Frame, call_id: str, *, decision: common_pb2.ApprovalResult | None
    ) -> common_pb2.ToolResult:
        kind = frame.WhichOneof("frame")
        if kind != "tool":
            raise self.fail(ProtocolError(f"expected a ToolResult frame, got {kind or 'an empty'} frame"))
        self._check_envelope_session(frame, "tool result")
        result = frame.tool
        if result.id != call_id:
            raise self.fail(
                CorrelationError(f"tool result correlation mismatch: got id {result.id!r}, want {call_id!r}")
            )
        if decision is None:
            field = host_owned_receipt_field(result)
            if field is not None:
                raise self.fail(
                    ProtocolError(f"tool result for an ordinary call carries approval field {field}")
                )
        else:
            conflict = receipt_conflict(decision, result)
            if conflict is not None:
                raise self.fail(ProtocolError(conflict))
        return result


class _Exclusive:
    """One sink call at a time, on an open sink (a class, not a generator: it runs on every call)."""

    __slots__ = ("_sink",)

    def __init__(self, sink: StreamSink) -> None:
        self._sink = sink

    async def __aenter__(self) -> None:
        sink = self._sink
        if sink._seal is not None:
            raise sink._seal
        await sink._lock.acquire()
        if sink._seal is not None:
            sink._lock.release()
            raise sink._seal

    async def __aexit__(self, *exc_info: object) -> None:
        # From the request until the call returns, host frames are replies; after, unsolicited.
        self._sink.awaiting = False
        self._sink._lock.release()


class FrameWatcher:
    """Reads every host frame of a stream, for a harness that must hear a Cancel while it is not
    in a sink call: replies go to the sink's waiting call (:meth:`read`, the sink's ``read``), a
    Cancel seals the sink and goes to ``on_cancel`` (which calls the harness's cancel hook)."""

    def __init__(self, execution_id: str, on_cancel: Callable[[str], Awaitable[None]]) -> None:
        self._execution_id = execution_id
        self._on_cancel = on_cancel
        self._frames: collections.deque[Frame | SinkError | None] = collections.deque()
        self._waiter: asyncio.Future[Frame | SinkError | None] | None = None

    async def read(self) -> Frame | None:
        """The next reply frame (None: the host closed its side)."""
        if self._frames:
            item = self._frames.popleft()
        else:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                item = await self._waiter
            finally:
                self._waiter = None
        if isinstance(item, SinkError):
            raise item
        return item

    def _put(self, item: Frame | SinkError | None) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(item)
        else:
            self._frames.append(item)

    async def watch(self, sink: StreamSink, frames: Read) -> None:
        """Read ``frames`` until the host closes its side (a task for the whole execution)."""
        try:
            while (frame := await frames()) is not None:
                kind = frame.WhichOneof("frame")
                if kind == "cancel" and frame.execution_id == self._execution_id:
                    self._put(sink.cancel(frame.cancel.reason))
                    await self._on_cancel(frame.cancel.reason)
                elif kind in ("cancel", "start") or sink.awaiting:
                    self._put(frame)  # the sink checks these itself, as when it reads for itself
                else:
                    self._put(sink.fail(ProtocolError(f"unsolicited {kind or 'empty'} frame from host")))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the stream broke under us; a waiting call must not hang
            self._put(ProtocolError(f"host stream failed: {type(exc).__name__}"))
            return
        self._put(None)
