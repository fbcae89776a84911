"""The one place ExecutionSinks are built: for a new turn, for the recovery of an interrupted one,
and for a read-only controller replay. What differs between them is what the journal recorded of
the execution (:class:`Recorded`) and whether the sink may go live."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from agentsessions.host.controller.approval_policy import ApprovalPolicy, SessionGate
from agentsessions.host.controller.deltas import DeltaBatching
from agentsessions.host.controller.errors import ReplayDivergedError
from agentsessions.host.controller.executions import Effect, Execution, recorded_effects
from agentsessions.host.controller.modes import ModeCheck, Profiles, session_mode
from agentsessions.host.controller.sink import AppendSoon, DeltaHold, DeltaSink, ExecutionSink, TaskGate
from agentsessions.host.controller.tools import ToolInvoker
from agentsessions.host.controller.writer import ExecutionWriter
from agentsessions.host.ids import token_hex
from agentsessions.host.journal.store import SessionRow
from agentsessions.host.models.provider import ModelProvider
from agentsessions.host.tools.task import offers_task
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2, harness_pb2

Events = Callable[[str], Awaitable[Sequence[common_pb2.Event]]]


@struct(frozen=True)
class Recorded:
    """What the journal holds of an execution, served back before the sink goes live."""

    effects: list[Effect]
    usage: int  # USAGE records already journaled
    inherited: bool = False  # the execution lies in a fork-copied prefix
    legacy: bool = False  # an id-less v0.1.2 turn: never re-driven past its MODEL_CALL

    @classmethod
    def of(cls, events: Sequence[common_pb2.Event], ex: Execution) -> Recorded:
        effects, usage = recorded_effects(events, ex)
        return cls(effects, usage, ex.inherited, ex.legacy)


class SinkFactory:
    """Builds every ExecutionSink the controller hands a harness."""

    def __init__(
        self,
        model: ModelProvider | None,
        tools: ToolInvoker | None,
        *,
        new_id: Callable[[], str] | None,
        stream_deltas: bool,
        approval_policy: ApprovalPolicy,
        events: Events,
        delta_batching: DeltaBatching | None = None,
        write_ahead_model_calls: bool = False,
    ) -> None:
        self._model = model
        self._write_ahead_model_calls = write_ahead_model_calls
        self._tools = tools
        self._new_id: Callable[[], str] = new_id or (lambda: token_hex(8))
        self._stream_deltas = stream_deltas
        self._delta_batching = delta_batching or DeltaBatching()
        self._policy = approval_policy
        self._events = events
        # What the mode check needs of host-run tools: their classes, workspaces, confinement.
        described = getattr(tools, "profile", None)
        self._profiles: Profiles | None = described if callable(described) else None
        # The host's task tool (subagents), set by the live parts; offered to harnesses that list it.
        self.tasks: TaskGate | None = None

    def live(
        self,
        row: SessionRow,
        execution_id: str,
        writer: ExecutionWriter,
        on_delta: DeltaSink | None,
        recorded: Recorded | None = None,
        descriptor: harness_pb2.HarnessDescriptor | None = None,
        delta_hold: DeltaHold | None = None,
    ) -> ExecutionSink:
        """A sink that journals through ``writer`` and goes live once ``recorded`` is served;
        deltas reach ``on_delta`` when the host streams them. ``descriptor`` (the harness's, at
        admission) declares tool classes the mode check adds to the host's. With ``delta_hold``
        (which can keep ``on_delta``'s frames back until a MODEL_CALL record has gone out), or
        with no deltas streamed, a MODEL_CALL is ordered rather than made durable before the model
        runs, unless the host writes model calls ahead."""
        streamed = on_delta if self._stream_deltas else None
        uid = row.uid
        modes = ModeCheck.for_session(row, self._policy.mode_for(row.project), self._profiles, descriptor)
        return self._build(
            uid,
            execution_id,
            writer.append,
            recorded,
            live=True,
            on_delta=streamed,
            gate=SessionGate(self._policy, uid, row.project, row.fork_seq, lambda: self._events(uid)),
            modes=modes,
            host_mode=session_mode(row),
            tasks=self.tasks if offers_task(descriptor) else None,
            append_soon=writer.append_soon,
            model_intent_soon=not self._write_ahead_model_calls,
            delta_hold=delta_hold if streamed is not None else None,
        )

    def replay(self, row: SessionRow, execution_id: str, recorded: Recorded) -> ExecutionSink:
        """A pure replay: only recorded effects are served, nothing reaches a model or tool, and
        any write (or any request the journal did not record) is divergence. The harness is told
        the session's mode as on the live run."""

        async def refuse(event: common_pb2.Event) -> common_pb2.LogRecord:
            raise ReplayDivergedError("replay attempted to write to the journal")

        return self._build(
            row.uid,
            execution_id,
            refuse,
            recorded,
            live=False,
            on_delta=None,
            gate=None,
            modes=None,
            host_mode=session_mode(row),
        )

    def _build(
        self,
        uid: str,
        execution_id: str,
        append: Callable[[common_pb2.Event], Awaitable[common_pb2.LogRecord]],
        recorded: Recorded | None,
        *,
        live: bool,
        on_delta: DeltaSink | None,
        gate: SessionGate | None,
        modes: ModeCheck | None,
        host_mode: str,
        tasks: TaskGate | None = None,
        append_soon: AppendSoon | None = None,
        model_intent_soon: bool = False,
        delta_hold: DeltaHold | None = None,
    ) -> ExecutionSink:
        return ExecutionSink(
            session=uid,
            execution_id=execution_id,
            append=append,
            model=self._model if live else None,
            tools=self._tools if live else None,
            recorded=recorded.effects if recorded is not None else None,
            recorded_usage=recorded.usage if recorded is not None else 0,
            live=live,
            on_delta=on_delta,
            delta_batching=self._delta_batching,
            inherited_prefix=recorded is not None and recorded.inherited,
            redrive_trailing_model=recorded is None or not recorded.legacy,
            new_id=self._new_id if live else None,
            gate=gate,
            modes=modes,
            host_mode=host_mode,
            tasks=tasks,
            append_soon=append_soon,
            model_intent_soon=model_intent_soon,
            delta_hold=delta_hold,
        )
