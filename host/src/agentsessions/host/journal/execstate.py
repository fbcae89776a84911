"""The execution state a session row projects from its journal, kept on every append.

GetSession and ListSessions report each session's ``exec_state`` and ``pending_approval``, which
the controller derives from the journal's latest execution (``controller.state.derive_view``).
Deriving them by reading every listed session's journal makes a listing cost O(journal); instead
each append folds its records into an :class:`ExecProjection` stored in the session row in the
same transaction (like ``compute_state``), so a page of rows is one query.

The fold follows the rules the controller reads a journal by (``controller.executions``):
executions in first-seen order, modern ones keyed by ``execution_id`` and opened by
EXECUTION_START, id-less (legacy) ones ending at END or ERROR; the latest execution's END state
and ERRORs; and its tool calls still open, in call order, so the first approval-bearing one
without a result is the pending approval. tests/journal/test_execstate.py holds the two equal over
drawn journals.

Two situations the fold cannot settle from the row alone:

* a record naming an execution other than the latest, once modern executions exist: it may be an
  older execution's (which changes nothing) or a new one's (which becomes the latest). Without the
  journal's set of execution ids the fold marks the projection ``unknown`` and readers derive the
  state from the journal, as before. The host never writes such a record; a full fold (over a
  whole journal: migration, import, a fork's prefix) knows every id and stays exact;
* an EXECUTION_START reusing an older execution's id (the index calls that journal invalid): an
  incremental fold treats it as a new execution, since host-minted ids are 64 random bits.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import field
from typing import Any, Final

from agentsessions.sdk.structs import replace, struct
from agentsessions.v1 import common_pb2

__all__ = [
    "EMPTY",
    "MAX_OPEN_TOOLS",
    "ExecProjection",
    "LatestExecution",
    "OpenTool",
    "advance",
    "append_all",
    "decode",
    "fold",
    "inherit",
]

# Open tool calls the row keeps for the latest execution; more marks the projection unknown.
MAX_OPEN_TOOLS: Final = 64
_VERSION: Final = 1

_K = common_pb2
_LIFECYCLE: Final = int(_K.EVENT_LIFECYCLE)
_EXECUTION_START: Final = int(_K.EVENT_EXECUTION_START)
_END: Final = int(_K.EVENT_END)
_ERROR: Final = int(_K.EVENT_ERROR)
_TOOL_CALL: Final = int(_K.EVENT_TOOL_CALL)
_TOOL_RESULT: Final = int(_K.EVENT_TOOL_RESULT)
_APPROVAL_REQUEST: Final = int(_K.EVENT_APPROVAL_REQUEST)
_APPROVAL_RESULT: Final = int(_K.EVENT_APPROVAL_RESULT)
_REQUIRES_APPROVAL: Final = int(_K.MEDIATION_REQUIRES_APPROVAL)
_EXECUTION_KINDS: Final = frozenset(
    int(k)
    for k in (
        _K.EVENT_INPUT,
        _K.EVENT_MODEL_CALL,
        _K.EVENT_OUTPUT,
        _K.EVENT_TOOL_CALL,
        _K.EVENT_TOOL_RESULT,
        _K.EVENT_APPROVAL_REQUEST,
        _K.EVENT_APPROVAL_RESULT,
        _K.EVENT_USAGE,
        _K.EVENT_END,
        _K.EVENT_ERROR,
    )
)
# Kinds that never change a projection once their execution is the latest (and not inherited).
_PASSIVE: Final = frozenset(
    int(k) for k in (_K.EVENT_INPUT, _K.EVENT_MODEL_CALL, _K.EVENT_OUTPUT, _K.EVENT_USAGE)
)


@struct(frozen=True, slots=True)
class OpenTool:
    """A tool call of the latest execution without its result yet."""

    id: str
    approval: bool  # REQUIRES_APPROVAL
    request_seq: int = 0  # seq of its APPROVAL_REQUEST, 0 before one


@struct(frozen=True, slots=True)
class LatestExecution:
    """The execution whose first record is newest, as far as a listing needs it."""

    id: str  # "" for a legacy (id-less) execution
    legacy: bool = False
    inherited: bool = False  # every record lies in a fork-copied prefix
    end_state: str | None = None  # the state of its last END, None before one
    errored: bool = False
    malformed: bool = False  # its tool and approval records do not pair up (no gate is derived)
    tools: tuple[OpenTool, ...] = ()

    @property
    def completed(self) -> bool:
        return self.end_state is not None or (self.legacy and self.errored)

    def gate(self) -> OpenTool | None:
        """The first approval-bearing tool call without a result, when a gate can be open."""
        if self.completed or self.legacy or self.inherited or self.malformed:
            return None
        for tool in self.tools:
            if tool.approval:
                return tool
        return None


@struct(frozen=True, slots=True)
class ExecProjection:
    """What a session row keeps of its journal's executions (immutable; ``advance`` makes new
    ones only when something changed, so an unchanged projection is not written again)."""

    invalid: bool = False  # the journal does not read as executions (exec_state FAILED)
    unknown: bool = False  # the fold could not tell; readers derive from the journal
    modern: bool = False  # a record with an execution id was seen
    latest: LatestExecution | None = None
    encoded: str = field(default="", compare=False, repr=False)

    def encode(self) -> str:
        """The row's column text (computed once per projection)."""
        return self.encoded or _encode(self)


EMPTY: Final = ExecProjection()


def _encode(p: ExecProjection) -> str:
    body: dict[str, Any] = {"v": _VERSION}
    for name in ("invalid", "unknown", "modern"):
        if getattr(p, name):
            body[name] = True
    latest = p.latest
    if latest is not None:
        entry: dict[str, Any] = {"id": latest.id}
        for name in ("legacy", "inherited", "errored", "malformed"):
            if getattr(latest, name):
                entry[name] = True
        if latest.end_state is not None:
            entry["end"] = latest.end_state
        if latest.tools:
            entry["tools"] = [[t.id, t.approval, t.request_seq] for t in latest.tools]
        body["latest"] = entry
    return _compact(body)


# Made once: json.dumps with keywords builds an encoder at every call (a row is encoded per record).
_compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def _sealed(p: ExecProjection) -> ExecProjection:
    return replace(p, encoded=_encode(p))


# Decoded projections by their text: a listing reads the same rows again and again, and a row's
# projection changes only at a turn's edges. Bounded; the oldest half is dropped when it fills.
# Only listings fill it: a row read to admit a turn finds a text the turn before it just changed
# (a new execution id, its END), which no later read finds again. Kept, those made two objects a
# turn that lived through ~8,000 more turns: 16,000 of the ~120,000 objects each young collection
# of a loaded host walked, promoted to the older generations after (bench/NOTEBOOK.md).
_DECODED: dict[str, ExecProjection] = {}
_DECODED_MAX: Final = 8192


def decode(text: str | None, *, keep: bool = False) -> ExecProjection | None:
    """A projection from its column text; None for a row that has none (or one this host does
    not read), whose state is then derived from the journal. ``keep``: a listing's row, kept
    decoded for the next listing of it."""
    if not text:
        return None
    known = _DECODED.get(text)
    if known is not None:
        return known
    found = _decode(text)
    if found is not None and keep:
        if len(_DECODED) >= _DECODED_MAX:
            for stale in list(_DECODED)[: _DECODED_MAX // 2]:
                _DECODED.pop(stale, None)  # another reader thread may have dropped it
        _DECODED[text] = found
    return found


def _decode(text: str) -> ExecProjection | None:
    try:
        body = json.loads(text)
        if body.get("v") != _VERSION:
            return None
        latest = None
        entry = body.get("latest")
        if entry is not None:
            latest = LatestExecution(
                id=str(entry["id"]),
                legacy=bool(entry.get("legacy", False)),
                inherited=bool(entry.get("inherited", False)),
                end_state=None if entry.get("end") is None else str(entry["end"]),
                errored=bool(entry.get("errored", False)),
                malformed=bool(entry.get("malformed", False)),
                tools=tuple(OpenTool(str(t[0]), bool(t[1]), int(t[2])) for t in entry.get("tools", ())),
            )
        return ExecProjection(
            invalid=bool(body.get("invalid", False)),
            unknown=bool(body.get("unknown", False)),
            modern=bool(body.get("modern", False)),
            latest=latest,
            encoded=text,
        )
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None


def advance(
    p: ExecProjection,
    event: common_pb2.Event,
    seq: int,
    *,
    inherited: bool = False,
    known_ids: set[str] | None = None,
) -> ExecProjection:
    """The projection after appending ``event`` at ``seq``. ``inherited`` says the record lies in
    a fork-copied prefix; ``known_ids`` (a full fold's, updated here) is every execution id seen
    so far, which settles records of executions other than the latest. Without it an
    EXECUTION_START is taken as a new execution unless it repeats the latest's id: appends carry
    host-minted ids, and a journal that starts an older execution again comes in whole (import,
    migration), through a full fold."""
    kind = event.kind
    if p.invalid or p.unknown or kind == _LIFECYCLE:
        return p
    latest = p.latest
    execution_id = event.execution_id
    if (
        kind in _PASSIVE
        and latest is not None
        and not latest.inherited
        and not inherited
        and execution_id == latest.id
        and (execution_id or not latest.completed)
    ):
        return p  # the common record: nothing a listing shows changes
    changed = _advance(p, event, kind, execution_id, seq, inherited, known_ids)
    if changed is p:
        return p
    if changed.latest is not None and len(changed.latest.tools) > MAX_OPEN_TOOLS:
        changed = replace(changed, unknown=True, latest=None)
    return _sealed(changed)


def _advance(
    p: ExecProjection,
    event: common_pb2.Event,
    kind: int,
    execution_id: str,
    seq: int,
    inherited: bool,
    known_ids: set[str] | None,
) -> ExecProjection:
    latest = p.latest
    if kind == _EXECUTION_START:
        if not execution_id:
            return replace(p, invalid=True)
        started_twice = (
            execution_id in known_ids
            if known_ids is not None
            else latest is not None and not latest.legacy and latest.id == execution_id
        )
        if started_twice:
            return replace(p, invalid=True)
        if known_ids is not None:
            known_ids.add(execution_id)
        return replace(p, modern=True, latest=LatestExecution(execution_id, inherited=inherited))
    if kind not in _EXECUTION_KINDS:
        return p
    if execution_id:
        if latest is not None and not latest.legacy and latest.id == execution_id:
            return replace(p, modern=True, latest=_attach(latest, event, kind, seq, inherited))
        if known_ids is not None:
            if execution_id in known_ids:
                return p if p.modern else replace(p, modern=True)  # an older execution's record
            known_ids.add(execution_id)
        elif p.modern:
            return replace(p, unknown=True)  # older or new: only the journal can tell
        fresh = LatestExecution(execution_id, inherited=inherited)
        return replace(p, modern=True, latest=_attach(fresh, event, kind, seq, inherited, first=True))
    if kind in (_APPROVAL_REQUEST, _APPROVAL_RESULT) or p.modern:
        return replace(p, invalid=True)  # id-less approval records, or legacy after modern
    if latest is None or latest.completed:
        fresh = LatestExecution("", legacy=True, inherited=inherited)
        return replace(p, latest=_attach(fresh, event, kind, seq, inherited, first=True))
    return replace(p, latest=_attach(latest, event, kind, seq, inherited))


def _attach(
    ex: LatestExecution, event: common_pb2.Event, kind: int, seq: int, inherited: bool, *, first: bool = False
) -> LatestExecution:
    """``ex`` with one more record of its own."""
    if not first and not inherited and ex.inherited:
        ex = replace(ex, inherited=False)
    if kind == _END:
        return replace(ex, end_state=event.end.state)
    if kind == _ERROR:
        return ex if ex.errored else replace(ex, errored=True)
    if ex.malformed or kind not in (_TOOL_CALL, _TOOL_RESULT, _APPROVAL_REQUEST, _APPROVAL_RESULT):
        return ex
    tools = ex.tools
    if kind == _TOOL_CALL:
        call_id = event.tool.id
        if any(t.id == call_id for t in tools):
            return replace(ex, malformed=True)  # a call id reused while still open
        return replace(ex, tools=(*tools, OpenTool(call_id, event.tool.mediation == _REQUIRES_APPROVAL)))
    if kind == _TOOL_RESULT:
        kept = tuple(t for t in tools if t.id != event.result.id)
        return ex if len(kept) == len(tools) else replace(ex, tools=kept)  # else a harness report
    wanted = event.approval.tool_call_id if kind == _APPROVAL_REQUEST else event.approval_result.tool_call_id
    for i, tool in enumerate(tools):
        if tool.id == wanted:
            if kind == _APPROVAL_REQUEST:
                if tool.request_seq:
                    return replace(ex, malformed=True)  # a second request for one call
                updated = replace(tool, request_seq=seq)
                return replace(ex, tools=(*tools[:i], updated, *tools[i + 1 :]))
            return ex if tool.request_seq else replace(ex, malformed=True)  # a decision needs a request
    return replace(ex, malformed=True)  # approval records for no open call


def fold(
    events: Iterable[common_pb2.Event], *, fork_seq: int = 0, start: ExecProjection = EMPTY
) -> ExecProjection:
    """The projection of a whole journal (records from seq 1, in order), exact: every execution
    id is known as the fold goes. ``fork_seq`` marks records 1..fork_seq as a fork's prefix."""
    known: set[str] = set()
    p = start
    for seq, event in enumerate(events, start=1):
        p = advance(p, event, seq, inherited=seq <= fork_seq, known_ids=known)
    return p if p.encoded else _sealed(p)


def append_all(p: ExecProjection, events: Iterable[common_pb2.Event], first_seq: int) -> ExecProjection:
    """``p`` after appending ``events`` from ``first_seq`` on (an incremental fold)."""
    for seq, event in enumerate(events, start=first_seq):
        p = advance(p, event, seq)
    return p


def inherit(p: ExecProjection) -> ExecProjection:
    """A fork child's projection when it shares its parent's whole journal: the same executions,
    every record of them inherited."""
    if p.latest is None or p.latest.inherited:
        return p
    return _sealed(replace(p, latest=replace(p.latest, inherited=True)))
