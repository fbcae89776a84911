"""The host side of an execution: the EventSink the controller hands a harness.

One class serves every mode. It holds the execution's recorded effects (empty for a new
turn) and serves them back in order, checking that the harness asks for exactly what was
recorded (I0, output and tool identity, result correlation). Once the recorded effects are
used up it goes live — journaling intent before every effect — unless it is a pure replay,
where any unrecorded request is divergence. Divergence and parks are sticky.

Usage. A model call's usage, when the provider reports one, is journaled once, as a USAGE record
right after its OUTPUT, and served with the recorded completion on replay and recovery. A
harness that also reports usage itself (``usage()``) with the same value as the last model
call's is reporting that same accounting: it is not journaled again. Any other usage is.

Beyond v1 (``agentsessions.sdk.extensions``): ``recorded_report`` serves an in-harness tool's
recorded result instead of the harness re-running it, and ``approval_reason`` lets a harness say
why a call needs approval (journaled in its APPROVAL_REQUEST).

Modes (``agentsessions.host.controller.modes``): before a host-run call runs, and at a gate before
its request is decided, the session's mode judges it. A refused CONTROLLER_MEDIATED call gets an
error result instead of running; a refused request gets the host's denial; a gated request carries
the mode's reason. ``host_mode`` is the session's mode as announced to the harness.

Subagents (``agentsessions.host.controller.subagents``): a ``task`` call of a harness that asked for
the tool goes to ``tasks.gate``, which parks the execution as an approval does until its children
settle, then writes the receipt.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from agentsessions.host.controller.approval_policy import SessionGate
from agentsessions.host.controller.deltas import DeltaBatching, DeltaSink, DeltaStream
from agentsessions.host.controller.errors import InheritedToolIntentError, ReplayDivergedError
from agentsessions.host.controller.executions import Effect
from agentsessions.host.controller.inputhash import model_input_hash
from agentsessions.host.controller.modes import GATE, ModeCheck, decided_by_mode
from agentsessions.host.controller.tools import ToolInvoker, check_host_call, check_reported_result
from agentsessions.host.ids import token_hex
from agentsessions.host.models.provider import ModelProvider
from agentsessions.host.tools.errors import MissingToolExecutorError
from agentsessions.host.tools.task import is_task_call
from agentsessions.sdk.approval import denied_receipt
from agentsessions.sdk.errors import ApprovalParkedError, SinkClosedError
from agentsessions.sdk.harness import message_text, text_message
from agentsessions.sdk.recorded import recorded_completion
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2, harness_pb2

log = logging.getLogger(__name__)

# Kinds through the generated module's constants: an EnumTypeWrapper attribute costs ~1.5 us.
K = common_pb2

# Appends one event for this execution and returns its durable record.
Appender = Callable[[common_pb2.Event], Awaitable[common_pb2.LogRecord]]
# Orders one event after the execution's records and makes it durable in the background; the
# next append waits for it (controller.writer.ExecutionWriter.append_soon).
AppendSoon = Callable[[common_pb2.Event], None]


class DeltaHold(Protocol):
    """Where a live execution's deltas go, able to hold a model call's frames until its MODEL_CALL
    record has gone out ahead of them (journal.feed.DeltaGate)."""

    def hold(self, model_call_id: str) -> None: ...

    def release(self) -> None: ...


__all__ = ["AppendSoon", "Appender", "DeltaHold", "DeltaSink", "ExecutionSink", "SinkCounters", "TaskGate"]


class TaskGate(Protocol):
    """Answers the ``task`` calls of a harness that asked for the tool (controller.subagents)."""

    async def gate(
        self,
        session: str,
        execution_id: str,
        call: common_pb2.ToolCall,
        effect: Effect | None,
        record: Appender,
        park: Callable[[common_pb2.ApprovalRef], ApprovalParkedError],
    ) -> common_pb2.ToolResult: ...


@struct
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
        delta_batching: DeltaBatching | None = None,
        inherited_prefix: bool = False,
        redrive_trailing_model: bool = True,
        new_id: Callable[[], str] | None = None,
        gate: SessionGate | None = None,
        modes: ModeCheck | None = None,
        host_mode: str = "",
        tasks: TaskGate | None = None,
        append_soon: AppendSoon | None = None,
        model_intent_soon: bool = False,
        delta_hold: DeltaHold | None = None,
    ) -> None:
        self.session = session
        self._tasks = tasks  # the host's task tool, for a harness that asked for it
        self.execution_id = execution_id
        self._append = append
        self._append_soon = append_soon
        # The MODEL_CALL intent ordered with append_soon too (not durable before the model runs).
        self._model_intent_soon = model_intent_soon and append_soon is not None
        self._delta_hold = delta_hold  # holds ``on_delta``'s frames for a MODEL_CALL not yet relayed
        self._model = model
        self._tools = tools
        self._recorded = recorded or []
        self._cursor = 0
        self._usage_left = recorded_usage
        self._live = live
        self._on_delta = on_delta
        self.delta_sink = on_delta  # where this execution's deltas go (a corrective turn's too)
        self._delta_batching = delta_batching or DeltaBatching()
        self._inherited = inherited_prefix
        self._redrive_model = redrive_trailing_model
        self._new_id: Callable[[], str] = new_id or (lambda: token_hex(8))
        self._gate = gate
        self._modes = modes
        self.host_mode = host_mode  # the session's mode, announced to the harness
        self._lock = asyncio.Lock()
        self._failure: BaseException | None = None
        self._closed = False
        self.parked: ApprovalParkedError | None = None
        self.counters = SinkCounters()
        # Decisions served with receipts, by call id (transports relay them before the receipt).
        self._decisions: dict[str, common_pb2.ApprovalResult] = {}
        self._reasons: dict[str, str] = {}
        self._last_usage: common_pb2.Usage | None = None
        self._model_calls = 0  # model effects asked for so far (names the call in a divergence)
        self.recorded_effects = len(self._recorded)
        self.run_mode = "replay" if not live else ("recovery" if self._recorded else "live")

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Seal the sink: every later call fails with SinkClosedError."""
        self._closed = True

    def approval_decision(self, tool_call_id: str) -> common_pb2.ApprovalResult | None:
        """The recorded decision behind a receipt this sink returned (for the Connect bridge)."""
        return self._decisions.get(tool_call_id)

    def approval_reason(self, tool_call_id: str, reason: str) -> None:
        """Why the harness asks approval for this call (journaled with its APPROVAL_REQUEST)."""
        if reason:
            self._reasons[tool_call_id] = reason

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

    def _order(self, event: common_pb2.Event) -> None:
        """Order ``event`` after the execution's records; durable with its next append."""
        assert self._append_soon is not None
        event.execution_id = self.execution_id
        self._append_soon(event)

    # -- EventSink ------------------------------------------------------------------------

    async def model(self, call: common_pb2.ModelCall) -> harness_pb2.ModelResult:
        async with self._lock:
            self._check_open()
            input_hash = model_input_hash(call)
            self._model_calls += 1
            effect = self._next_recorded("model")
            if effect is not None:
                recorded = effect.call.model
                if recorded.input_hash != input_hash:
                    raise self._diverge(_input_mismatch(self._model_calls, recorded, call))
                if effect.reply is not None:
                    self._cursor += 1
                    served = recorded_completion(effect.reply, effect.usage, call.id)
                    self._last_usage = None if effect.usage is None else served.usage
                    return served
                if self._cursor != len(self._recorded) - 1 or not self._live or not self._redrive_model:
                    raise self._diverge("recorded completion missing")
                # A trailing MODEL_CALL without OUTPUT: re-drive the provider once, reuse the record.
                result = await self._invoke_model(call)
                self._cursor += 1
                return await self._record_completion(call, result)
            intent = common_pb2.ModelCall(model=call.model, input_hash=input_hash, id=self._new_id())
            if call.params:
                intent.params.update(call.params)
            event = common_pb2.Event(kind=K.EVENT_MODEL_CALL, model=intent)
            hold = self._delta_hold
            if self._model_intent_soon and (self._on_delta is None or hold is not None):
                # Durable with the answer's records, or SOON_LINGER_S into a longer call: a crash
                # before then leaves the journal as it stood before the call, and recovery asks
                # the model once, as it does after a crash that leaves the MODEL_CALL trailing.
                # The call's deltas wait for the record, as if it had been durable first.
                self._order(event)
                if hold is not None:
                    hold.hold(intent.id)
            else:
                await self._record(event)
            result = await self._invoke_model(call)
            return await self._record_completion(call, result)

    async def _record_completion(
        self, call: common_pb2.ModelCall, result: harness_pb2.ModelResult
    ) -> harness_pb2.ModelResult:
        """Journal a fresh completion (OUTPUT, then its usage once) and answer the harness. Where
        the sink may, the answer does not wait for those records' flush: whatever the harness
        does with it reaches the journal after them (the class docstring of ExecutionWriter)."""
        reply = harness_pb2.ModelResult(message=result.message, model_call_id=call.id)
        records = [common_pb2.Event(kind=K.EVENT_OUTPUT, message=result.message)]
        self._last_usage = None
        if result.HasField("usage"):
            reply.usage.CopyFrom(result.usage)
            records.append(common_pb2.Event(kind=K.EVENT_USAGE, usage=reply.usage))
        for event in records:
            if self._append_soon is not None:
                self._order(event)
            else:
                await self._record(event)
        if result.HasField("usage"):
            self._last_usage = reply.usage
        return reply

    async def _invoke_model(self, call: common_pb2.ModelCall) -> harness_pb2.ModelResult:
        if self._model is None:
            raise self._diverge("no model provider is configured")
        self.counters.model_calls += 1
        on_delta = self._on_delta
        if on_delta is None:
            return await self._model.complete(call)
        # Streamed text leaves in batches (controller.deltas), then the final done frame.
        stream = DeltaStream(self.execution_id, on_delta, self._delta_batching)
        try:
            result = await self._model.complete(call, stream.push)
        except BaseException:
            stream.close()
            raise
        await stream.finish()
        return result

    async def output(self, text: str) -> None:
        async with self._lock:
            self._check_open()
            effect = self._next_recorded("output")
            message = text_message("assistant", text)
            if effect is not None:
                if effect.call.message != message:
                    raise self._diverge(
                        f"output mismatch with the recorded OUTPUT: the harness wrote {_quote(text)} "
                        f"where the journal recorded {_quote(message_text(effect.call.message))}"
                    )
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
            if self._last_usage is not None and usage == self._last_usage:
                self._last_usage = None  # the last model call's usage, journaled with its OUTPUT
                return
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
            tasks = self._tasks if self._tasks is not None and is_task_call(call) else None
            if effect is None:
                if tasks is not None:
                    return await tasks.gate(
                        self.session, self.execution_id, call, None, self._record, self._park
                    )
                return await self._live_tool_call(call)
            recorded = effect.call.tool
            if _tool_identity(recorded) != _tool_identity(call):
                difference = _tool_difference(recorded, call)
                raise self._diverge(f"tool call {call.id!r} differs from the recorded intent in {difference}")
            if effect.reply is not None:
                self._cursor += 1
                if effect.approval_result is not None:
                    self._decisions[call.id] = effect.approval_result[1].approval_result
                return effect.reply.result
            if tasks is not None and self._live:
                self._cursor += 1  # parallel task calls wait together: not only the trailing one
                return await tasks.gate(
                    self.session, self.execution_id, recorded, effect, self._record, self._park
                )
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

    async def recorded_report(self, call: common_pb2.ToolCall) -> common_pb2.ToolResult:
        """The recorded result of an in-harness call, consumed as its report (see the docstring)."""
        async with self._lock:
            self._check_open()
            if self._cursor >= len(self._recorded):
                raise self._diverge(
                    f"harness asked for the recorded result of in-harness tool call {call.id!r} "
                    "past the recorded effects"
                )
            effect = self._recorded[self._cursor]
            if effect.kind != "report":
                raise self._diverge(
                    f"harness asked for the recorded result of in-harness tool call {call.id!r} "
                    f"where the journal recorded {effect.kind}"
                )
            if effect.call.result.id != call.id:
                raise self._diverge(
                    f"in-harness tool call {call.id!r} does not match the recorded result "
                    f"{effect.call.result.id!r}"
                )
            self._cursor += 1
            return effect.call.result

    # -- tools ----------------------------------------------------------------------------

    def _park(self, ref: common_pb2.ApprovalRef) -> ApprovalParkedError:
        self.parked = ApprovalParkedError(ref)
        return self.parked

    async def _live_tool_call(self, call: common_pb2.ToolCall) -> common_pb2.ToolResult:
        intent = common_pb2.ToolCall()
        intent.CopyFrom(call)
        await self._record(common_pb2.Event(kind=K.EVENT_TOOL_CALL, tool=intent))
        if call.mediation == common_pb2.MEDIATION_REQUIRES_APPROVAL:
            return await self._approval_gate(intent, Effect("tool", common_pb2.Event(tool=intent)))
        return await self._execute(intent)

    async def _execute(
        self, call: common_pb2.ToolCall, *, by_mode: bool = False, **receipt: int
    ) -> common_pb2.ToolResult:
        if self._tools is None:
            raise MissingToolExecutorError(call.tool, [])  # the registry raises it for unknown tools
        verdict = await self._modes.verdict(call) if self._modes is not None else None
        refusal = (
            verdict.refusal(call, approved=bool(receipt), by_mode=by_mode) if verdict is not None else None
        )
        # The mode's refusal answers the call in place of the executor, journaled the same way.
        if refusal is not None:
            log.info("session %s: tool %s refused by the host: %s", self.session, call.tool, refusal.error)
        result = refusal if refusal is not None else await self._tools.execute(self.session, call)
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
        verdict = None
        if effect.approval_result is None and self._modes is not None:
            verdict = await self._modes.verdict(call)
        if effect.approval_request is None:
            reason = self._reasons.pop(call.id, "")
            if verdict is not None and verdict.action == GATE:
                log.info("session %s: tool %s needs approval: %s", self.session, call.tool, verdict.reason)
                reason = f"{verdict.reason}; {reason}" if reason else verdict.reason
            request = common_pb2.Event(
                kind=K.EVENT_APPROVAL_REQUEST,
                approval=common_pb2.ApprovalRequest(tool_call_id=call.id, reason=reason),
            )
            if self._gate is not None:
                self._gate.stamp_request(request)
            rec = await self._record(request)
            request_seq = rec.seq
        else:
            request_seq = effect.approval_request[0]
        if effect.approval_result is None:
            # A decision of the host's own is journaled like a person's: the mode's refusal first
            # (nothing overrides it), then a policy rule or a session grant, then the mode's approval.
            host = verdict.denial() if verdict is not None else None
            decided = host.event(self.execution_id, call.id, request_seq) if host is not None else None
            if host is not None:
                log.info("session %s: tool %s refused by the host: %s", self.session, call.tool, host.reason)
            if decided is None and self._gate is not None:
                decided = await self._gate.decide(call, self.execution_id, request_seq)
            if decided is None and verdict is not None:
                host = verdict.approval()
                decided = host.event(self.execution_id, call.id, request_seq) if host is not None else None
            if decided is not None:
                rec = await self._record(decided)
                effect.approval_result = (rec.seq, rec.event)
        if effect.approval_result is None:
            self.parked = ApprovalParkedError.at(self.execution_id, call.id, request_seq)
            raise self.parked
        decision_seq, decision_event = effect.approval_result
        decision = decision_event.approval_result
        self._decisions[call.id] = decision
        if not decision.approved:
            receipt = denied_receipt(call.id, request_seq, decision_seq)
            await self._record(common_pb2.Event(kind=K.EVENT_TOOL_RESULT, result=receipt))
            return receipt
        return await self._execute(
            call, by_mode=decided_by_mode(decision_event), request_seq=request_seq, decision_seq=decision_seq
        )


def _tool_identity(call: common_pb2.ToolCall) -> tuple[str, str, bytes, int, str, bool]:
    args = call.args.SerializeToString(deterministic=True) if call.HasField("args") else b""
    return (call.id, call.tool, args, call.mediation, call.idempotency_key, call.HasField("args"))


def _tool_difference(recorded: common_pb2.ToolCall, call: common_pb2.ToolCall) -> str:
    """Which fields of a re-issued tool call differ from its recorded intent, and how."""
    differences = []
    if recorded.id != call.id:
        differences.append(f"id ({call.id!r}, recorded {recorded.id!r})")
    if recorded.tool != call.tool:
        differences.append(f"tool ({call.tool!r}, recorded {recorded.tool!r})")
    recorded_args, args = _tool_identity(recorded), _tool_identity(call)
    if (recorded_args[2], recorded_args[5]) != (args[2], args[5]):  # the args and their presence
        mine, theirs = dict(call.args.fields), dict(recorded.args.fields)
        keys = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        differences.append(f"args (keys {', '.join(map(repr, keys))})" if keys else "args (presence)")
    if recorded.mediation != call.mediation:
        names = common_pb2.Mediation.Name
        differences.append(f"mediation ({names(call.mediation)}, recorded {names(recorded.mediation)})")
    if recorded.idempotency_key != call.idempotency_key:
        differences.append(
            f"idempotency_key ({call.idempotency_key!r}, recorded {recorded.idempotency_key!r})"
        )
    return ", ".join(differences)


def _input_mismatch(index: int, recorded: common_pb2.ModelCall, call: common_pb2.ModelCall) -> str:
    """I0's divergence, saying what differs as far as the journal knows: it keeps the model and the
    params, and only a hash of the messages, tools and tool choice."""
    head = f"model call {index}: model input hash mismatch - harness violated STATELESS_REPLAY (I0)"
    if recorded.model != call.model:
        return f"{head}: the request names model {call.model!r} where the journal recorded {recorded.model!r}"
    if dict(recorded.params) != dict(call.params):
        keys = sorted(
            k for k in set(call.params) | set(recorded.params) if call.params.get(k) != recorded.params.get(k)
        )
        return f"{head}: params {', '.join(keys)} differ from the journal's"
    return (
        f"{head}: its model and params match the journal, so its messages ({len(call.messages)}), "
        f"tools ({len(call.tools)}) or tool choice differ, which the journal keeps only as a hash; "
        "dump the request on the harness side (AGENTSESSIONS_SDK_DUMP_DIR) or compare it with the live "
        "one in agentsessions.sdk.testing.check_replay"
    )


def _quote(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
