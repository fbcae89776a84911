"""One execution in native values: the handle a harness's code (or a framework adapter) works with.

:class:`Execution` wraps the protocol-level ``Start`` and ``EventSink`` and adds the rules a
harness author would otherwise have to learn from the host's internals:

- **Values, not protobuf.** Messages, tool calls and results are :mod:`agentsessions.sdk.types`
  values; they are converted at the sink (:mod:`agentsessions.sdk.convert`).
- **Ids that replay.** A completion's tool calls get settled ids, and host-run calls derived
  idempotency keys (:mod:`agentsessions.sdk.callids`), so a re-run issues identical calls.
- **Completion order.** The tool calls of one completion reach the host in the completion's
  order, whatever order the framework runs them in (pydantic-ai, for one, starts them all at
  once): each call waits for the calls before it in the completion. A call the framework never
  makes is given up on after the event loop has had :data:`ARRIVAL_YIELDS` turns to deliver it
  (no clock involved: the order does not depend on timing). In-harness tools of one completion
  therefore run one after another.
- **In-harness tools run once.** On ``agentsessions replay``, and on Resume of a turn whose
  result is already recorded, an IN_HARNESS_REPORTED call within the recorded effects is
  answered with the recorded result and the tool does not run (see
  :mod:`agentsessions.sdk.extensions`; with a host that does not offer it, tools re-run as in v1).
- **Approvals.** ``call_tool(..., reason=...)`` gives the request a reason; a decided call's
  result carries the decision and its reason (``result.decision``). A park propagates as
  :class:`~agentsessions.sdk.errors.ApprovalParkedError`, and stays a park when a framework wraps
  it in another exception. Once a call parked, every later call of the execution raises that
  park before it runs anything: a concurrent in-harness tool of the same completion must not
  have a side effect the journal never records.
- **Usage** from the provider is journaled by the host; :meth:`usage` is for other accounting.
- **Dumps.** With ``AGENTSESSIONS_SDK_DUMP_DIR`` set, every model request is written there as
  JSON (with its input hash) before it is sent, to compare a replay's request with the live one.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from agentsessions.sdk import convert
from agentsessions.sdk.callids import CallIds, idempotency_key
from agentsessions.sdk.errors import ApprovalParkedError, ExecutionCancelledError, ToolError, find_park
from agentsessions.sdk.extensions import LIVE
from agentsessions.sdk.harness import EventSink, Start, approval_details, recorded_results
from agentsessions.sdk.inputhash import model_input_hash
from agentsessions.sdk.structs import replace
from agentsessions.sdk.types import (
    HarnessDescriptor,
    Mediation,
    Message,
    ModelCall,
    ModelResult,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolChoiceMode,
    ToolDefinition,
    ToolResult,
    Usage,
)
from agentsessions.v1 import common_pb2

# How many event-loop turns a call waits for an earlier call of its completion to show up.
ARRIVAL_YIELDS = 50
DUMP_DIR_ENV = "AGENTSESSIONS_SDK_DUMP_DIR"

# An in-harness tool: takes the call's args, returns a ToolResult, a dict (structured output), a
# str (text content), None or another JSON value; may be async. Raise ToolError to report a failure.
ToolFunction = Callable[[dict[str, Any]], Any]
_CHOICES = {"auto": ToolChoiceMode.AUTO, "none": ToolChoiceMode.NONE, "required": ToolChoiceMode.REQUIRED}


class _Batch:
    """The tool calls of one completion, let through in the completion's order."""

    def __init__(self, ids: Sequence[str]) -> None:
        self.position = {call_id: index for index, call_id in enumerate(ids)}
        self._ids = list(ids)
        self._next = 0
        self._arrived: set[int] = set()
        self._waiters: list[asyncio.Future[None]] = []

    def arrive(self, position: int) -> None:
        self._arrived.add(position)

    async def turn(self, position: int) -> None:
        """Wait until every earlier call has had its effect (or never came)."""
        idle = 0
        while self._next < position:
            if self._next in self._arrived:
                idle = 0
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                await waiter
            elif idle >= ARRIVAL_YIELDS:
                self._next += 1  # the framework did not make that call (yet): go on without it
            else:
                idle += 1
                await asyncio.sleep(0)

    def finish(self, position: int) -> None:
        if self._next <= position:
            self._next = position + 1
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


class Execution:
    """One execution of a harness: its inputs and history, and the effects it may have."""

    def __init__(self, start: Start, sink: EventSink, *, descriptor: HarnessDescriptor | None = None) -> None:
        self.start = start
        self.sink = sink
        self.descriptor = descriptor
        self._ids = CallIds(start.execution_id)
        self._recorded_results = recorded_results(sink)
        self._recorded = self._recorded_results.recorded_effects if self._recorded_results is not None else 0
        self._details = approval_details(sink)
        self._issued = 0  # effects issued through the sink so far, in order
        self._batch: _Batch | None = None
        self._inputs: list[Message] | None = None
        self._cancel_reason: str | None = None
        self._cancelled: asyncio.Event | None = None
        self._parked: ApprovalParkedError | None = None
        self._dump_dir = os.environ.get(DUMP_DIR_ENV, "")

    # -- what the execution is -------------------------------------------------------------

    @property
    def session(self) -> str:
        return self.start.session

    @property
    def execution_id(self) -> str:
        return self.start.execution_id

    @property
    def run_mode(self) -> str:
        """ "live", "recovery" (Resume re-drives a recorded prefix) or "replay" (nothing new may
        happen); as the host announced it ("live" from a host that announces nothing)."""
        return self._recorded_results.run_mode if self._recorded_results is not None else LIVE

    @property
    def host_mode(self) -> str:
        """The session's mode as the host announced it (``agentsessions.sdk.modes``: "plan",
        "ask-before", "allow-edits" or "auto"), "" when it has none or the host announces none.
        The same on every run of the execution; the host enforces it on the calls it runs."""
        mode = getattr(self.sink, "host_mode", "")
        return mode if isinstance(mode, str) else ""

    @property
    def inputs(self) -> list[Message]:
        """This execution's inputs."""
        if self._inputs is None:
            self._inputs = convert.messages_from_proto(self.start.inputs)
        return list(self._inputs)

    def input_text(self) -> str:
        """The text of the last input ("" without inputs)."""
        return self.start.last_input_text()

    def conversation(self, *, inputs: bool = True) -> list[Message]:
        """The prior conversation rebuilt from the journal, tool exchanges included, then this
        execution's inputs (see :meth:`agentsessions.sdk.Start.conversation`)."""
        return self.start.conversation(inputs=inputs)

    def config_json(self) -> dict[str, Any]:
        """The execution config as a JSON object ({} when empty); ValueError when it is not one."""
        if not self.start.config:
            return {}
        try:
            decoded = json.loads(self.start.config)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"execution config is not JSON: {exc}") from None
        if not isinstance(decoded, dict):
            raise ValueError("execution config must be a JSON object")
        return decoded

    # -- cancellation --------------------------------------------------------------------

    @property
    def cancel_reason(self) -> str | None:
        """Why the host cancelled the execution (None while it is not cancelled)."""
        return self._cancel_reason

    def cancel(self, reason: str) -> None:
        """Mark the execution cancelled (the harness's cancel hook calls this): every later
        effect raises ExecutionCancelledError, and :meth:`cancelled` returns."""
        if self._cancel_reason is None:
            self._cancel_reason = reason
            if self._cancelled is not None:
                self._cancelled.set()

    async def cancelled(self) -> str:
        """Wait until the host cancels the execution; returns the reason. Bound it yourself
        (``asyncio.timeout``): a turn that is never cancelled never returns from here."""
        if self._cancel_reason is None:
            if self._cancelled is None:
                self._cancelled = asyncio.Event()
            await self._cancelled.wait()
        assert self._cancel_reason is not None
        return self._cancel_reason

    def _check_cancel(self) -> None:
        if self._cancel_reason is not None:
            reason = self._cancel_reason
            raise ExecutionCancelledError(
                f"execution cancelled by host: {reason}" if reason else "execution cancelled by host"
            )

    # -- effects -------------------------------------------------------------------------

    async def model(
        self,
        messages: Sequence[Message] | ModelCall,
        *,
        model: str = "",
        tools: Sequence[ToolDefinition] = (),
        tool_choice: ToolChoice | str | None = None,
        params: Mapping[str, str] | None = None,
    ) -> ModelResult:
        """Ask the host's model. Give the messages (and the other fields), or a whole ModelCall.
        ``tool_choice`` may be "auto", "none", "required" or a tool's name. The completion's tool
        calls come back with their ids settled (use them when answering)."""
        self._check_cancel()
        if isinstance(messages, ModelCall):
            call = messages
        else:
            call = ModelCall(
                messages=tuple(messages),
                model=model,
                tools=tuple(tools),
                tool_choice=_tool_choice(tool_choice),
                params=dict(params or {}),
            )
        wire = convert.model_call_to_proto(call)
        if self._dump_dir:
            await self._dump(wire)
        self._issued += 1
        result = convert.model_result_from_proto(await self.sink.model(wire))
        message = self._ids.completion(result.message)
        calls = message.tool_calls
        self._batch = _Batch([c.id for c in calls]) if calls else None
        return ModelResult(message=message, usage=result.usage)

    async def output(self, text: str) -> None:
        """Record assistant text produced without a model call."""
        self._check_cancel()
        self._issued += 1
        await self.sink.output(text)

    async def usage(self, usage: Usage) -> None:
        """Record token accounting the host does not already have (model calls' usage it has)."""
        self._check_cancel()
        await self.sink.usage(convert.usage_to_proto(usage))

    async def report(self, result: ToolResult) -> None:
        """Record the result of a tool the harness ran itself, as is (``call_tool`` does this
        for you, in order, and only when the result is not recorded already)."""
        self._check_cancel()
        self._issued += 1
        await self.sink.report(convert.tool_result_to_proto(result))

    async def call_tool(
        self, call: ToolCall, run: ToolFunction | None = None, *, reason: str = ""
    ) -> ToolResult:
        """Make a tool call, with the mediation it asks for: the call's own, else the one the
        descriptor declares for its tool, else IN_HARNESS_REPORTED when ``run`` is given and
        CONTROLLER_MEDIATED when it is not. An in-harness call runs ``run(args)`` and reports the
        result (or, within a replay's recorded effects, returns the recorded one without
        running it); a host-run call goes to the host (``reason``: why it needs approval).
        The result's id is the call's."""
        self._check_cancel()
        mediation = self._mediation(call, run)
        call_id = call.id or self._ids.direct()
        batch = self._batch if self._batch is not None and call_id in self._batch.position else None
        position = batch.position[call_id] if batch is not None else 0
        if batch is not None:
            batch.arrive(position)
        try:
            if batch is not None:
                await batch.turn(position)
            self._check_cancel()
            if self._parked is not None:
                # An earlier call of this execution parked: the turn is unwinding, and a tool run
                # now would be a side effect the journal never records (and recovery repeats).
                raise self._parked
            if mediation == Mediation.IN_HARNESS_REPORTED:
                if run is None:
                    raise TypeError(f"tool call {call_id!r} ({call.name}) runs in the harness: pass run=")
                return await self._reported(replace(call, id=call_id, mediation=mediation), run)
            key = call.idempotency_key or idempotency_key(self.execution_id, call_id)
            wire = convert.tool_call_to_proto(
                replace(call, id=call_id, mediation=mediation, idempotency_key=key)
            )
            approval = mediation == Mediation.REQUIRES_APPROVAL
            if approval and reason and self._details is not None:
                self._details.approval_reason(call_id, reason)
            self._issued += 1
            result = await self.sink.tool_call(wire)
            decision = (
                self._details.approval_decision(call_id) if approval and self._details is not None else None
            )
            return convert.tool_result_from_proto(result, decision)
        except BaseException as exc:
            park = find_park(exc)
            if park is not None and self._parked is None:
                self._parked = park  # before finish() lets the next call of the completion go
            raise
        finally:
            if batch is not None:
                batch.finish(position)

    async def run_tools(self, result: ModelResult, tools: Mapping[str, ToolFunction]) -> Message:
        """Make every tool call of a completion, in order, and return the role "tool" message
        answering them. ``tools`` are the in-harness tools by name; a call to a tool not among
        them goes to the host when the descriptor declares it host-run, and otherwise gets a
        reported failure the model can read."""
        answers: list[ToolResult] = []
        for call in result.tool_calls:
            run = tools.get(call.name)
            declared = self.descriptor.mediation(call.name) if self.descriptor is not None else None
            if run is None and declared in (None, Mediation.IN_HARNESS_REPORTED):
                known = ", ".join(sorted(tools)) or "none"
                answers.append(
                    await self.call_tool(
                        call, _unavailable(f"tool {call.name!r} is not available (tools: {known})")
                    )
                )
            else:
                answers.append(await self.call_tool(call, run))
        return Message.tool(*answers)

    # -- internals -----------------------------------------------------------------------

    def _mediation(self, call: ToolCall, run: ToolFunction | None) -> Mediation:
        if call.mediation != Mediation.UNSPECIFIED:
            return call.mediation
        declared = self.descriptor.mediation(call.name) if self.descriptor is not None else None
        if declared is not None and declared != Mediation.UNSPECIFIED:
            return declared
        return Mediation.IN_HARNESS_REPORTED if run is not None else Mediation.CONTROLLER_MEDIATED

    async def _reported(self, call: ToolCall, run: ToolFunction) -> ToolResult:
        if self._issued < self._recorded and self._recorded_results is not None:
            # Already recorded (replay, or Resume of a turn that got this far): do not run it again.
            self._issued += 1
            recorded = await self._recorded_results.recorded_report(convert.tool_call_to_proto(call))
            return convert.tool_result_from_proto(recorded)
        result = await _run_tool(call, run)
        self._issued += 1
        await self.sink.report(convert.tool_result_to_proto(result, f"tool result {call.id!r}"))
        return result

    async def _dump(self, wire: common_pb2.ModelCall) -> None:
        index = self._ids.model_calls
        document = {
            "session": self.session,
            "execution_id": self.execution_id,
            "run_mode": self.run_mode,
            "model_call": index + 1,
            "input_hash": model_input_hash(wire),
            "request": json_format.MessageToDict(wire),
        }
        path = (
            Path(self._dump_dir)
            / (self.session or "no-session")
            / f"{self.execution_id}-{self.run_mode}-{index + 1:03d}.json"
        )

        def write() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")

        await asyncio.to_thread(write)


def _tool_choice(choice: ToolChoice | str | None) -> ToolChoice | None:
    if choice is None or isinstance(choice, ToolChoice):
        return choice
    mode = _CHOICES.get(choice)
    return (
        ToolChoice(mode=mode) if mode is not None else ToolChoice(mode=ToolChoiceMode.REQUIRED, name=choice)
    )


def _unavailable(why: str) -> ToolFunction:
    def refuse(args: dict[str, Any]) -> Any:
        raise ToolError(why)

    return refuse


async def _run_tool(call: ToolCall, run: ToolFunction) -> ToolResult:
    try:
        value = run(dict(call.args))
        if inspect.isawaitable(value):
            value = await value
    except ToolError as exc:
        return ToolResult.failure(call.id, str(exc))
    return tool_result_of(call.id, value)


def tool_result_of(call_id: str, value: Any) -> ToolResult:
    """A tool function's return value as the result of call ``call_id``."""
    if isinstance(value, ToolResult):
        return replace(value, id=call_id)
    if value is None:
        return ToolResult(id=call_id)
    if isinstance(value, str):
        return ToolResult(id=call_id, content=(TextPart(value),))
    if isinstance(value, Mapping):
        return ToolResult(id=call_id, output=dict(value))
    return ToolResult(id=call_id, output={"result": value})


def request_json(call: ModelCall) -> dict[str, Any]:
    """The request a ModelCall puts on the wire, as proto3 JSON (what a dump holds), with the
    model-input hash the host checks on replay."""
    wire = convert.model_call_to_proto(call)
    return {"input_hash": model_input_hash(wire), "request": json_format.MessageToDict(wire)}
