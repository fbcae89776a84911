"""The host side of an execution: the EventSink the controller hands a harness.

One class serves every mode. It holds the execution's recorded effects (empty for a new
turn) and serves them back in order, checking that the harness asks for exactly what was
recorded (I0, output and tool identity, result correlation). Once the recorded effects are
used up it goes live — journaling intent before every effect — unless it is a pure replay,
where any unrecorded request is divergence. Divergence and parks are sticky.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from agentsessions.host.controller.approval_policy import SessionGate
from agentsessions.host.controller.errors import InheritedToolIntentError, ReplayDivergedError
from agentsessions.host.controller.executions import Effect
from agentsessions.host.controller.inputhash import model_input_hash
from agentsessions.host.controller.tools import ToolInvoker, check_host_call, check_reported_result
from agentsessions.host.models.provider import ModelProvider
from agentsessions.host.tools.errors import MissingToolExecutorError
from agentsessions.sdk.approval import DENIED_MESSAGE
from agentsessions.sdk.errors import ApprovalParkedError, SinkClosedError
from agentsessions.sdk.harness import text_message
from agentsessions.v1 import common_pb2, harness_pb2, session_pb2

# Kinds through the generated module's constants: an EnumTypeWrapper attribute costs ~1.5 us.
K = common_pb2

# Appends one event for this execution and returns its durable record.
Appender = Callable[[common_pb2.Event], Awaitable[common_pb2.LogRecord]]
DeltaSink = Callable[[session_pb2.Delta], Awaitable[None]]


@dataclass
class SinkCounters:
    """What the sink did live (observable: replay must report zero model calls)."""

    model_calls: int = 0


class ExecutionSink:
    """EventSink for one execution (live, recovery, or pure replay)."""

    def __init__(
        self,
        *,
        session: str,
        execution_id: str,
        append: Appender,
        model: ModelProvider | None,
        tools: ToolInvoker | None,
        recorded: list[Effect] | None = None,
        recorded_usage: int = 0,
        live: bool = True,
        on_delta: DeltaSink | None = None,
        inherited_prefix: bool = False,
        redrive_trailing_model: bool = True,
        new_id: Callable[[], str] | None = None,
        gate: SessionGate | None = None,
    ) -> None:
        self.session = session
        self.execution_id = execution_id
        self._append = append
        self._model = model
        self._tools = tools
        self._recorded = recorded or []
        self._cursor = 0
        self._usage_left = recorded_usage
        self._live = live
        self._on_delta = on_delta
        self._inherited = inherited_prefix
        self._redrive_model = redrive_trailing_model
        self._new_id: Callable[[], str] = new_id or (lambda: secrets.token_hex(8))
        self._gate = gate
        self._lock = asyncio.Lock()
        self._failure: BaseException | None = None
        self._closed = False
        self.parked: ApprovalParkedError | None = None
        self.counters = SinkCounters()
        # Decisions served with receipts, by call id (transports relay them before the receipt).
        self._decisions: dict[str, common_pb2.ApprovalResult] = {}

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Seal the sink: every later call fails with SinkClosedError."""
        self._closed = True

    def approval_decision(self, tool_call_id: str) -> common_pb2.ApprovalResult | None:
        """The recorded decision behind a receipt this sink returned (for the Connect bridge)."""
        return self._decisions.get(tool_call_id)

    def unconsumed(self) -> int:
        """Recorded effects the harness has not asked for (non-zero after run = divergence)."""
        return len(self._recorded) - self._cursor

    def _check_open(self) -> None:
        if self.parked is not None:
            raise self.parked
        if self._failure is not None:
            raise self._failure
        if self._closed:
            raise SinkClosedError("the execution has ended; the sink is closed")

    def _diverge(self, why: str) -> ReplayDivergedError:
        err = ReplayDivergedError(f"execution {self.execution_id}: {why}")
        self._failure = err
        return err

    def _next_recorded(self, wanted: str) -> Effect | None:
        if self._cursor >= len(self._recorded):
            if not self._live:
                raise self._diverge(f"harness asked for an unrecorded {wanted} during replay")
            return None
        effect = self._recorded[self._cursor]
        if effect.kind != wanted:
            raise self._diverge(f"harness asked for {wanted} where the journal recorded {effect.kind}")
        return effect

    async def _record(self, event: common_pb2.Event) -> common_pb2.LogRecord:
        event.execution_id = self.execution_id
        return await self._append(event)

    # -- EventSink ------------------------------------------------------------------------

    async def model(self, call: common_pb2.ModelCall) -> harness_pb2.ModelResult:
        async with self._lock:
            self._check_open()
            input_hash = model_input_hash(call)
            effect = self._next_recorded("model")
            if effect is not None:
                recorded = effect.call.model
                if recorded.input_hash != input_hash:
                    raise self._diverge("model input hash mismatch - harness violated STATELESS_REPLAY (I0)")
                if effect.reply is not None:
                    self._cursor += 1
                    return harness_pb2.ModelResult(message=effect.reply.message, model_call_id=call.id)
                if self._cursor != len(self._recorded) - 1 or not self._live or not self._redrive_model:
                    raise self._diverge("recorded completion missing")
                # A trailing MODEL_CALL without OUTPUT: re-drive the provider once, reuse the record.
                result = await self._invoke_model(call)
                self._cursor += 1
                await self._record(common_pb2.Event(kind=K.EVENT_OUTPUT, message=result.message))
                return harness_pb2.ModelResult(
                    message=result.message, usage=result.usage, model_call_id=call.id
                )
            await self._record(
                common_pb2.Event(
                    kind=K.EVENT_MODEL_CALL,
                    model=common_pb2.ModelCall(model=call.model, input_hash=input_hash, id=self._new_id()),
                )
            )
            result = await self._invoke_model(call)
            await self._record(common_pb2.Event(kind=K.EVENT_OUTPUT, message=result.message))
            return harness_pb2.ModelResult(message=result.message, usage=result.usage, model_call_id=call.id)

    async def _invoke_model(self, call: common_pb2.ModelCall) -> harness_pb2.ModelResult:
        if self._model is None:
            raise self._diverge("no model provider is configured")
        self.counters.model_calls += 1
        on_delta = self._on_delta
        if on_delta is None:
            return await self._model.complete(call)
        execution_id = self.execution_id

        async def relay(chunk: str) -> None:
            await on_delta(session_pb2.Delta(execution_id=execution_id, chunk=chunk))

        result = await self._model.complete(call, relay)
        await on_delta(session_pb2.Delta(execution_id=execution_id, done=True))
        return result

    async def output(self, text: str) -> None:
        async with self._lock:
            self._check_open()
            effect = self._next_recorded("output")
            message = text_message("assistant", text)
            if effect is not None:
                if effect.call.message != message:
                    raise self._diverge("output mismatch with the recorded OUTPUT")
                self._cursor += 1
                return
            await self._record(common_pb2.Event(kind=K.EVENT_OUTPUT, message=message))

    async def report(self, result: common_pb2.ToolResult) -> None:
        async with self._lock:
            self._check_open()
            check_reported_result(result)
            effect = self._next_recorded("report")
            if effect is not None:
                if effect.call.result.id != result.id:
                    raise self._diverge(
                        f"reported result {result.id!r} does not match recorded {effect.call.result.id!r}"
                    )
                self._cursor += 1
                return
            await self._record(common_pb2.Event(kind=K.EVENT_TOOL_RESULT, result=result))

    async def usage(self, usage: common_pb2.Usage) -> None:
        async with self._lock:
            self._check_open()
            if self._usage_left > 0:
                self._usage_left -= 1  # already journaled before the interruption
                return
            if not self._live:
                return
            await self._record(common_pb2.Event(kind=K.EVENT_USAGE, usage=usage))

    async def tool_call(self, call: common_pb2.ToolCall) -> common_pb2.ToolResult:
        async with self._lock:
            self._check_open()
            check_host_call(call)
            effect = self._next_recorded("tool")
            if effect is None:
                return await self._live_tool_call(call)
            recorded = effect.call.tool
            if _tool_identity(recorded) != _tool_identity(call):
                raise self._diverge(f"tool call {call.id!r} differs from the recorded intent")
            if effect.reply is not None:
                self._cursor += 1
                if effect.approval_result is not None:
                    self._decisions[call.id] = effect.approval_result[1].approval_result
                return effect.reply.result
            if self._cursor != len(self._recorded) - 1 or not self._live:
                raise self._diverge(f"tool call {call.id!r} has no recorded result")
            if self._inherited:
                raise InheritedToolIntentError(
                    f"tool call {call.id!r} was copied from the parent by a fork; "
                    "fork at or after the TOOL_RESULT, or Exec a new turn"
                )
            self._cursor += 1
            if call.mediation == common_pb2.MEDIATION_REQUIRES_APPROVAL:
                return await self._approval_gate(recorded, effect)
            return await self._execute(recorded)

    # -- tools ----------------------------------------------------------------------------

    async def _live_tool_call(self, call: common_pb2.ToolCall) -> common_pb2.ToolResult:
        intent = common_pb2.ToolCall()
        intent.CopyFrom(call)
        await self._record(common_pb2.Event(kind=K.EVENT_TOOL_CALL, tool=intent))
        if call.mediation == common_pb2.MEDIATION_REQUIRES_APPROVAL:
            return await self._approval_gate(intent, Effect("tool", common_pb2.Event(tool=intent)))
        return await self._execute(intent)

    async def _execute(self, call: common_pb2.ToolCall, **receipt: int) -> common_pb2.ToolResult:
        if self._tools is None:
            raise MissingToolExecutorError(call.tool, [])  # the registry raises it for unknown tools
        result = await self._tools.execute(self.session, call)
        stored = common_pb2.ToolResult()
        stored.CopyFrom(result)
        stored.id = call.id
        if receipt:
            stored.approval_request_seq = receipt["request_seq"]
            stored.approval_decision_seq = receipt["decision_seq"]
            if stored.is_error:
                stored.code = common_pb2.ToolResult.EXECUTOR_ERROR
            else:
                stored.code = common_pb2.ToolResult.CODE_UNSPECIFIED
        await self._record(common_pb2.Event(kind=K.EVENT_TOOL_RESULT, result=stored))
        return stored

    async def _approval_gate(self, call: common_pb2.ToolCall, effect: Effect) -> common_pb2.ToolResult:
        if effect.approval_request is None:
            request = common_pb2.Event(
                kind=K.EVENT_APPROVAL_REQUEST, approval=common_pb2.ApprovalRequest(tool_call_id=call.id)
            )
            if self._gate is not None:
                self._gate.stamp_request(request)
            rec = await self._record(request)
            request_seq = rec.seq
        else:
            request_seq = effect.approval_request[0]
        if effect.approval_result is None and self._gate is not None:
            # A decision of the host's own (policy rule, session grant) is journaled like a person's.
            decided = await self._gate.decide(call, self.execution_id, request_seq)
            if decided is not None:
                rec = await self._record(decided)
                effect.approval_result = (rec.seq, rec.event)
        if effect.approval_result is None:
            self.parked = ApprovalParkedError(
                common_pb2.ApprovalRef(
                    execution_id=self.execution_id, tool_call_id=call.id, request_seq=request_seq
                )
            )
            raise self.parked
        decision_seq, decision_event = effect.approval_result
        decision = decision_event.approval_result
        self._decisions[call.id] = decision
        if not decision.approved:
            receipt = common_pb2.ToolResult(
                id=call.id,
                is_error=True,
                code=common_pb2.ToolResult.APPROVAL_DENIED,
                error=DENIED_MESSAGE,
                content=[common_pb2.Part(text=common_pb2.TextPart(text=DENIED_MESSAGE))],
                approval_request_seq=request_seq,
                approval_decision_seq=decision_seq,
            )
            await self._record(common_pb2.Event(kind=K.EVENT_TOOL_RESULT, result=receipt))
            return receipt
        return await self._execute(call, request_seq=request_seq, decision_seq=decision_seq)


def _tool_identity(call: common_pb2.ToolCall) -> tuple[str, str, bytes, int, str, bool]:
    args = call.args.SerializeToString(deterministic=True) if call.HasField("args") else b""
    return (call.id, call.tool, args, call.mediation, call.idempotency_key, call.HasField("args"))
