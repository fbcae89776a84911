"""The projected execution state equals the state derived from the journal (issue #15 item 2).

``journal.execstate`` folds each append into the session row; ``controller.state.derive_view``
reads the whole journal. Over drawn journals (modern, legacy and mixed executions, tool calls of
every mediation with approval records in any order, ENDs of every state, fork prefixes) the
projection a listing reads must give the same ``exec_state`` and ``pending_approval`` as the
journal, both folded whole and appended record by record.
"""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agentsessions.host.controller.errors import InvalidExecutionLogError
from agentsessions.host.controller.executions import ExecutionIndex
from agentsessions.host.controller.state import SessionView, derive_view, projected_view
from agentsessions.host.journal import execstate
from agentsessions.host.journal.store import SessionRow
from agentsessions.v1 import common_pb2, session_pb2

K = common_pb2
EXECUTIONS = ["a", "b", "c", ""]
TOOLS = ["t1", "t2", "t3"]
MEDIATIONS = [K.MEDIATION_REQUIRES_APPROVAL, K.MEDIATION_CONTROLLER_MEDIATED, K.MEDIATION_IN_HARNESS_REPORTED]


ANY_KIND = [
    K.EVENT_EXECUTION_START,
    K.EVENT_INPUT,
    K.EVENT_MODEL_CALL,
    K.EVENT_OUTPUT,
    K.EVENT_USAGE,
    K.EVENT_TOOL_CALL,
    K.EVENT_TOOL_CALL,
    K.EVENT_TOOL_RESULT,
    K.EVENT_APPROVAL_REQUEST,
    K.EVENT_APPROVAL_RESULT,
    K.EVENT_END,
    K.EVENT_ERROR,
    K.EVENT_LIFECYCLE,
]
# Inside a turn: mostly tool calls and their approval records, which decide the pending approval.
TURN_KIND = [
    K.EVENT_MODEL_CALL,
    K.EVENT_OUTPUT,
    K.EVENT_TOOL_CALL,
    K.EVENT_TOOL_CALL,
    K.EVENT_TOOL_RESULT,
    K.EVENT_APPROVAL_REQUEST,
    K.EVENT_APPROVAL_REQUEST,
    K.EVENT_APPROVAL_RESULT,
    K.EVENT_END,
    K.EVENT_ERROR,
]


@st.composite
def events(draw: st.DrawFn, kinds: list[common_pb2.EventKind.ValueType] = ANY_KIND) -> common_pb2.Event:
    kind = draw(st.sampled_from(kinds))
    event = common_pb2.Event(kind=kind)
    if kind != K.EVENT_LIFECYCLE:
        # Mostly the execution the journal is on; sometimes another one, or none.
        event.execution_id = draw(st.sampled_from(EXECUTIONS))
    tool = draw(st.sampled_from(TOOLS[:2] if kinds is TURN_KIND else TOOLS))
    if kind == K.EVENT_TOOL_CALL:
        event.tool.CopyFrom(
            common_pb2.ToolCall(id=tool, tool="x", mediation=draw(st.sampled_from(MEDIATIONS)))
        )
    elif kind == K.EVENT_TOOL_RESULT:
        event.result.CopyFrom(common_pb2.ToolResult(id=tool))
    elif kind == K.EVENT_APPROVAL_REQUEST:
        event.approval.CopyFrom(common_pb2.ApprovalRequest(tool_call_id=tool))
    elif kind == K.EVENT_APPROVAL_RESULT:
        event.approval_result.CopyFrom(common_pb2.ApprovalResult(tool_call_id=tool, approved=True))
    elif kind == K.EVENT_END:
        event.end.state = draw(st.sampled_from(["COMPLETED", "CANCELED", "FAILED", ""]))
    elif kind == K.EVENT_LIFECYCLE:
        event.lifecycle.kind = draw(
            st.sampled_from([K.Lifecycle.LIFECYCLE_SUSPEND, K.Lifecycle.LIFECYCLE_FORK])
        )
    return event


@st.composite
def turns(draw: st.DrawFn) -> list[common_pb2.Event]:
    """Journals shaped like the host's: turns opened by EXECUTION_START, their records carrying the
    turn's id (with the occasional stray record of any shape)."""
    out: list[common_pb2.Event] = []
    for n in range(draw(st.integers(0, 4))):
        execution_id = f"x{n}"
        out.append(common_pb2.Event(kind=K.EVENT_EXECUTION_START, execution_id=execution_id))
        for event in draw(st.lists(events(TURN_KIND), max_size=8)):
            if event.kind not in (K.EVENT_LIFECYCLE, K.EVENT_EXECUTION_START) and draw(st.integers(0, 7)):
                event.execution_id = execution_id
            out.append(event)
    return out


def _row(events: list[common_pb2.Event], fork_seq: int) -> SessionRow:
    return SessionRow(uid="s", project="p", fork_seq=fork_seq, last_seq=len(events))


def _derived(events: list[common_pb2.Event], fork_seq: int, running_here: bool) -> SessionView:
    """What GetSession reported before the projection: the journal read as executions."""
    row = _row(events, fork_seq)
    if row.last_seq == 0:
        return SessionView(row, session_pb2.EXEC_PENDING)
    index = ExecutionIndex(fork_seq)
    try:
        index.feed(events)
    except InvalidExecutionLogError:
        return SessionView(row, session_pb2.EXEC_FAILED)
    return derive_view(row, events, index.order, running_here=running_here)


def _name(state: int) -> str:
    return session_pb2.ExecState.Name(state)  # type: ignore[arg-type]


def _same(got: SessionView, want: SessionView) -> None:
    assert _name(got.exec_state) == _name(want.exec_state)
    assert got.pending_approval == want.pending_approval


@settings(max_examples=400)
@given(journal=st.one_of(st.lists(events(), max_size=24), turns()), running_here=st.booleans())
def test_a_whole_journal_folds_to_the_derived_state(
    journal: list[common_pb2.Event], running_here: bool
) -> None:
    projection = execstate.fold(journal)
    assert not projection.unknown, "a full fold knows every execution id"
    _same(
        projected_view(_row(journal, 0), projection, running_here=running_here),
        _derived(journal, 0, running_here),
    )
    # What the row stores reads back as the same projection.
    assert execstate.decode(projection.encode()) == projection


@given(
    journal=st.one_of(st.lists(events(), max_size=24), turns()),
    cut=st.integers(0, 30),
    running_here=st.booleans(),
)
def test_appending_record_by_record_keeps_the_derived_state(
    journal: list[common_pb2.Event], cut: int, running_here: bool
) -> None:
    """A fork child (its parent's records 1..fork_seq folded whole), then every later append
    folded one record at a time, as the store does in each append's transaction."""
    fork_seq = min(cut, len(journal))
    # Appends carry host-minted execution ids (8 random bytes), never one the journal holds; a
    # journal that starts a known execution again comes in whole (import), and a full fold sees
    # it (test_a_full_fold_sees_an_older_execution_started_again).
    assume(not _restarts_an_older_execution(journal, fork_seq))
    projection = execstate.fold(journal[:fork_seq], fork_seq=fork_seq)
    for seq in range(fork_seq + 1, len(journal) + 1):
        projection = execstate.advance(projection, journal[seq - 1], seq)
        stored = execstate.decode(projection.encode())
        assert stored == projection
        if projection.unknown:
            return  # readers derive this session from its journal
        _same(
            projected_view(_row(journal[:seq], fork_seq), projection, running_here=running_here),
            _derived(journal[:seq], fork_seq, running_here),
        )


def _restarts_an_older_execution(journal: list[common_pb2.Event], fork_seq: int) -> bool:
    """Whether an appended EXECUTION_START (past ``fork_seq``) names an id the journal already
    holds: never so for the host's appends, whose ids are minted fresh."""
    seen: set[str] = set()
    for seq, event in enumerate(journal, 1):
        if event.kind == K.EVENT_EXECUTION_START and seq > fork_seq and event.execution_id in seen:
            return True
        seen.add(event.execution_id)
    return False


def test_a_full_fold_sees_an_older_execution_started_again() -> None:
    journal = [common_pb2.Event(kind=K.EVENT_EXECUTION_START, execution_id=i) for i in ("a", "b", "a")]
    folded = execstate.fold(journal, fork_seq=0)
    _same(
        projected_view(_row(journal, 0), folded, running_here=False),
        _derived(journal, 0, False),
    )


@given(journal=turns())
def test_the_hosts_own_journals_never_need_the_journal(journal: list[common_pb2.Event]) -> None:
    """Turns opened by EXECUTION_START with host-minted ids: the incremental fold never gives up
    unless a stray record names an execution other than the latest."""
    projection = execstate.append_all(execstate.EMPTY, journal, 1)
    latest_ids = []
    for event in journal:
        if event.kind == K.EVENT_EXECUTION_START:
            latest_ids.append(event.execution_id)
    stray = any(
        e.execution_id and latest_ids and e.execution_id not in latest_ids[-1:]
        for e in journal
        if e.kind not in (K.EVENT_LIFECYCLE, K.EVENT_EXECUTION_START)
    )
    if not stray:
        assert not projection.unknown


def test_a_fork_of_the_whole_journal_inherits_the_parents_projection() -> None:
    journal = [
        common_pb2.Event(kind=K.EVENT_EXECUTION_START, execution_id="x"),
        common_pb2.Event(
            kind=K.EVENT_TOOL_CALL,
            execution_id="x",
            tool=common_pb2.ToolCall(id="t1", tool="rm", mediation=K.MEDIATION_REQUIRES_APPROVAL),
        ),
        common_pb2.Event(
            kind=K.EVENT_APPROVAL_REQUEST,
            execution_id="x",
            approval=common_pb2.ApprovalRequest(tool_call_id="t1"),
        ),
    ]
    parent = execstate.fold(journal)
    assert (
        projected_view(_row(journal, 0), parent, running_here=False).exec_state == session_pb2.EXEC_AWAITING
    )
    child = execstate.inherit(parent)
    assert child == execstate.fold(journal, fork_seq=len(journal))
    # The child's copy of the parked turn is inherited: no gate of its own.
    assert projected_view(_row(journal, 3), child, running_here=False).exec_state == session_pb2.EXEC_RUNNING


def _call(
    tool: str, mediation: common_pb2.Mediation.ValueType = K.MEDIATION_REQUIRES_APPROVAL
) -> common_pb2.Event:
    return common_pb2.Event(
        kind=K.EVENT_TOOL_CALL,
        execution_id="x",
        tool=common_pb2.ToolCall(id=tool, tool="rm", mediation=mediation),
    )


def _request(tool: str) -> common_pb2.Event:
    return common_pb2.Event(
        kind=K.EVENT_APPROVAL_REQUEST,
        execution_id="x",
        approval=common_pb2.ApprovalRequest(tool_call_id=tool),
    )


def _decision(tool: str) -> common_pb2.Event:
    return common_pb2.Event(
        kind=K.EVENT_APPROVAL_RESULT,
        execution_id="x",
        approval_result=common_pb2.ApprovalResult(tool_call_id=tool, approved=True),
    )


def _result(tool: str) -> common_pb2.Event:
    return common_pb2.Event(kind=K.EVENT_TOOL_RESULT, execution_id="x", result=common_pb2.ToolResult(id=tool))


_START = common_pb2.Event(kind=K.EVENT_EXECUTION_START, execution_id="x")


@pytest.mark.parametrize(
    ("journal", "state"),
    [
        ([_START, _call("t1"), _request("t1")], session_pb2.EXEC_AWAITING),
        ([_START, _call("t1"), _request("t1"), _decision("t1")], session_pb2.EXEC_AWAITING),
        ([_START, _call("t1"), _request("t1"), _decision("t1"), _result("t1")], session_pb2.EXEC_RUNNING),
        (
            [_START, _call("t1", K.MEDIATION_CONTROLLER_MEDIATED), _call("t2"), _request("t2")],
            session_pb2.EXEC_AWAITING,
        ),
        # Approval records that do not pair up: the journal shows no gate.
        ([_START, _call("t1"), _request("t1"), _request("t1")], session_pb2.EXEC_RUNNING),
        ([_START, _call("t1"), _decision("t1")], session_pb2.EXEC_RUNNING),
        ([_START, _call("t1"), _call("t1")], session_pb2.EXEC_RUNNING),
        ([_START, _call("t1"), _request("t2")], session_pb2.EXEC_RUNNING),
        ([_START, _call("t1"), _result("t1"), _decision("t1")], session_pb2.EXEC_RUNNING),
        # Id-less approval records make the journal unreadable as executions.
        ([_START, _call("t1"), common_pb2.Event(kind=K.EVENT_APPROVAL_REQUEST)], session_pb2.EXEC_FAILED),
        ([_START, _START], session_pb2.EXEC_FAILED),
    ],
    ids=[
        "requested",
        "decided-not-receipted",
        "receipted",
        "second-call-gated",
        "two-requests",
        "decision-without-request",
        "call-id-reused",
        "request-for-no-call",
        "decision-after-result",
        "id-less-approval",
        "started-twice",
    ],
)
def test_approval_records_project_as_the_journal_reads(
    journal: list[common_pb2.Event], state: session_pb2.ExecState.ValueType
) -> None:
    want = _derived(journal, 0, False)
    assert _name(want.exec_state) == _name(state)
    _same(projected_view(_row(journal, 0), execstate.fold(journal), running_here=False), want)
    incremental = execstate.append_all(execstate.EMPTY, journal, 1)
    _same(projected_view(_row(journal, 0), incremental, running_here=False), want)
