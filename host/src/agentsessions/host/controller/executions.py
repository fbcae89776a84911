"""Reading a journal as executions: which records belong to which turn, and what each
turn's recorded effects are, so replay and recovery can serve them back in order."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import field

from agentsessions.host.controller.errors import InvalidExecutionLogError
from agentsessions.sdk.recorded import Effect as Effect  # re-exported: the controller reads effects from here
from agentsessions.sdk.recorded import MalformedEffectsError, pair_effects
from agentsessions.sdk.structs import struct
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


# Record indexes: a list while the turn is being written; once it has ended a range where they
# follow one another (a turn's records usually do: the collector never walks a range) and a
# tuple where they do not.
Indexes = list[int] | tuple[int, ...] | range


@struct(slots=True)
class Execution:
    """One turn of a session as the journal recorded it.

    It keeps record indexes, not records, and an ended turn keeps them as ranges (or tuples):
    the journal cache holds an index for every cached session, and every message, list or
    ``__dict__`` kept here would be one more object the collector walks at each collection, for
    as long as the session stays cached (a range is never tracked, a tuple of ints is untracked
    at its first collection; bench/NOTEBOOK.md, load). ``start`` and ``inputs`` read the records
    they name from ``events``, the log the index was fed."""

    id: str
    legacy: bool
    first_index: int  # index (seq - 1) of the turn's first record
    events: Sequence[common_pb2.Event] = field(repr=False, compare=False)
    has_start: bool = False  # the turn's first record is its EXECUTION_START
    input_indexes: Indexes = ()
    indexes: Indexes = ()  # every record index of the turn
    end_index: int | None = None
    error_indexes: Indexes = ()
    inherited: bool = False  # every record lies in a fork-copied prefix

    @property
    def start(self) -> common_pb2.ExecutionStart | None:
        return self.events[self.first_index].execution_start if self.has_start else None

    @property
    def inputs(self) -> list[common_pb2.Message]:
        events = self.events
        return [events[i].message for i in self.input_indexes]

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

    def feed(self, events: Sequence[common_pb2.Event]) -> None:
        """Index ``events[self.count:]``: the same list each time, grown (the executions read their
        records from it)."""
        for index in range(self.count, len(events)):
            self._add(events, index, events[index])
            self.count = index + 1

    def _add(self, events: Sequence[common_pb2.Event], index: int, ev: common_pb2.Event) -> None:
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
            ex = Execution(ev.execution_id, False, index, events, has_start=True)
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
                found = Execution(ev.execution_id, False, index, events)
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
            self._legacy = Execution("", True, index, events)
            self.order.append(self._legacy)
        self._attach(self._legacy, index, kind, ev)

    def _attach(self, ex: Execution, index: int, kind: int, ev: common_pb2.Event) -> None:
        if not ex.indexes:
            ex.inherited = index < self.fork_seq
        elif index >= self.fork_seq:
            ex.inherited = False
        ex.indexes = _grown(ex.indexes, index)
        if kind == _INPUT:
            ex.input_indexes = _grown(ex.input_indexes, index)
        elif kind == _END:
            ex.end_index = index
            ex.indexes, ex.input_indexes = _settled(ex.indexes), _settled(ex.input_indexes)
            ex.error_indexes = _settled(ex.error_indexes)
        elif kind == _ERROR:
            ex.error_indexes = _grown(ex.error_indexes, index)


def _grown(indexes: Indexes, index: int) -> list[int]:
    """``indexes`` with ``index`` added: in place while a list, as a list again after the END (a
    record journaled after it, an audit ERROR say, is rare)."""
    grown = indexes if isinstance(indexes, list) else list(indexes)
    grown.append(index)
    return grown


def _settled(indexes: Indexes) -> range | tuple[int, ...]:
    """An ended turn's ``indexes`` as they are kept: a range when consecutive, else a tuple."""
    if isinstance(indexes, (range, tuple)):
        return indexes
    if indexes and indexes[-1] - indexes[0] == len(indexes) - 1:
        return range(indexes[0], indexes[-1] + 1)
    return tuple(indexes)


def latest_execution(executions: list[Execution]) -> Execution | None:
    """The execution whose first record is newest (first-seen order)."""
    return executions[-1] if executions else None


def recorded_effects(events: Sequence[common_pb2.Event], ex: Execution) -> tuple[list[Effect], int]:
    """The execution's effect stream and its number of USAGE records that are not a model
    call's (``agentsessions.sdk.recorded.pair_effects``); a journal whose records do not pair is
    an InvalidExecutionLogError."""
    try:
        return pair_effects((index + 1, events[index]) for index in ex.indexes)
    except MalformedEffectsError as exc:
        raise InvalidExecutionLogError(str(exc)) from None
