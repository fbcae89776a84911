"""Test a harness without a host: a scripted host in the test's own event loop.

:class:`HarnessEnvironment` plays the host's part for one session, with the host's rules:
it journals each execution's events as the host would (EXECUTION_START, INPUT, MODEL_CALL with
the model-input hash, OUTPUT, USAGE, TOOL_CALL, APPROVAL_REQUEST/RESULT, TOOL_RESULT receipts,
END or ERROR), answers model calls from a script, runs "host" tools from plain functions (at
most once per idempotency key), parks on approvals until the test decides, re-drives an
interrupted execution from its recorded effects (:meth:`~HarnessEnvironment.resume`), and
replays completed executions against them (:meth:`~HarnessEnvironment.replay`) with zero model
calls, serving in-harness tools' recorded results as the host does. A divergence raises
:class:`ReplayDiverged` saying exactly what differs: unlike the journal, the environment keeps
each live model request whole, so it names the message and part.

:func:`check_replay` does the usual round in one call: run the turns live (deciding approvals
as asked), then replay them. Example, with pytest::

    async def test_my_agent_replays() -> None:
        report = await check_replay(MyAgent(), "list the files", model=[call_ls, "done"],
                                    tools={"deploy": deploy}, decide=True)
        assert report.model_calls == 0 and report.outputs == ["done"]

The idea follows Temporal's ``ActivityEnvironment``: the unit under test runs for real, and only
the outside world it talks to is scripted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from agentsessions.sdk import convert
from agentsessions.sdk.approval import denied_receipt, host_owned_receipt_field
from agentsessions.sdk.errors import (
    ApprovalParkedError,
    ExecutionCancelledError,
    SinkClosedError,
    ToolCallRejectedError,
    ToolError,
    find_park,
)
from agentsessions.sdk.execution import tool_result_of
from agentsessions.sdk.harness import Harness, Start, message_text, require_harness
from agentsessions.sdk.inputhash import model_input_hash
from agentsessions.sdk.recorded import Effect, pair_effects, recorded_completion
from agentsessions.sdk.structs import struct
from agentsessions.sdk.types import Message, ModelCall, ModelResult, Part, TextPart, ToolCall, ToolResult
from agentsessions.v1 import common_pb2, harness_pb2

K = common_pb2
SESSION = "sess-000000000000000000000test"

# What a script entry may be: a reply's text, a completion message, a whole result, or a function
# (sync or async) of the request returning one of those.
Reply = str | Message | ModelResult
ReplyFunction = Callable[[ModelCall], Reply | Awaitable[Reply]]
ModelScript = Sequence[Reply | ReplyFunction] | ReplyFunction
HostTool = Callable[[dict[str, Any]], Any]
Decide = bool | Callable[[ToolCall], bool | tuple[bool, str]]


class ReplayDiverged(AssertionError):
    """A re-run asked for something other than what the journal recorded."""


class SimulatedCrash(BaseException):
    """Unwinds a harness as if its process died (raised by ``run(..., crash_after=N)``)."""


@struct
class Outcome:
    """How one execution ended: "COMPLETED", "FAILED", "CANCELED", "PARKED" or "CRASHED"."""

    state: str
    execution_id: str
    events: list[common_pb2.Event]
    error: BaseException | None = None
    parked: common_pb2.ApprovalRef | None = None

    @property
    def outputs(self) -> list[str]:
        """The text of each OUTPUT this execution journaled."""
        return [message_text(e.message) for e in self.events if e.kind == K.EVENT_OUTPUT]

    def kinds(self) -> list[str]:
        return [common_pb2.EventKind.Name(e.kind).removeprefix("EVENT_") for e in self.events]


@struct
class ReplayReport:
    """What a replay of every completed execution did (model_calls is 0 when it succeeded)."""

    executions: int
    model_calls: int
    outputs: list[str]
    recorded_results_served: int


class HarnessEnvironment:
    """One session of a scripted host (see the module docstring).

    ``model`` answers model calls in order (or is a function of the request); ``tools`` are the
    host-run tools (CONTROLLER_MEDIATED and, once approved, REQUIRES_APPROVAL calls) by name;
    ``journal`` seeds the session with earlier events (a history written elsewhere). ``events``
    is the journal so far, ``requests`` every model request made live, ``tool_runs`` every host
    tool run, ``model_calls`` how many times the model was called. ``host_mode`` is the session's
    mode the environment announces to the harness (``Execution.host_mode``); it enforces none.
    """

    def __init__(
        self,
        harness: Harness,
        *,
        model: ModelScript = (),
        tools: Mapping[str, HostTool] | None = None,
        journal: Iterable[common_pb2.Event] = (),
        session: str = SESSION,
        host_mode: str = "",
    ) -> None:
        self.harness = require_harness(harness, "HarnessEnvironment")
        self.session = session
        self.host_mode = host_mode  # the session's mode the sinks announce (agentsessions.sdk.modes)
        self._model = model
        self._script_next = 0
        self.tools = dict(tools or {})
        self.events: list[common_pb2.Event] = list(journal)
        self.requests: list[ModelCall] = []
        self.tool_runs: list[ToolCall] = []
        self.model_calls = 0
        # Execution ids go on from the seeded journal's, so they stay unique in the session.
        self._executions = sum(1 for e in self.events if e.kind == K.EVENT_EXECUTION_START)
        self._live_requests: dict[tuple[str, int], ModelCall] = {}
        self._executor_results: dict[str, ToolResult] = {}
        self._watchers: list[tuple[int, int, asyncio.Future[common_pb2.Event]]] = []
        self._running: asyncio.Task[None] | None = None
        self._running_id = ""
        self._cancel_reason: str | None = None

    # -- turns ---------------------------------------------------------------------------

    async def run(
        self,
        *inputs: str | Message,
        config: bytes | Mapping[str, Any] = b"",
        crash_after: int | None = None,
    ) -> Outcome:
        """A new execution with these inputs (text is a user message). ``crash_after`` makes
        the N+1-th effect unwind the harness as a crash would, leaving the turn for resume()."""
        start, sink = await self.begin(*inputs, config=config, crash_after=crash_after)
        return await self._drive(start, sink)

    async def resume(self, *, crash_after: int | None = None) -> Outcome:
        """Re-drive the latest execution that did not end (after a park was decided, or a
        crash): its recorded effects are served, then it goes on live."""
        start, sink = self.begin_resume(crash_after=crash_after)
        return await self._drive(start, sink)

    async def begin(
        self,
        *inputs: str | Message,
        config: bytes | Mapping[str, Any] = b"",
        resume_from_seq: int = 0,
        crash_after: int | None = None,
    ) -> tuple[Start, ScriptedSink]:
        """Journal a new execution's EXECUTION_START and INPUTs and return its Start and a live
        sink, for driving a harness (or a host-side bridge) by hand; :meth:`finish` ends it."""
        descriptor = await self.harness.describe()
        self._executions += 1
        execution_id = f"{self._executions:016x}"
        raw = json.dumps(dict(config)).encode() if isinstance(config, Mapping) else config
        messages = [convert.message_to_proto(Message.user(m) if isinstance(m, str) else m) for m in inputs]
        history = list(self.events)
        self._append(
            common_pb2.Event(
                execution_id=execution_id,
                kind=K.EVENT_EXECUTION_START,
                execution_start=common_pb2.ExecutionStart(
                    config=raw,
                    resume_from_seq=resume_from_seq,
                    input_count=len(messages),
                    harness=descriptor.id,
                    harness_version=descriptor.version,
                ),
            )
        )
        for message in messages:
            self._append(common_pb2.Event(execution_id=execution_id, kind=K.EVENT_INPUT, message=message))
        start = Start(
            session=self.session,
            execution_id=execution_id,
            inputs=messages,
            history=history,
            config=raw,
            resume_from_seq=resume_from_seq,
        )
        return start, ScriptedSink(self, execution_id, [], live=True, crash_after=crash_after)

    def begin_resume(self, *, crash_after: int | None = None) -> tuple[Start, ScriptedSink]:
        """The Start and a recovery sink (recorded effects first) for the latest execution that
        did not end; :meth:`finish` ends it."""
        execution_id = self._latest_unfinished()
        if execution_id is None:
            raise RuntimeError("no execution is waiting to be resumed")
        pending = self.pending_approval()
        if pending is not None:
            raise RuntimeError(
                f"tool call {pending.tool_call_id!r} awaits a decision: approve() or deny() first"
            )
        effects = self._effects(execution_id)
        return self.start_of(execution_id), ScriptedSink(
            self, execution_id, effects, live=True, crash_after=crash_after
        )

    async def replay(self) -> ReplayReport:
        """Re-run every completed execution against its recorded effects: nothing is written,
        the model is not called, divergence raises ReplayDiverged."""
        calls_before = self.model_calls
        outputs: list[str] = []
        executions = 0
        served = 0
        for execution_id in self._completed():
            start = self.start_of(execution_id)
            effects = self._effects(execution_id)
            sink = ScriptedSink(self, execution_id, effects, live=False)
            try:
                await self.harness.run(start, sink)
            except ReplayDiverged:
                raise
            except asyncio.CancelledError as exc:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise  # the test's own task was cancelled (its timeout, say): not the harness
                raise ReplayDiverged(
                    f"execution {execution_id}: the harness failed on replay: {exc!r}"
                ) from exc
            except Exception as exc:
                raise ReplayDiverged(
                    f"execution {execution_id}: the harness failed on replay: {exc!r}"
                ) from exc
            finally:
                sink.closed = True
            if sink.cursor != len(effects):
                left = len(effects) - sink.cursor
                raise ReplayDiverged(
                    f"execution {execution_id}: the harness left {left} recorded effects unconsumed "
                    f"(next: {effects[sink.cursor].kind})"
                )
            executions += 1
            served += sink.results_served
            for effect in effects:
                if effect.kind == "model" and effect.reply is not None:
                    outputs.append(message_text(effect.reply.message))
                elif effect.kind == "output":
                    outputs.append(message_text(effect.call.message))
        return ReplayReport(executions, self.model_calls - calls_before, outputs, served)

    # -- decisions and cancel --------------------------------------------------------------

    def pending_approval(self) -> common_pb2.ApprovalRef | None:
        """The approval request that awaits a decision, if any."""
        decided = {
            (e.execution_id, e.approval_result.tool_call_id)
            for e in self.events
            if e.kind == K.EVENT_APPROVAL_RESULT
        }
        for index, event in enumerate(self.events):
            if (
                event.kind == K.EVENT_APPROVAL_REQUEST
                and (event.execution_id, event.approval.tool_call_id) not in decided
            ):
                return common_pb2.ApprovalRef(
                    execution_id=event.execution_id,
                    tool_call_id=event.approval.tool_call_id,
                    request_seq=index + 1,
                )
        return None

    def approval_reason(self) -> str:
        """The reason the harness gave the pending (or else the last) approval request."""
        requests = [e for e in self.events if e.kind == K.EVENT_APPROVAL_REQUEST]
        return requests[-1].approval.reason if requests else ""

    def approve(self, reason: str = "", *, approved: bool = True) -> None:
        """Record a decision for the pending approval request."""
        pending = self.pending_approval()
        if pending is None:
            raise RuntimeError("no approval request is pending")
        self._append(
            common_pb2.Event(
                execution_id=pending.execution_id,
                kind=K.EVENT_APPROVAL_RESULT,
                approval_result=common_pb2.ApprovalResult(
                    tool_call_id=pending.tool_call_id,
                    approved=approved,
                    reason=reason,
                    request_seq=pending.request_seq,
                ),
            )
        )

    def deny(self, reason: str = "") -> None:
        self.approve(reason, approved=False)

    async def cancel(self, reason: str = "cancelled by the test") -> None:
        """Cancel the running execution as the host does: the harness's cancel hook, when it has
        one and says the run ends by itself, else the run is cancelled as a task."""
        task = self._running
        if task is None or task.done():
            return
        self._cancel_reason = reason
        hook = getattr(self.harness, "cancel", None)
        if callable(hook) and await hook(self._running_id, reason):
            return
        task.cancel()

    # -- internals -----------------------------------------------------------------------

    def _append(self, event: common_pb2.Event) -> int:
        self.events.append(event)
        for kind, after, waiter in self._watchers:
            if event.kind == kind and len(self.events) > after and not waiter.done():
                waiter.set_result(event)
        return len(self.events)

    async def journaled(self, kind: int, *, after: int = 0) -> common_pb2.Event:
        """Wait until an event of ``kind`` is journaled at or after index ``after``, for a test
        that must act while an execution runs (bound it: ``async with asyncio.timeout(...)``)."""
        for event in self.events[after:]:
            if event.kind == kind:
                return event
        waiter: asyncio.Future[common_pb2.Event] = asyncio.get_running_loop().create_future()
        watch = (kind, after, waiter)
        self._watchers.append(watch)
        try:
            return await waiter
        finally:
            self._watchers.remove(watch)

    async def _drive(self, start: Start, sink: ScriptedSink) -> Outcome:
        self._cancel_reason = None
        self._running_id = start.execution_id
        task = asyncio.ensure_future(self.harness.run(start, sink))
        self._running = task
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            task.cancel()  # the caller left: the harness's run does not go on without it
            raise
        finally:
            self._running = None
        return self.finish(start, sink, asyncio.CancelledError() if task.cancelled() else task.exception())

    def finish(self, start: Start, sink: ScriptedSink, error: BaseException | None) -> Outcome:
        """End an execution the way the host does once its harness returned (``error`` None) or
        raised: END (COMPLETED or CANCELED), ERROR, nothing after a park or a crash."""
        sink.closed = True
        execution_id = start.execution_id

        def ended(state: str, description: str = "") -> Outcome:
            end = common_pb2.HarnessEnd(state=state)
            if description:
                end.error.description = description
            self._append(common_pb2.Event(execution_id=execution_id, kind=K.EVENT_END, end=end))
            return self._outcome(state, execution_id, error)

        if isinstance(error, SimulatedCrash):
            return self._outcome("CRASHED", execution_id, error)
        if self._cancel_reason is not None:
            return ended("CANCELED", self._cancel_reason)
        if sink.parked is not None and (error is None or find_park(error) is sink.parked):
            outcome = self._outcome("PARKED", execution_id, None)
            outcome.parked = sink.parked.ref
            return outcome
        if isinstance(error, ReplayDiverged):
            raise error
        if error is None and sink.cursor != len(sink.effects):
            left = len(sink.effects) - sink.cursor
            raise ReplayDiverged(
                f"execution {execution_id}: the harness left {left} recorded effects unconsumed"
            )
        if error is not None:
            self._append(
                common_pb2.Event(
                    execution_id=execution_id,
                    kind=K.EVENT_ERROR,
                    error=common_pb2.Error(description=str(error)),
                )
            )
            return self._outcome("FAILED", execution_id, error)
        return ended("COMPLETED")

    def _outcome(self, state: str, execution_id: str, error: BaseException | None) -> Outcome:
        mine = [e for e in self.events if e.execution_id == execution_id]
        return Outcome(state, execution_id, mine, error)

    def _starts(self) -> list[tuple[int, common_pb2.Event]]:
        return [(i, e) for i, e in enumerate(self.events) if e.kind == K.EVENT_EXECUTION_START]

    def start_of(self, execution_id: str) -> Start:
        for index, event in self._starts():
            if event.execution_id == execution_id:
                inputs = [
                    e.message
                    for e in self.events
                    if e.execution_id == execution_id and e.kind == K.EVENT_INPUT
                ]
                return Start(
                    session=self.session,
                    execution_id=execution_id,
                    inputs=inputs,
                    history=self.events[:index],
                    config=event.execution_start.config,
                )
        raise RuntimeError(f"no execution {execution_id!r}")

    def _end_state(self, execution_id: str) -> str | None:
        for event in self.events:
            if event.execution_id == execution_id and event.kind == K.EVENT_END:
                return event.end.state
        return None

    def _completed(self) -> list[str]:
        return [e.execution_id for _, e in self._starts() if self._end_state(e.execution_id) == "COMPLETED"]

    def _latest_unfinished(self) -> str | None:
        starts = self._starts()
        if not starts:
            return None
        execution_id = starts[-1][1].execution_id
        return execution_id if self._end_state(execution_id) is None else None

    def _effects(self, execution_id: str) -> list[Effect]:
        """The execution's recorded effects, paired as the host pairs them."""
        records = ((i + 1, e) for i, e in enumerate(self.events) if e.execution_id == execution_id)
        return pair_effects(records)[0]

    async def _next_reply(self, call: ModelCall) -> ModelResult:
        script = self._model
        if callable(script):
            entry: Reply | ReplyFunction = script
        else:
            if self._script_next >= len(script):
                raise AssertionError(
                    f"the scripted model has {len(script)} replies; the harness asked for another "
                    f"(model call {self.model_calls + 1})"
                )
            entry = script[self._script_next]
            self._script_next += 1
        reply = entry(call) if callable(entry) else entry
        if inspect.isawaitable(reply):
            reply = await reply
        if isinstance(reply, str):
            return ModelResult(Message.assistant(reply))
        if isinstance(reply, Message):
            return ModelResult(reply)
        return reply

    async def _run_host_tool(self, call: common_pb2.ToolCall) -> common_pb2.ToolResult:
        done = self._executor_results.get(call.idempotency_key)
        if done is None:
            native = convert.tool_call_from_proto(call)
            tool = self.tools.get(call.tool)
            if tool is None:
                known = ", ".join(sorted(self.tools)) or "none"
                raise ToolCallRejectedError(f"no host tool {call.tool!r} is configured (tools: {known})")
            self.tool_runs.append(native)
            try:
                value = tool(dict(native.args))
                if inspect.isawaitable(value):
                    value = await value
                done = tool_result_of(call.id, value)
            except ToolError as exc:
                done = ToolResult.failure(call.id, str(exc))
            self._executor_results[call.idempotency_key] = done
        return convert.tool_result_to_proto(dataclasses.replace(done, id=call.id))


class ScriptedSink:
    """The environment's sink for one run of an execution (live, recovery or replay)."""

    def __init__(
        self,
        env: HarnessEnvironment,
        execution_id: str,
        effects: list[Effect],
        *,
        live: bool,
        crash_after: int | None = None,
    ) -> None:
        self.env = env
        self.execution_id = execution_id
        self.effects = effects
        self.cursor = 0
        self.live = live
        self.recorded_effects = len(effects)
        self.run_mode = "replay" if not live else ("recovery" if effects else "live")
        self.host_mode = env.host_mode
        self.closed = False
        self.parked: ApprovalParkedError | None = None
        self.results_served = 0
        self._crash_after = crash_after
        self._live_effects = 0
        self._model_index = 0
        self._ids: set[str] = {e.call.tool.id for e in effects if e.kind == "tool"}
        self._reasons: dict[str, str] = {}
        self._decisions: dict[str, common_pb2.ApprovalResult] = {}
        self._last_usage: common_pb2.Usage | None = None
        self._lock = asyncio.Lock()

    # -- helpers -------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.parked is not None:
            raise self.parked
        if self.closed:
            raise SinkClosedError("the execution has ended; the sink is closed")
        if self.env._cancel_reason is not None:
            raise ExecutionCancelledError(f"execution cancelled by host: {self.env._cancel_reason}")

    def _diverge(self, why: str) -> ReplayDiverged:
        return ReplayDiverged(f"execution {self.execution_id}: {why}")

    def _next(self, wanted: str) -> Effect | None:
        if self.cursor >= len(self.effects):
            if not self.live:
                raise self._diverge(f"the harness asked for an unrecorded {wanted} during replay")
            return None
        effect = self.effects[self.cursor]
        if effect.kind != wanted:
            raise self._diverge(
                f"the harness asked for a {wanted} where the journal recorded a {effect.kind}"
            )
        return effect

    def _record(self, event: common_pb2.Event) -> int:
        event.execution_id = self.execution_id
        return self.env._append(event)

    def _live_effect(self) -> None:
        if self._crash_after is not None and self._live_effects >= self._crash_after:
            raise SimulatedCrash(f"simulated crash after {self._crash_after} live effects")
        self._live_effects += 1

    # -- EventSink -----------------------------------------------------------------------

    async def model(self, call: common_pb2.ModelCall) -> harness_pb2.ModelResult:
        async with self._lock:
            self._check_open()
            request = convert.model_call_from_proto(call)
            input_hash = model_input_hash(call)
            self._model_index += 1
            key = (self.execution_id, self._model_index)
            effect = self._next("model")
            if effect is not None:
                if effect.call.model.input_hash != input_hash:
                    live = self.env._live_requests.get(key)
                    detail = difference(live, request) if live is not None else "its input hash differs"
                    raise self._diverge(f"model call {self._model_index} differs from the live one: {detail}")
                if effect.reply is not None:
                    self.cursor += 1
                    served = recorded_completion(effect.reply, effect.usage, call.id)
                    self._last_usage = None if effect.usage is None else served.usage
                    return served
                if self.cursor != len(self.effects) - 1 or not self.live:
                    raise self._diverge("recorded completion missing")
                self.cursor += 1
            else:
                self._live_effect()
                self.env._live_requests[key] = request
                intent = common_pb2.ModelCall(
                    model=call.model, input_hash=input_hash, id=f"m{len(self.env.events):015d}"
                )
                intent.params.update(call.params)
                self._record(common_pb2.Event(kind=K.EVENT_MODEL_CALL, model=intent))
            self.env.requests.append(request)
            self.env.model_calls += 1
            result = convert.model_result_to_proto(await self.env._next_reply(request))
            self._record(common_pb2.Event(kind=K.EVENT_OUTPUT, message=result.message))
            reply = harness_pb2.ModelResult(message=result.message, model_call_id=call.id)
            self._last_usage = None
            if result.HasField("usage"):
                reply.usage.CopyFrom(result.usage)
                self._record(common_pb2.Event(kind=K.EVENT_USAGE, usage=reply.usage))
                self._last_usage = reply.usage
            return reply

    async def output(self, text: str) -> None:
        async with self._lock:
            self._check_open()
            message = convert.message_to_proto(Message.assistant(text))
            effect = self._next("output")
            if effect is not None:
                if effect.call.message != message:
                    recorded = message_text(effect.call.message)
                    raise self._diverge(f"output {text!r} differs from the recorded {recorded!r}")
                self.cursor += 1
                return
            self._live_effect()
            self._record(common_pb2.Event(kind=K.EVENT_OUTPUT, message=message))

    async def report(self, result: common_pb2.ToolResult) -> None:
        async with self._lock:
            self._check_open()
            owned = host_owned_receipt_field(result)
            if owned is not None:
                raise ToolCallRejectedError(f"tool result {result.id!r} carries host-owned {owned}")
            effect = self._next("report")
            if effect is not None:
                if effect.call.result.id != result.id:
                    raise self._diverge(
                        f"reported result {result.id!r} does not match the recorded {effect.call.result.id!r}"
                    )
                self.cursor += 1
                return
            self._live_effect()
            self._record(common_pb2.Event(kind=K.EVENT_TOOL_RESULT, result=result))

    async def usage(self, usage: common_pb2.Usage) -> None:
        async with self._lock:
            self._check_open()
            if self._last_usage is not None and usage == self._last_usage:
                self._last_usage = None
                return
            if self.live:
                self._record(common_pb2.Event(kind=K.EVENT_USAGE, usage=usage))

    async def tool_call(self, call: common_pb2.ToolCall) -> common_pb2.ToolResult:
        async with self._lock:
            self._check_open()
            _check_host_call(call)
            effect = self._next("tool")
            if effect is None:
                if call.id in self._ids:
                    raise ToolCallRejectedError(f"tool call id {call.id!r} is reused in this execution")
                self._live_effect()
                self._ids.add(call.id)
                intent = common_pb2.ToolCall()
                intent.CopyFrom(call)
                self._record(common_pb2.Event(kind=K.EVENT_TOOL_CALL, tool=intent))
                effect = Effect("tool", common_pb2.Event(tool=intent))
                self.effects.append(effect)
            else:
                recorded = convert.tool_call_from_proto(effect.call.tool)
                replayed = convert.tool_call_from_proto(call)
                if recorded != replayed:
                    changed = _fields(recorded, replayed)
                    raise self._diverge(f"tool call {call.id!r} differs from the recorded intent: {changed}")
                if effect.reply is not None:
                    self.cursor += 1
                    if effect.approval_result is not None:
                        self._decisions[call.id] = effect.approval_result[1].approval_result
                    return effect.reply.result
                if not self.live:
                    raise self._diverge(f"tool call {call.id!r} has no recorded result")
            self.cursor = max(self.cursor, self.effects.index(effect) + 1)
            if call.mediation != K.MEDIATION_REQUIRES_APPROVAL:
                result = await self.env._run_host_tool(call)
                self._record(common_pb2.Event(kind=K.EVENT_TOOL_RESULT, result=result))
                return result
            return await self._gate(call, effect)

    async def _gate(self, call: common_pb2.ToolCall, effect: Effect) -> common_pb2.ToolResult:
        if effect.approval_request is None:
            reason = self._reasons.pop(call.id, "")
            request = common_pb2.Event(
                kind=K.EVENT_APPROVAL_REQUEST,
                approval=common_pb2.ApprovalRequest(tool_call_id=call.id, reason=reason),
            )
            effect.approval_request = (self._record(request), request)
        request_seq = effect.approval_request[0]
        if effect.approval_result is None:
            self.parked = ApprovalParkedError.at(self.execution_id, call.id, request_seq)
            raise self.parked
        decision_seq, decision_event = effect.approval_result
        self._decisions[call.id] = decision_event.approval_result
        if decision_event.approval_result.approved:
            result = await self.env._run_host_tool(call)
            result.code = K.ToolResult.EXECUTOR_ERROR if result.is_error else K.ToolResult.CODE_UNSPECIFIED
            result.approval_request_seq = request_seq
            result.approval_decision_seq = decision_seq
        else:
            result = denied_receipt(call.id, request_seq, decision_seq)
        self._record(common_pb2.Event(kind=K.EVENT_TOOL_RESULT, result=result))
        return result

    # -- the optional surfaces -----------------------------------------------------------

    async def recorded_report(self, call: common_pb2.ToolCall) -> common_pb2.ToolResult:
        async with self._lock:
            self._check_open()
            if self.cursor >= len(self.effects) or self.effects[self.cursor].kind != "report":
                found = self.effects[self.cursor].kind if self.cursor < len(self.effects) else "nothing"
                raise self._diverge(
                    f"the harness asked for the recorded result of in-harness tool call {call.id!r} "
                    f"where the journal recorded {found}"
                )
            effect = self.effects[self.cursor]
            if effect.call.result.id != call.id:
                recorded_id = effect.call.result.id
                raise self._diverge(
                    f"in-harness tool call {call.id!r} does not match the recorded result {recorded_id!r}"
                )
            self.cursor += 1
            self.results_served += 1
            return effect.call.result

    def approval_reason(self, tool_call_id: str, reason: str) -> None:
        if reason:
            self._reasons[tool_call_id] = reason

    def approval_decision(self, tool_call_id: str) -> common_pb2.ApprovalResult | None:
        return self._decisions.get(tool_call_id)


def _check_host_call(call: common_pb2.ToolCall) -> None:
    if call.mediation not in (K.MEDIATION_CONTROLLER_MEDIATED, K.MEDIATION_REQUIRES_APPROVAL):
        mediation = common_pb2.Mediation.Name(call.mediation)
        raise ToolCallRejectedError(
            f"tool call {call.id!r}: mediation {mediation} does not ask the host to run it"
        )
    if not call.id:
        raise ToolCallRejectedError("tool_call.id: required for a host-run call")
    if not call.idempotency_key:
        raise ToolCallRejectedError(f"tool call {call.id!r}: idempotency_key is required for a host-run call")
    if call.HasField("args"):
        convert.check_json(convert.dict_from_struct(call.args), f"tool call {call.id!r} args")


def _fields(recorded: Any, replayed: Any) -> str:
    """The fields of two dataclass values that differ, with both values."""
    parts = []
    for f in dataclasses.fields(recorded):
        a, b = getattr(recorded, f.name), getattr(replayed, f.name)
        if a != b:
            parts.append(f"{f.name} is {_short(b)} where the journal has {_short(a)}")
    return "; ".join(parts)


def _short(value: object, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def difference(live: ModelCall, replayed: ModelCall) -> str:
    """What differs between a live model request and its re-issue: the field, and for messages
    the first message and part that differ, with both values."""
    if live.model != replayed.model:
        return f"model is {replayed.model!r}, was {live.model!r}"
    if live.params != replayed.params:
        return f"params are {replayed.params!r}, were {live.params!r}"
    if live.tools != replayed.tools:
        return f"tools differ: {_sequence(live.tools, replayed.tools, 'tool')}"
    if live.tool_choice != replayed.tool_choice:
        return f"tool_choice is {replayed.tool_choice!r}, was {live.tool_choice!r}"
    return f"messages differ: {_sequence(live.messages, replayed.messages, 'message')}"


def _sequence(live: Sequence[Any], replayed: Sequence[Any], what: str) -> str:
    for index, (a, b) in enumerate(zip(live, replayed, strict=False)):
        if a == b:
            continue
        if isinstance(a, Message) and isinstance(b, Message):
            if a.role != b.role:
                return f"{what} {index} has role {b.role!r}, had {a.role!r}"
            return f"{what} {index} ({a.role}): {_parts(a.parts, b.parts)}"
        return f"{what} {index} is {_short(b)}, was {_short(a)}"
    return f"there are {len(replayed)} {what}s, there were {len(live)}"


def _parts(live: Sequence[Part], replayed: Sequence[Part]) -> str:
    for index, (a, b) in enumerate(zip(live, replayed, strict=False)):
        if a == b:
            continue
        if isinstance(a, TextPart) and isinstance(b, TextPart):
            old, new = a.text, b.text
            at = next(
                (i for i, (x, y) in enumerate(zip(old, new, strict=False)) if x != y), min(len(old), len(new))
            )
            now, was = _short(new[at : at + 40]), _short(old[at : at + 40])
            return f"part {index} text differs from character {at}: {now}, was {was}"
        return f"part {index} is {_short(b)}, was {_short(a)}"
    return f"it has {len(replayed)} parts, had {len(live)}"


async def check_replay(
    harness: Harness,
    *turns: str | Message | Iterable[str | Message],
    model: ModelScript = (),
    tools: Mapping[str, HostTool] | None = None,
    decide: Decide = True,
    config: bytes | Mapping[str, Any] = b"",
) -> ReplayReport:
    """Run ``turns`` live (each a text, a message or several inputs), deciding every approval
    with ``decide`` (True approves, False denies, or a function of the call returning a bool or
    (bool, reason)) and resuming, then replay them all. Raises AssertionError when a turn fails
    live and ReplayDiverged when the replay asks for anything else than the live run did."""
    env = HarnessEnvironment(harness, model=model, tools=tools)
    for turn in turns:
        inputs = [turn] if isinstance(turn, (str, Message)) else list(turn)
        outcome = await env.run(*inputs, config=config)
        while outcome.state == "PARKED":
            assert outcome.parked is not None
            call = next(
                convert.tool_call_from_proto(e.tool)
                for e in outcome.events
                if e.kind == K.EVENT_TOOL_CALL and e.tool.id == outcome.parked.tool_call_id
            )
            verdict = decide(call) if callable(decide) else decide
            approved, reason = verdict if isinstance(verdict, tuple) else (verdict, "")
            env.approve(reason, approved=approved)
            outcome = await env.resume()
        if outcome.state != "COMPLETED":
            raise AssertionError(f"turn {turn!r} ended {outcome.state} live: {outcome.error!r}")
    return await env.replay()


__all__ = [
    "HarnessEnvironment",
    "Outcome",
    "ReplayDiverged",
    "ReplayReport",
    "ScriptedSink",
    "SimulatedCrash",
    "check_replay",
    "difference",
]
