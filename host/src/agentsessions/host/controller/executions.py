"""Reading a journal as executions: which records belong to which turn, and what each
turn's recorded effects are, so replay and recovery can serve them back in order."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from agentsessions.host.controller.errors import InvalidExecutionLogError
from agentsessions.sdk.extensions import RESULTS_PRINCIPAL
from agentsessions.v1 import common_pb2

# Kinds through the generated module's constants: an EnumTypeWrapper attribute costs ~1.5 us.
K = common_pb2
# Plain ints: attribute lookups on the generated enum wrapper are slow in hot loops.
_INPUT = int(K.EVENT_INPUT)
_END = int(K.EVENT_END)
_ERROR = int(K.EVENT_ERROR)
_LIFECYCLE = int(K.EVENT_LIFECYCLE)
_EXECUTION_START = int(K.EVENT_EXECUTION_START)
_APPROVAL_REQUEST = int(K.EVENT_APPROVAL_REQUEST)
_APPROVAL_RESULT = int(K.EVENT_APPROVAL_RESULT)
_EXECUTION_KINDS = frozenset(
    int(k)
    for k in (
        K.EVENT_INPUT,
        K.EVENT_MODEL_CALL,
        K.EVENT_OUTPUT,
        K.EVENT_TOOL_CALL,
        K.EVENT_TOOL_RESULT,
        K.EVENT_APPROVAL_REQUEST,
        K.EVENT_APPROVAL_RESULT,
        K.EVENT_USAGE,
        K.EVENT_END,
        K.EVENT_ERROR,
    )
)


@dataclass
class Effect:
    """One recorded effect of an execution, as the harness's sink call would consume it."""

    kind: str  # "model" | "output" | "tool" | "report"
    call: common_pb2.Event  # MODEL_CALL, OUTPUT, TOOL_CALL or TOOL_RESULT (report)
    reply: common_pb2.Event | None = None  # OUTPUT of a model call, TOOL_RESULT of a tool call
    approval_request: tuple[int, common_pb2.Event] | None = None  # (seq, APPROVAL_REQUEST)
    approval_result: tuple[int, common_pb2.Event] | None = None  # (seq, APPROVAL_RESULT)
    usage: common_pb2.Event | None = None  # the USAGE journaled right after a model call's OUTPUT


@dataclass
class Execution:
    """One turn of a session as the journal recorded it."""

    id: str
    legacy: bool
    first_index: int  # index (seq - 1) of the turn's first record
    start: common_pb2.ExecutionStart | None
    inputs: list[common_pb2.Message] = field(default_factory=list)
    indexes: list[int] = field(default_factory=list)  # every record index of the turn
    end_index: int | None = None
    error_indexes: list[int] = field(default_factory=list)
    inherited: bool = False  # every record lies in a fork-copied prefix

    @property
    def completed(self) -> bool:
        """Finished: an END (or, for a legacy turn, an END or ERROR) was journaled."""
        if self.end_index is not None:
            return True
        return self.legacy and bool(self.error_indexes)


def legacy_execution_id(session: str, seq: int, content_hash: str) -> str:
    """Transport-only execution id for a legacy (id-less) turn; never journaled."""
    digest = hashlib.sha256(f"{session}\x00{seq}\x00{content_hash}".encode()).hexdigest()
    return "legacy-" + digest


class ExecutionIndex:
    """Executions of one session, built incrementally as records are appended.

    Modern turns are keyed by execution id and open with EXECUTION_START. Id-less execution
    records (the v0.1.2 writer) form legacy turns that end at END or ERROR; once a modern
    record appears, later id-less execution records make the log invalid. Feeding only the
    new records keeps per-turn bookkeeping flat as a session grows.
    """

    def __init__(self, fork_seq: int = 0) -> None:
        self.fork_seq = fork_seq
        self.order: list[Execution] = []
        self.count = 0  # records fed so far
        self._by_id: dict[str, Execution] = {}
        self._legacy: Execution | None = None
        self._modern_seen = False

    def feed(self, events: list[common_pb2.Event]) -> None:
        """Index ``events[self.count:]``."""
        for index in range(self.count, len(events)):
            self._add(index, events[index])
            self.count = index + 1

    def _add(self, index: int, ev: common_pb2.Event) -> None:
        kind = ev.kind
        if kind == _LIFECYCLE:
            return
        if kind == _EXECUTION_START:
            if not ev.execution_id:
                raise InvalidExecutionLogError(f"record {index + 1}: EXECUTION_START without execution_id")
            if ev.execution_id in self._by_id:
                raise InvalidExecutionLogError(
                    f"record {index + 1}: execution {ev.execution_id} started twice"
                )
            self._modern_seen = True
            self._legacy = None
            ex = Execution(ev.execution_id, False, index, ev.execution_start)
            self._by_id[ev.execution_id] = ex
            self.order.append(ex)
            self._attach(ex, index, kind, ev)
            return
        if kind not in _EXECUTION_KINDS:
            return
        if ev.execution_id:
            self._modern_seen = True
            self._legacy = None
            found = self._by_id.get(ev.execution_id)
            if found is None:
                found = Execution(ev.execution_id, False, index, None)
                self._by_id[ev.execution_id] = found
                self.order.append(found)
            self._attach(found, index, kind, ev)
            return
        if kind in (_APPROVAL_REQUEST, _APPROVAL_RESULT):
            raise InvalidExecutionLogError(f"record {index + 1}: approval record without execution_id")
        if self._modern_seen:
            raise InvalidExecutionLogError(
                f"record {index + 1}: {common_pb2.EventKind.Name(kind)} "
                "without execution_id after a modern execution"
            )
        if self._legacy is None or self._legacy.completed:
            self._legacy = Execution("", True, index, None)
            self.order.append(self._legacy)
        self._attach(self._legacy, index, kind, ev)

    def _attach(self, ex: Execution, index: int, kind: int, ev: common_pb2.Event) -> None:
        if not ex.indexes:
            ex.inherited = index < self.fork_seq
        elif index >= self.fork_seq:
            ex.inherited = False
        ex.indexes.append(index)
        if kind == _INPUT:
            ex.inputs.append(ev.message)
        elif kind == _END:
            ex.end_index = index
        elif kind == _ERROR:
            ex.error_indexes.append(index)


def latest_execution(executions: list[Execution]) -> Execution | None:
    """The execution whose first record is newest (first-seen order)."""
    return executions[-1] if executions else None


def recorded_effects(events: list[common_pb2.Event], ex: Execution) -> tuple[list[Effect], int]:
    """The execution's effect stream and its number of USAGE records.

    MODEL_CALL pairs with the OUTPUT that follows it; TOOL_CALL with its approval records and
    the TOOL_RESULT carrying its id; a lone OUTPUT is direct output and a lone TOOL_RESULT a
    harness report. USAGE is accounting, not an effect: the one right after a model call's OUTPUT
    is that call's (served with it), the others are counted; ERROR and END are not effects.
    """
    effects: list[Effect] = []
    usage = 0
    open_tools: dict[str, Effect] = {}
    pending_model: Effect | None = None
    answered_model: Effect | None = None  # the model effect whose OUTPUT was the last record
    for index in ex.indexes:
        ev = events[index]
        kind = ev.kind
        if kind == K.EVENT_USAGE and answered_model is not None:
            answered_model.usage = ev
            answered_model = None
            continue
        answered_model = None
        if kind == K.EVENT_MODEL_CALL:
            pending_model = Effect("model", ev)
            effects.append(pending_model)
            continue
        if kind == K.EVENT_OUTPUT:
            if ev.actor.principal == RESULTS_PRINCIPAL:
                continue  # the host's settled result (controller/results.py), not an effect
            if pending_model is not None and pending_model.reply is None:
                pending_model.reply = ev
                answered_model = pending_model
            else:
                effects.append(Effect("output", ev))
            pending_model = None
            continue
        if kind in (K.EVENT_INPUT, K.EVENT_END, K.EVENT_ERROR, K.EVENT_EXECUTION_START):
            continue
        pending_model = None
        if kind == K.EVENT_USAGE:
            usage += 1
        elif kind == K.EVENT_TOOL_CALL:
            call_id = ev.tool.id
            if call_id in open_tools:
                raise InvalidExecutionLogError(f"record {index + 1}: tool call id {call_id!r} reused")
            eff = Effect("tool", ev)
            open_tools[call_id] = eff
            effects.append(eff)
        elif kind == K.EVENT_APPROVAL_REQUEST:
            eff_or_none = open_tools.get(ev.approval.tool_call_id)
            if eff_or_none is None or eff_or_none.approval_request is not None:
                raise InvalidExecutionLogError(f"record {index + 1}: approval request without its tool call")
            eff_or_none.approval_request = (index + 1, ev)
        elif kind == K.EVENT_APPROVAL_RESULT:
            eff_or_none = open_tools.get(ev.approval_result.tool_call_id)
            if eff_or_none is None or eff_or_none.approval_request is None:
                raise InvalidExecutionLogError(f"record {index + 1}: approval decision without a request")
            if eff_or_none.approval_result is None:
                eff_or_none.approval_result = (index + 1, ev)
        elif kind == K.EVENT_TOOL_RESULT:
            eff_or_none = open_tools.get(ev.result.id)
            if eff_or_none is not None and eff_or_none.reply is None:
                eff_or_none.reply = ev
                del open_tools[ev.result.id]
            else:
                effects.append(Effect("report", ev))
    return effects, usage
