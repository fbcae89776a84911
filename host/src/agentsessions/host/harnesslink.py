"""The host side of ``Harness.Connect``: a remote harness behind the SDK's ``Harness`` protocol.

:class:`RemoteHarness` dials a harness process and, for each execution, bridges the stream to
the host-side :class:`EventSink` it is given (spec section 5): harness events become sink calls,
and sink results become reply frames stamped with the session and execution id.

Approval decisions. For a ``REQUIRES_APPROVAL`` call the host sink either raises
:class:`ApprovalParkedError` (undecided: the bridge parks the harness, requires its correlated
PARKED acknowledgement and stream closure, then re-raises the same error) or returns the receipt
(a ToolResult with ``approval_request_seq`` and ``approval_decision_seq`` set). The bridge then
sends the ApprovalResult frame before the tool frame. It takes that decision from the sink's
``approval_decision(tool_call_id)`` method when the sink has one (see :class:`ApprovalDecisions`),
which is how the recorded reason reaches the harness; otherwise it derives the decision from the
receipt (approved unless ``code`` is APPROVAL_DENIED, no reason). Either way the receipt must be
consistent with the decision (spec 5.5) or the bridge refuses to send it.

End of stream. END COMPLETED returns; END FAILED raises :class:`HarnessFailedError`; EOF
without END is treated as completed, as the reference host does, so a harness that simply
returns is not reported as failed.

Beyond v1 (``agentsessions.sdk.extensions``, announced in the Connect metadata): a re-run says
its mode and how many effects are recorded, and then answers an IN_HARNESS_REPORTED tool call
with the recorded result (the sink's ``recorded_report``); an APPROVAL_REQUEST event just
before a REQUIRES_APPROVAL call gives the sink the harness's reason for it; and a harness that
says it holds a session's history (``agentsessions-history-held``, with the stream's status) gets
the session's next Start with only the events after that history (``agentsessions-history-base``),
or, when it no longer holds it, the whole history on a second stream. So after END the host lets
the harness end its side of the stream by itself (cut after ``END_STATUS_GRACE_S`` if it does not)
and reads the answer when it sends the next Start.

A stream opened ahead (:meth:`RemoteHarness.open_ahead`): a new live turn's stream may be opened
before the turn's first records are durable, so that the harness takes the call meanwhile; its
Start goes only when :meth:`RemoteHarness.run` is given that Start, and a stream that never runs
is cut before any Start (``controller.harnesses.open_ahead`` says when the host does this).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, NoReturn, Protocol, runtime_checkable

import grpc
from google.protobuf.message import DecodeError, Message

from agentsessions.host import logs, protowire
from agentsessions.host.addresses import check_harness_address
from agentsessions.host.controller.errors import HarnessMisdescribedError, HarnessUnavailableError
from agentsessions.host.controller.journal_cache import Prefix
from agentsessions.host.telemetry.propagation import outgoing_metadata
from agentsessions.sdk.approval import decision_from_receipt, host_owned_receipt_field, receipt_conflict
from agentsessions.sdk.errors import ApprovalParkedError, ExecutionCancelledError
from agentsessions.sdk.extensions import HISTORY_HELD, connect_metadata
from agentsessions.sdk.harness import EventSink, Start, approval_details, message_text, recorded_results
from agentsessions.sdk.limits import MESSAGE_SIZE_OPTIONS
from agentsessions.sdk.structs import struct
from agentsessions.sdk.tls import open_channel
from agentsessions.v1 import common_pb2, harness_pb2, harness_pb2_grpc

__all__ = [
    "DESCRIBE_MAX_AGE_S",
    "HISTORY_BY_REFERENCE_MIN_BYTES",
    "HISTORY_CACHE_SESSIONS",
    "ApprovalDecisions",
    "HarnessFailedError",
    "HarnessLinkError",
    "HarnessProtocolError",
    "HarnessUnavailableError",
    "HostSinkError",
    "RemoteHarness",
    "harness_target",
]

# Kinds through the generated module's constants: an EnumTypeWrapper attribute costs ~1.5 us.
_KIND = common_pb2

log = logging.getLogger(__name__)

# Control events only the host originates; a harness sending one is refused.
_HOST_OWNED = frozenset(
    {
        _KIND.EVENT_APPROVAL_REQUEST,
        _KIND.EVENT_APPROVAL_RESULT,
        _KIND.EVENT_EXECUTION_START,
        _KIND.EVENT_PARKED,
    }
)
_IGNORED = frozenset(
    {_KIND.EVENT_KIND_UNSPECIFIED, _KIND.EVENT_INPUT, _KIND.EVENT_ERROR, _KIND.EVENT_LIFECYCLE}
)
_BODY = {
    _KIND.EVENT_MODEL_CALL: "model",
    _KIND.EVENT_TOOL_CALL: "tool",
    _KIND.EVENT_TOOL_RESULT: "result",
    _KIND.EVENT_USAGE: "usage",
    _KIND.EVENT_END: "end",
}
# Stream endings that mean the harness process is gone or unreachable rather than broken.
_UNAVAILABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

_CONNECT_METHOD = "/" + harness_pb2.DESCRIPTOR.services_by_name["Harness"].full_name + "/Connect"
_DESCRIBE_METHOD = "/" + harness_pb2.DESCRIPTOR.services_by_name["Harness"].full_name + "/Describe"
# Wire tags (field number << 3 | length-delimited) of ControllerFrame.start and Start.history.
_START_TAG = bytes([harness_pb2.ControllerFrame.DESCRIPTOR.fields_by_name["start"].number << 3 | 2])
_HISTORY_TAG = bytes([harness_pb2.Start.DESCRIPTOR.fields_by_name["history"].number << 3 | 2])
# Sessions whose encoded history a link keeps (least recently used dropped first).
HISTORY_CACHE_SESSIONS = 256
# A history shorter than this goes whole (not worth a copy kept in the harness process).
HISTORY_BY_REFERENCE_MIN_BYTES = 32 * 1024
# How long a descriptor serves admissions on one connection (0: Describe at every admission).
DESCRIBE_MAX_AGE_S = 5.0
# How long a harness's side of a Connect stream may stay open after its END (or its park's
# acknowledgement) before the host cuts it: the status that carries its history answer follows
# the END at once from any harness that ends its side, as the protocol asks.
END_STATUS_GRACE_S = 1.0
_READY = grpc.ChannelConnectivity.READY


class HarnessLinkError(Exception):
    """Base of the errors the harness link raises besides HarnessUnavailableError (the
    controller's, raised with the gRPC status as ``code`` when the harness cannot be reached)."""


# Every failure of the link itself (what cancelling a stream may run into).
_LINK_FAILURES = (HarnessLinkError, HarnessUnavailableError)


class HarnessFailedError(HarnessLinkError):
    """The harness ended the execution FAILED (or the stream with an error status).

    ``description`` is what the harness said (its END error description, or the status
    details); ``code`` is the gRPC status when the stream itself failed.
    """

    def __init__(self, message: str, code: grpc.StatusCode | None = None, *, description: str = "") -> None:
        super().__init__(message)
        self.description = description or message
        self.code = code


class HarnessProtocolError(HarnessLinkError):
    """The harness broke the Harness.Connect protocol."""


class HostSinkError(HarnessLinkError):
    """The host sink answered in a way the protocol cannot carry (a host bug, not the harness's)."""


@runtime_checkable
class ApprovalDecisions(Protocol):
    """Optional sink method: the recorded decision for a tool call whose receipt it returned."""

    def approval_decision(self, tool_call_id: str) -> common_pb2.ApprovalResult | None: ...


def harness_target(address: str) -> str:
    """The gRPC target for a harness address; raises ValueError (an ``AddressError`` naming the
    rule, agentsessions.host.addresses) for forms the host does not dial."""
    check_harness_address(address)
    return address


class RemoteHarness:
    """A harness in another process, dialled at ``address``; implements the SDK ``Harness``.

    ``describe_timeout`` bounds Describe (the admission bound is 10 s); ``event_timeout`` bounds
    each wait for the harness's next event (None: no bound beyond the caller's); ``ack_timeout``
    bounds the wait for the park acknowledgement and the stream closure after it;
    ``cancel_grace`` is how long :meth:`cancel` lets the harness end before cutting the stream;
    ``credentials`` dial over TLS (``agentsessions.sdk.tls.ClientTLS``), plaintext without them;
    ``history_by_reference=False`` always sends the whole history (see the module docstring).

    Describe once per connection. The contract Describes at every admission to notice a harness
    that changed; a changed harness is a new process, so a new connection. :meth:`describe` keeps
    the descriptor the harness gave on the channel's current connection and answers with it while
    the channel stays READY on that connection, for at most ``describe_max_age`` seconds; a channel
    that leaves READY (the process went away, a new one answers at the address) drops it, and the
    next admission Describes again. ``describe_max_age=0`` Describes at every call, as the
    reference host does.
    """

    def __init__(
        self,
        address: str,
        *,
        describe_timeout: float = 10.0,
        event_timeout: float | None = 600.0,
        ack_timeout: float = 10.0,
        cancel_grace: float = 5.0,
        credentials: grpc.ChannelCredentials | None = None,
        describe_max_age: float = DESCRIBE_MAX_AGE_S,
        history_by_reference: bool = True,
    ) -> None:
        if not describe_max_age >= 0:
            raise ValueError(f"describe_max_age must be >= 0 seconds, got {describe_max_age}")
        self.address = address
        self._credentials = credentials
        self._target = harness_target(address)
        self._describe_timeout = describe_timeout
        self._event_timeout = event_timeout
        self._ack_timeout = ack_timeout
        self._cancel_grace = cancel_grace
        self._channel: grpc.aio.Channel | None = None
        self._stub: harness_pb2_grpc.HarnessAsyncStub | None = None
        self._live: dict[str, _Bridge] = {}
        self._ahead: dict[str, _Bridge] = {}  # streams opened ahead, by execution id (open_ahead)
        self._history = _HistoryEncoder(HISTORY_CACHE_SESSIONS)
        self._describe_max_age = describe_max_age
        self._history_by_reference = history_by_reference
        # Connections the channel has left READY from; a descriptor is good for the one it came on.
        self._connection = 0
        self._described: _Described | None = None
        self._watcher: asyncio.Task[None] | None = None

    def _harness_stub(self) -> harness_pb2_grpc.HarnessAsyncStub:
        # The channel belongs to the event loop that first uses it.
        if self._stub is None:
            self._channel = open_channel(self._target, self._credentials, MESSAGE_SIZE_OPTIONS)
            # Which connection the channel is on: what a descriptor and a held history belong to.
            self._watcher = asyncio.get_running_loop().create_task(self._watch(self._channel))
            stub = harness_pb2_grpc.HarnessStub(self._channel)
            # Connect also writes the Start frame pre-encoded (bytes): see _HistoryEncoder.
            stub.Connect = self._channel.stream_stream(
                _CONNECT_METHOD,
                request_serializer=_frame_bytes,
                response_deserializer=_decoder(common_pb2.Event),
            )
            # Bytes that do not decode are reported by field, not as a bare None from gRPC.
            stub.Describe = self._channel.unary_unary(
                _DESCRIBE_METHOD,
                request_serializer=harness_pb2.DescribeRequest.SerializeToString,
                response_deserializer=_decoder(harness_pb2.HarnessDescriptor),
            )
            self._stub = stub  # type: ignore[assignment]
        assert self._stub is not None
        return self._stub

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        """The harness's descriptor: Describe, or the one it gave on this connection (see above)."""
        stub = self._harness_stub()
        known = self._described
        if known is not None and self._still_current(known):
            return known.descriptor
        connection = self._connection
        try:
            descriptor: harness_pb2.HarnessDescriptor = await stub.Describe(
                harness_pb2.DescribeRequest(), timeout=self._describe_timeout
            )
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            raise HarnessUnavailableError(
                f"harness at {self.address} did not describe itself: {code.name}: {exc.details()}", code
            ) from exc
        except asyncio.CancelledError as exc:
            _reraise_cut(exc, self.address, "Describe")
        if isinstance(descriptor, _Undecodable):
            raise HarnessMisdescribedError(
                f"harness at {self.address} answered Describe with bytes that do not decode as "
                f"agentsessions.v1.HarnessDescriptor: {descriptor.why}"
            )
        channel = self._channel
        watcher = self._watcher
        if (
            self._describe_max_age > 0
            and watcher is not None
            and not watcher.done()
            and channel is not None
            and connection == self._connection
            and channel.get_state() is _READY
        ):
            self._described = _Described(descriptor, connection, time.monotonic() + self._describe_max_age)
        return descriptor

    def current_descriptor(self) -> harness_pb2.HarnessDescriptor | None:
        """The descriptor this connection already gave, while it is still current (see
        ``describe``); None when ``describe`` would ask the harness. Admission takes it without an
        await or a timeout scope."""
        known = self._described
        return known.descriptor if known is not None and self._still_current(known) else None

    def _still_current(self, known: _Described) -> bool:
        channel = self._channel
        watcher = self._watcher
        return (
            watcher is not None
            and not watcher.done()
            and known.connection == self._connection
            and time.monotonic() < known.expires
            and channel is not None
            and channel.get_state() is _READY
        )

    def connection(self) -> int | None:
        """The channel's current connection (None: not READY, or not watched)."""
        channel = self._channel
        watcher = self._watcher
        if channel is None or watcher is None or watcher.done() or channel.get_state() is not _READY:
            return None
        return self._connection

    async def _watch(self, channel: grpc.aio.Channel) -> None:
        """Count the connections the channel leaves READY from (each drops the descriptor)."""
        state = channel.get_state()
        while True:
            await channel.wait_for_state_change(state)
            now = channel.get_state()
            if state is _READY and now is not _READY:
                self._connection += 1
                self._described = None
            state = now

    async def run(self, start: Start, sink: EventSink) -> None:
        """Run one execution on the remote harness, bridging its events to ``sink``."""
        if not start.execution_id:
            raise ValueError("Start.execution_id is required")
        if start.execution_id in self._live:
            raise ValueError(f"execution {start.execution_id!r} is already running on {self.address}")
        bridge = self._ahead.pop(start.execution_id, None)
        if bridge is not None and not bridge.takes(start, sink):
            bridge.abandon()  # opened for another Start, or announcing another mode: opened anew
            bridge = None
        if bridge is None:
            bridge = _Bridge(self, start, sink)
        self._live[start.execution_id] = bridge
        try:
            await bridge.run()
        finally:
            del self._live[start.execution_id]

    async def open_ahead(self, start: Start, session_mode: str) -> Callable[[], None]:
        """Open the Connect stream for ``start`` (a new live execution in a session of mode
        ``session_mode``) now, so that the harness takes the call while the host writes the
        execution's first records; :meth:`run` with the same ``start`` sends the Start on it.
        Returns what cuts the stream if ``run`` never comes (a no-op once it has)."""
        if not start.execution_id:
            raise ValueError("Start.execution_id is required")
        bridge = _Bridge(self, start, None)
        try:
            await bridge.open_ahead(session_mode)
        except Exception:  # it only saves time: run() opens the stream itself, and says what fails
            log.debug(
                "could not open a stream ahead",
                exc_info=True,
                extra=logs.fields(execution_id=start.execution_id),
            )
            bridge.abandon()
            return _nothing
        self._ahead[start.execution_id] = bridge

        def abandon() -> None:
            if self._ahead.get(start.execution_id) is bridge:
                del self._ahead[start.execution_id]
                bridge.abandon()

        return abandon

    async def cancel(self, execution_id: str, reason: str = "") -> bool:
        """Ask the harness to cancel a running execution: send Cancel, wait the grace, then cut.

        The execution's ``run`` then raises :class:`ExecutionCancelledError` (or returns, if the
        harness completed first). False when no such execution is running here.
        """
        bridge = self._live.get(execution_id)
        if bridge is None:
            return False
        await bridge.cancel(reason, self._cancel_grace)
        return True

    async def close(self) -> None:
        watcher, self._watcher = self._watcher, None
        try:
            if watcher is not None:
                watcher.cancel()
                # Waited for without taking its end as ours: a cancel of the closer goes on up
                # (after the channel below is closed all the same).
                await asyncio.wait({watcher})
                if not watcher.cancelled():
                    watcher.exception()
        finally:
            self._described = None
            channel, self._channel, self._stub = self._channel, None, None
            if channel is not None:
                await channel.close()

    async def __aenter__(self) -> RemoteHarness:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


@struct(frozen=True)
class _Described:
    """A descriptor, the connection it was given on, and when it stops serving admissions."""

    descriptor: harness_pb2.HarnessDescriptor
    connection: int
    expires: float  # time.monotonic()


class _Bridge:
    """One Connect stream: one execution."""

    def __init__(self, link: RemoteHarness, start: Start, sink: EventSink | None) -> None:
        self._link = link
        self._start = start
        self._sink: EventSink = sink if sink is not None else _NO_SINK
        # The stream opened ahead of the sink (open_ahead): the Start it sends once run.
        self._opening: _Opening | None = None
        self._call: grpc.aio.StreamStreamCall | None = None
        self._task: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()
        self._watch: _WaitBound | None = None  # the bridge task's waits (made as it starts)
        self._cancel_reason: str | None = None
        # The stream ended as the protocol says (END, EOF or a park's closure): the harness ends
        # its side by itself, and its status may carry its history answer (see _PendingAnswer).
        self._ended = False

    async def run(self) -> None:
        outer = asyncio.current_task()
        self._task = asyncio.create_task(self._bridge())
        watch = self._watch = _WaitBound(self._task)
        try:
            await self._task
        except asyncio.CancelledError:
            # Our own cancel cut the stream; the caller's task was not cancelled.
            if self._cancel_reason is not None and outer is not None and not outer.cancelling():
                raise ExecutionCancelledError(self._cancelled_message("")) from None
            raise
        except (HarnessFailedError, HarnessUnavailableError) as exc:
            if self._cancel_reason is not None and exc.code == grpc.StatusCode.CANCELLED:
                raise ExecutionCancelledError(self._cancelled_message("")) from exc
            raise
        finally:
            watch.close()
            call = self._call
            if call is not None and not call.done():
                if self._ended:
                    # Its status follows the END by itself; cut it only if it lingers.
                    asyncio.get_running_loop().call_later(END_STATUS_GRACE_S, call.cancel)
                else:
                    call.cancel()

    async def cancel(self, reason: str, grace: float) -> None:
        if self._cancel_reason is None:
            self._cancel_reason = reason
        task = self._task
        if task is None or task.done():
            return
        if self._call is None:
            # The stream is not open yet (the bridge's task has not taken its first step): there is
            # nobody to tell, and cancelling the task means it never opens.
            task.cancel()
            await asyncio.wait({task}, timeout=grace)
            return
        with contextlib.suppress(*_LINK_FAILURES, TimeoutError):
            async with asyncio.timeout(grace):
                await self._send(
                    harness_pb2.ControllerFrame(cancel=harness_pb2.Cancel(reason=reason)), bridge=False
                )
        await asyncio.wait({task}, timeout=grace)
        if not task.done():
            self._call.cancel()
            task.cancel()
            await asyncio.wait({task}, timeout=grace)

    def _cancelled_message(self, description: str) -> str:
        reason = description or self._cancel_reason or ""
        return f"execution cancelled: {reason}" if reason else "execution cancelled"

    # -- the stream ------------------------------------------------------------------------

    async def open_ahead(self, session_mode: str) -> None:
        """Open the stream of a new live execution before its sink exists: the harness takes the
        call while the host makes the execution's first records durable. Its Start goes when
        :meth:`run` is given the sink, never before (a first append that fails runs no harness:
        the stream is cut then, unstarted, by :meth:`abandon`)."""
        opening = await self._prepare(_Announcement(_LIVE, 0, session_mode))
        self._connect(opening, opening.base)
        self._opening = opening

    def takes(self, start: Start, sink: EventSink) -> bool:
        """Whether this stream, opened ahead, is the one to run ``start`` over ``sink`` (then it
        runs there): opened for that Start, announcing what the sink runs (a live execution in the
        session's mode)."""
        opening = self._opening
        if opening is None or self._start is not start or _announced(sink) != opening.announced:
            return False
        self._sink = sink
        return True

    def abandon(self) -> None:
        """Cut a stream opened ahead that will not run (its Start never went)."""
        opening, self._opening = self._opening, None
        call = self._call
        if opening is None or call is None:
            return
        opening.history.held = None  # what the harness holds is not known any more: whole next time
        if not call.done():
            call.cancel()

    async def _prepare(self, announced: _Announcement) -> _Opening:
        start = self._start
        link = self._link
        body = harness_pb2.Start(
            config=start.config,
            inputs=list(start.inputs),
            resume_from_seq=start.resume_from_seq,
        )
        if start.identity is not None:
            body.identity.CopyFrom(start.identity)
        envelope = harness_pb2.ControllerFrame(session=start.session, execution_id=start.execution_id)
        history = link._history.update(start.session, start.history)
        if history.pending is not None:
            await history.take_answer()
        connection = link.connection()
        # History by reference (agentsessions.sdk.extensions) to a harness that said it holds some.
        base = history.base_on(connection) if link._history_by_reference else None
        return _Opening(announced, envelope, body, history, connection, base)

    async def _bridge(self) -> None:
        opening = self._opening
        if opening is None:
            opening = await self._prepare(_announced(self._sink))
            self._connect(opening, opening.base)
        self._opening = None  # its Start goes now: no longer abandoned unstarted
        history, base = opening.history, opening.base
        event = await self._started(base, opening.frame(base))
        if event is _BASE_NOT_HELD:
            history.held = None
            base = history.base_on(opening.connection)  # the whole history this time
            self._connect(opening, base)
            event = await self._started(base, opening.frame(base))
        assert not isinstance(event, _Marker)
        history.held = None
        if self._call is not None:
            # A harness asked to hold the history answers with the stream's status: taken at the
            # session's next Start, which also cuts the stream if the harness left it open.
            offer = (
                None
                if base is None
                else HeldBase(len(history.ends), self._start.execution_id, base.connection)
            )
            history.pending = _PendingAnswer(self._call, offer)
        try:
            # Until END, or EOF without END: completed, as the reference host treats it.
            while event is not None and not await self._handle(event):
                event = await self._receive(self._link._event_timeout, "event")
        except ApprovalParkedError:
            self._ended = True  # the harness acknowledged and closed its side
            raise
        self._ended = True

    def _connect(self, opening: _Opening, base: HeldBase | None) -> None:
        """Open the stream (grpc sends its metadata from the next loop turn on)."""
        mode, recorded, session_mode = opening.announced
        extensions = connect_metadata(mode, recorded, None if base is None else base.token, mode=session_mode)
        try:
            # The turn's trace context rides along, so the harness's spans join the turn.
            self._call = self._link._harness_stub().Connect(metadata=(*outgoing_metadata(), *extensions))
        except grpc.aio.AioRpcError as exc:
            raise _stream_error(exc, self._link.address) from exc

    async def _started(self, base: HeldBase | None, start_frame: bytes) -> common_pb2.Event | _Marker | None:
        """Send the Start frame on the stream just opened and read the first event;
        ``_BASE_NOT_HELD`` when the harness refused the history base."""
        await self._write(start_frame)
        try:
            return await self._receive(self._link._event_timeout, "event")
        except HarnessFailedError as exc:
            call = self._call
            if (
                call is not None
                and base is not None
                and base.token
                and exc.code == grpc.StatusCode.FAILED_PRECONDITION
            ):
                trailing = await call.trailing_metadata()
                if any(key == HISTORY_HELD for key, _ in trailing or ()):
                    return _BASE_NOT_HELD
            raise

    async def _handle(self, event: common_pb2.Event) -> bool:
        """Act on one harness event; True when it ended the execution."""
        kind = event.kind
        name = _kind_name(kind)
        if event.execution_id != self._start.execution_id:
            raise HarnessProtocolError(
                f"event execution_id mismatch: got {event.execution_id!r}, want {self._start.execution_id!r}"
            )
        approval_reason = kind == _KIND.EVENT_APPROVAL_REQUEST and event.WhichOneof("body") == "approval"
        details = approval_details(self._sink) if approval_reason else None
        if details is not None:
            # The reason for the REQUIRES_APPROVAL call that follows (announced in the metadata).
            details.approval_reason(event.approval.tool_call_id, event.approval.reason)
            return False
        if kind in _HOST_OWNED:
            raise HarnessProtocolError(f"harness emitted host-owned control event {name}")
        if kind in _IGNORED:
            return False
        expected = _BODY.get(kind)
        if expected is not None and event.WhichOneof("body") != expected:
            raise HarnessProtocolError(f"{name} event without its {expected} body")
        if kind == _KIND.EVENT_MODEL_CALL:
            result = await self._sink.model(event.model)
            reply = harness_pb2.ModelResult(message=result.message, model_call_id=event.model.id)
            if result.HasField("usage"):
                reply.usage.CopyFrom(result.usage)
            await self._send(harness_pb2.ControllerFrame(model=reply))
        elif kind == _KIND.EVENT_OUTPUT:
            await self._sink.output(message_text(event.message))
        elif kind == _KIND.EVENT_TOOL_CALL:
            await self._tool_call(event.tool)
        elif kind == _KIND.EVENT_TOOL_RESULT:
            field = host_owned_receipt_field(event.result)
            if field is not None:
                raise HarnessProtocolError(
                    f"harness reported host-owned approval receipt field {field} "
                    f"for tool call {event.result.id!r}"
                )
            await self._sink.report(event.result)
        elif kind == _KIND.EVENT_USAGE:
            await self._sink.usage(event.usage)
        elif kind == _KIND.EVENT_END:
            self._end(event.end)
            return True
        else:
            raise HarnessProtocolError(f"harness emitted unknown event kind {name}")
        return False

    def _end(self, end: common_pb2.HarnessEnd) -> None:
        if end.state == "COMPLETED":
            return
        description = end.error.description
        if end.state == "CANCELED" and self._cancel_reason is not None:
            raise ExecutionCancelledError(self._cancelled_message(description))
        raise HarnessFailedError(
            f"remote harness ended {end.state or 'without a state'}: {description or 'no description'}",
            description=description,
        )

    async def _tool_call(self, call: common_pb2.ToolCall) -> None:
        replaying = recorded_results(self._sink)
        if (
            call.mediation == common_pb2.MEDIATION_IN_HARNESS_REPORTED
            and replaying is not None
            and replaying.recorded_effects > 0
        ):
            recorded = await replaying.recorded_report(call)
            await self._send(harness_pb2.ControllerFrame(tool=recorded))
            return
        approval = call.mediation == common_pb2.MEDIATION_REQUIRES_APPROVAL
        if approval and (not self._start.session or not call.id):
            raise HarnessProtocolError("approval requires session and call id")
        park: ApprovalParkedError | None = None
        try:
            result = await self._sink.tool_call(call)
        except ApprovalParkedError as parked:
            if not approval:
                raise HostSinkError(
                    f"host sink parked tool call {call.id!r}, which does not require approval"
                ) from parked
            park = parked
        if park is not None:
            # Outside the except block: a failed handoff is its own error, not a wrapped park.
            await self._park(park, call)
            raise park
        assert result is not None
        reply = common_pb2.ToolResult()
        reply.CopyFrom(result)
        reply.id = call.id  # the receipt answers this call, whatever id an executor returned
        if not approval:
            field = host_owned_receipt_field(reply)
            if field is not None:
                raise HostSinkError(
                    f"host sink answered ordinary tool call {call.id!r} with approval field {field}"
                )
            await self._send(harness_pb2.ControllerFrame(tool=reply))
            return
        if reply.approval_request_seq == 0:
            raise HostSinkError(
                f"host sink answered REQUIRES_APPROVAL call {call.id!r} without an approval receipt"
            )
        decision = None
        if isinstance(self._sink, ApprovalDecisions):
            decision = self._sink.approval_decision(call.id)
        if decision is None:
            decision = decision_from_receipt(call.id, reply)
        conflict = receipt_conflict(decision, reply)
        if conflict is not None or decision.tool_call_id != call.id:
            raise HostSinkError(
                f"host sink receipt for tool call {call.id!r}: {conflict or 'decision is for another call'}"
            )
        await self._send(harness_pb2.ControllerFrame(approval=decision))
        await self._send(harness_pb2.ControllerFrame(tool=reply))

    async def _park(self, parked: ApprovalParkedError, call: common_pb2.ToolCall) -> None:
        """Hand the park to the harness; require its acknowledgement and then stream closure."""
        ref = parked.ref
        if (
            ref.execution_id != self._start.execution_id
            or ref.tool_call_id != call.id
            or ref.request_seq <= 0
        ):
            raise HostSinkError(f"host sink parked with a reference that does not name tool call {call.id!r}")
        await self._send(harness_pb2.ControllerFrame(park=ref))
        ack = await self._receive(self._link._ack_timeout, "park acknowledgement")
        if (
            ack is None
            or ack.kind != _KIND.EVENT_PARKED
            or ack.execution_id != self._start.execution_id
            or ack.WhichOneof("body") != "parked"
            or ack.parked != ref
        ):
            raise HarnessProtocolError("park acknowledgement correlation mismatch")
        after = await self._receive(self._link._ack_timeout, "stream closure after park acknowledgement")
        if after is not None:
            raise HarnessProtocolError(
                f"expected stream closure after park acknowledgement, got {_kind_name(after.kind)}"
            )

    async def _send(self, frame: harness_pb2.ControllerFrame, *, bridge: bool = True) -> None:
        frame.session = self._start.session
        frame.execution_id = self._start.execution_id
        await self._write(frame, bridge=bridge)

    async def _write(self, frame: harness_pb2.ControllerFrame | bytes, *, bridge: bool = True) -> None:
        """Write one frame, bounded by ``event_timeout``: from the bridge's own task (``bridge``)
        by its stream's :class:`_WaitBound`, from another task (a cancel) by a timeout of its own."""
        call = self._call
        assert call is not None
        bound = self._link._event_timeout
        watch = self._watch if bridge else None
        async with self._write_lock:
            try:
                if watch is not None:
                    watch.arm(bound)
                    try:
                        await call.write(frame)
                    finally:
                        watch.disarm()
                else:
                    async with asyncio.timeout(bound):
                        await call.write(frame)
            except asyncio.CancelledError:
                if watch is None or not watch.expired():
                    raise
                raise self._no_frame_accepted(bound) from None
            except TimeoutError:
                raise self._no_frame_accepted(bound) from None
            except grpc.aio.AioRpcError as exc:
                raise _status_error(
                    exc.code(), exc.details() or "", self._link.address, writing=True
                ) from exc
            except (asyncio.InvalidStateError, grpc.aio.UsageError) as exc:
                # The stream already finished; its status says why.
                code = await call.code()
                details = await call.details()
                raise _status_error(code, details, self._link.address, writing=True) from exc

    def _no_frame_accepted(self, bound: float | None) -> HarnessUnavailableError:
        return HarnessUnavailableError(
            f"harness at {self._link.address} accepted no frame within {bound} s",
            grpc.StatusCode.DEADLINE_EXCEEDED,
        )

    async def _receive(self, bound: float | None, what: str) -> common_pb2.Event | None:
        """The harness's next event (None at EOF), read by the bridge's task within ``bound``."""
        call = self._call
        assert call is not None
        watch = self._watch
        assert watch is not None
        watch.arm(bound)
        try:
            message = await call.read()
        except grpc.aio.AioRpcError as exc:
            raise _stream_error(exc, self._link.address) from exc
        except asyncio.CancelledError as exc:
            if watch.expired():
                raise HarnessUnavailableError(
                    f"harness at {self._link.address} sent no {what} within {bound} s",
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                ) from None
            _reraise_cut(exc, self._link.address, "the Connect stream")
        finally:
            watch.disarm()
        if message is grpc.aio.EOF:
            return None
        if isinstance(message, _Undecodable):
            raise HarnessProtocolError(
                f"harness sent a frame that does not decode as agentsessions.v1.Event: {message.why}"
            )
        assert isinstance(message, common_pb2.Event)
        return message


def _reraise_cut(exc: asyncio.CancelledError, address: str, what: str) -> NoReturn:
    """Raise for a CancelledError out of a call: grpc raises one from a call cancelled on this side
    (its channel closed: the harness process went away and was retired, say), also in a task nobody
    cancelled. That is the harness gone, UNAVAILABLE; a cancel of the current task itself goes on."""
    task = asyncio.current_task()
    if task is None or task.cancelling():
        raise exc
    raise HarnessUnavailableError(
        f"harness at {address}: {what} was cut on this side (its channel closed)", grpc.StatusCode.UNAVAILABLE
    ) from None


class _WaitBound:
    """Bounds each wait of one bridge's task on its stream (``event_timeout``, ``ack_timeout``)
    with one timer for the whole stream, where ``asyncio.timeout`` takes a timer of its own for
    every read and write (four a turn: ~4 us each, and a heap of cancelled timers on the loop).

    :meth:`arm` before a wait and :meth:`disarm` after it only move a deadline; the timer, when it
    fires, looks at the wait then in progress: past its deadline, the task is cancelled (and
    :meth:`expired` says so, as ``asyncio.timeout`` turns its own cancel into TimeoutError); not
    yet, it is set again for that deadline; none, it is dropped until the next wait. A wait with a
    nearer deadline than the timer's moves the timer. :meth:`close` drops it with the stream."""

    __slots__ = ("_cancelling", "_deadline", "_fired", "_loop", "_task", "_timer", "_timer_at")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self._loop = task.get_loop()
        self._task = task
        self._deadline: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._fired = False
        self._cancelling = 0

    def arm(self, bound: float | None) -> None:
        if bound is None:
            self._deadline = None
            return
        deadline = self._loop.time() + bound
        self._deadline = deadline
        self._cancelling = self._task.cancelling()
        timer = self._timer
        if timer is None or deadline < self._timer_at:
            if timer is not None:
                timer.cancel()
            self._timer = self._loop.call_at(deadline, self._due)
            self._timer_at = deadline

    def disarm(self) -> None:
        self._deadline = None

    def expired(self) -> bool:
        """After a CancelledError out of the armed wait: whether this bound cancelled it (and no
        one else did too; then the task's cancel is taken back, as ``asyncio.timeout`` does)."""
        if not self._fired:
            return False
        self._fired = False
        return self._task.uncancel() <= self._cancelling

    def close(self) -> None:
        self._deadline = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _due(self) -> None:
        self._timer = None
        deadline = self._deadline
        if deadline is None or self._task.done():
            return
        if self._loop.time() < deadline:
            self._timer = self._loop.call_at(deadline, self._due)
            self._timer_at = deadline
            return
        self._deadline = None
        self._fired = True
        self._task.cancel()


class _Marker:
    """A sentinel type (see ``_BASE_NOT_HELD``)."""


_BASE_NOT_HELD = _Marker()


def _nothing() -> None:
    """What cuts a stream that was not opened ahead."""


# The mode a new live execution announces (agentsessions.sdk.extensions), with no recorded effects.
_LIVE = "live"


class _Announcement(NamedTuple):
    """What a stream's metadata announces of its execution (agentsessions.sdk.extensions)."""

    mode: str  # its run mode: live, recovery or replay
    recorded: int  # the effects its journal holds
    session_mode: str  # the session's mode ("": none)


def _announced(sink: EventSink) -> _Announcement:
    """What a stream announces for ``sink``'s execution: its run mode and recorded effects (a
    re-run's, or live with none) and the session's mode, when the host's sink says."""
    replaying = recorded_results(sink)
    session_mode = getattr(sink, "host_mode", "")
    if replaying is not None and replaying.recorded_effects > 0:
        mode, recorded = replaying.run_mode, replaying.recorded_effects
    else:
        mode, recorded = _LIVE, 0
    return _Announcement(mode, recorded, session_mode if isinstance(session_mode, str) else "")


@struct(frozen=True, slots=True)
class _Opening:
    """What a stream's Start is made of: what its metadata announces, the frame's parts, and the
    session's history with the base the harness may hold of it on the connection it was taken on."""

    announced: _Announcement
    envelope: harness_pb2.ControllerFrame
    body: harness_pb2.Start
    history: _History
    connection: int | None
    base: HeldBase | None

    def frame(self, base: HeldBase | None) -> bytes:
        return _start_frame(self.envelope, self.body, self.history.after(base))


class _NoSink:
    """The sink of a stream opened ahead, until :meth:`RemoteHarness.run` gives it the real one."""

    def __getattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"a stream opened ahead has no sink until it runs (asked for {name!r})")


_NO_SINK: Any = _NoSink()


@struct(frozen=True)
class HeldBase:
    """What the harness said it holds of a session's history: the events sent with the Start
    ``token``, on connection ``connection`` of the channel."""

    count: int
    token: str
    connection: int


@struct(frozen=True, slots=True)
class _PendingAnswer:
    """A session's last Connect stream and, when its Start asked the harness to hold the
    session's history (``agentsessions-history-base``), what the harness holds if it answers
    ``held`` (``offer``: the events sent with that Start; None: no answer is expected).

    A harness served by this SDK answers ``agentsessions-history-held`` in the stream's trailing
    metadata (the status, which follows its last event), earlier ones in its initial metadata. The
    answer is read at the session's next Start, when the stream has long ended: nothing waits for
    it on the turn's own path.
    """

    call: grpc.aio.StreamStreamCall
    offer: HeldBase | None


class _History:
    """One session's Start.history on the wire: each event encoded once, as a repeated
    ``Start.history`` field, and the end offset of each in ``encoded``."""

    __slots__ = ("encoded", "ends", "first", "held", "last", "offset", "pending", "source")

    def __init__(self) -> None:
        self.encoded = bytearray()
        self.ends: list[int] = []
        # What the encoded events are: a prefix of the journal cache's log ``source`` from
        # ``offset`` on, or (any other sequence) the objects at its two ends.
        self.source: Sequence[common_pb2.Event] | None = None
        self.offset = 0
        self.last: common_pb2.Event | None = None
        self.first: common_pb2.Event | None = None
        self.held: HeldBase | None = None
        self.pending: _PendingAnswer | None = None

    def extends(self, history: Sequence[common_pb2.Event]) -> bool:
        # The controller hands over a prefix of the journal cache's log, which only ever grows
        # at its end: the same log from the same place means the same events.
        # A compaction moves where the history begins (its baseline): a held base does not survive it.
        count = len(self.ends)
        if count == 0:
            return True
        if isinstance(history, Prefix):
            return history.source is self.source and history.start == self.offset and len(history) >= count
        return (
            self.source is None
            and len(history) >= count
            and history[count - 1] is self.last
            and history[0] is self.first
        )

    def feed(self, history: Sequence[common_pb2.Event]) -> None:
        encoded, ends = self.encoded, self.ends
        prefix = history if isinstance(history, Prefix) else None
        if prefix is not None and not ends:
            self.source, self.offset = prefix.source, prefix.start
        for index in range(len(ends), len(history)):
            if prefix is not None:
                blob = prefix.blob(index)  # kept encoded by the cache: not encoded again
            else:
                event = history[index]
                blob = event.SerializeToString()
                self.last = event
            encoded += _HISTORY_TAG
            encoded += protowire.varint(len(blob))
            encoded += blob
            ends.append(len(encoded))
        if ends and prefix is None and self.first is None:
            self.first = history[0]

    def base_on(self, connection: int | None) -> HeldBase | None:
        """The base to send to a harness on ``connection`` ("" token: it may hold one from now;
        None: a history too short to be worth it goes whole, without the extension)."""
        held = self.held
        if connection is None or len(self.encoded) < HISTORY_BY_REFERENCE_MIN_BYTES:
            return None
        if held is None or held.connection != connection or held.count > len(self.ends):
            return HeldBase(0, "", connection)
        return held

    def after(self, base: HeldBase | None) -> memoryview:
        """The encoded events after ``base`` (all of them without one)."""
        start = 0 if base is None or base.count == 0 else self.ends[base.count - 1]
        return memoryview(self.encoded)[start:]

    async def take_answer(self) -> None:
        """Take the harness's ``agentsessions-history-held`` answer to the last Start (``pending``):
        from the stream's status, or its initial metadata (harnesses of earlier SDKs). A stream
        still open (a harness that does not end its side) is cut, and the history goes whole."""
        pending, self.pending = self.pending, None
        assert pending is not None
        call = pending.call
        self.held = None
        if not call.done():
            call.cancel()
            return
        offer = pending.offer
        if offer is None:
            return
        for metadata in (await call.trailing_metadata(), await call.initial_metadata()):
            for key, value in metadata or ():
                if key == HISTORY_HELD and value == offer.token:
                    self.held = offer
                    return


class _HistoryEncoder:
    """Start.history on the wire, encoded incrementally per session.

    A session's history only grows between its turns, and the controller hands over a prefix of
    the same cached log each turn, so each event is framed once instead of once per turn (from
    the encoding the cache keeps: ``controller.eventlog``): the Start frame of turn 1,000 costs
    about what the one of turn 10 does. A history that does not extend the remembered one
    (another log, a fork, an evicted entry, a compaction's new start) is encoded afresh.
    """

    def __init__(self, max_sessions: int) -> None:
        self._max = max_sessions
        self._entries: OrderedDict[str, _History] = OrderedDict()

    def update(self, session: str, history: Sequence[common_pb2.Event]) -> _History:
        """The session's encoding, extended to ``history``."""
        entry = self._entries.get(session)
        if entry is None or not entry.extends(history):
            entry = _History()
            self._entries[session] = entry
        entry.feed(history)
        self._entries.move_to_end(session)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)
        return entry


def _start_frame(
    envelope: harness_pb2.ControllerFrame, body: harness_pb2.Start, history: bytes | memoryview
) -> bytes:
    """A ControllerFrame{start} on the wire: the envelope, then Start with its encoded history
    appended (a parser merges fields in any order, so this reads as one ordinary Start)."""
    start = b"".join((body.SerializeToString(), history))
    return b"".join((envelope.SerializeToString(), _START_TAG, protowire.varint(len(start)), start))


def _frame_bytes(frame: harness_pb2.ControllerFrame | bytes) -> bytes:
    return frame if isinstance(frame, bytes) else frame.SerializeToString()


def _kind_name(kind: int) -> str:
    try:
        return common_pb2.EventKind.Name(kind)  # type: ignore[arg-type]
    except ValueError:
        return f"EventKind({kind})"


@struct(frozen=True)
class _Undecodable:
    """A harness message the protobuf runtime refused; ``why`` names the field and the rule."""

    why: str


def _decoder(message_type: type[Message]) -> Callable[[bytes], Any]:
    """A response decoder that reports bytes which do not decode instead of raising (gRPC would
    log the error and hand back None)."""

    def decode(data: bytes) -> Any:
        try:
            return message_type.FromString(data)
        except DecodeError as exc:
            found = protowire.explain(message_type.DESCRIPTOR, data, str(exc))  # type: ignore[arg-type]
            return _Undecodable(f"{found.path}: {found.rule}" if found.path else found.rule)

    return decode


def _stream_error(exc: grpc.aio.AioRpcError, address: str) -> HarnessLinkError | HarnessUnavailableError:
    return _status_error(exc.code(), exc.details() or "", address)


def _status_error(
    code: grpc.StatusCode, details: str, address: str, *, writing: bool = False
) -> HarnessLinkError | HarnessUnavailableError:
    if code == grpc.StatusCode.OK:
        # The harness returned while the host still had frames for it (a reply, a cancel).
        message = f"harness at {address} closed the stream mid-turn, before the host's reply was delivered"
        return HarnessProtocolError(message)
    status = f"{code.name}: {details or 'no details'}"
    if writing:
        # gRPC reports a write to a stream the harness already ended with a status of its own.
        message = (
            f"harness at {address} ended the stream mid-turn, "
            f"while the host was sending it a frame ({status})"
        )
    else:
        message = f"harness at {address} ended the stream with {status}"
    if code in _UNAVAILABLE:
        return HarnessUnavailableError(message, code)
    return HarnessFailedError(message, code, description=details)
