"""The execution index the journal cache keeps for every cached session: an ended turn leaves the
collector nothing to walk but the Execution itself (its record indexes are ranges, or tuples of
ints where they do not follow one another; its EXECUTION_START and inputs read from the session's
records when asked), and a record journaled after the END still joins the turn (bench/NOTEBOOK.md,
load: what paces the collector)."""

from __future__ import annotations

import gc

from agentsessions.host.controller.executions import ExecutionIndex
from agentsessions.v1 import common_pb2

K = common_pb2


def _turn(execution: str, text: str) -> list[common_pb2.Event]:
    user = K.Message(role="user", parts=[K.Part(text=K.TextPart(text=text))])
    return [
        K.Event(
            execution_id=execution,
            kind=K.EVENT_EXECUTION_START,
            execution_start=K.ExecutionStart(input_count=1, harness="echo"),
        ),
        K.Event(execution_id=execution, kind=K.EVENT_INPUT, message=user),
        K.Event(execution_id=execution, kind=K.EVENT_MODEL_CALL, model=K.ModelCall(model="echo", id="m")),
        K.Event(execution_id=execution, kind=K.EVENT_OUTPUT, message=K.Message(role="assistant")),
        K.Event(execution_id=execution, kind=K.EVENT_END, end=K.HarnessEnd(state="COMPLETED")),
    ]


def _kind(indexes: object) -> tuple[str, list[int]]:
    assert isinstance(indexes, (list, tuple, range))
    return type(indexes).__name__, list(indexes)


def test_an_ended_execution_leaves_the_collector_nothing_but_itself() -> None:
    events = _turn("e1", "hi") + _turn("e2", "again")[:3]
    index = ExecutionIndex()
    index.feed(events)
    ended, running = index.order
    gc.collect()  # a tuple of ints is untracked at the first collection that sees it
    shared = (events, type(ended))
    assert [r for r in gc.get_referents(ended) if gc.is_tracked(r) and not any(r is s for s in shared)] == []
    assert (ended.indexes, ended.input_indexes, ended.end_index) == (range(5), range(1, 2), 4)
    assert not gc.is_tracked(ended.indexes) and ended.error_indexes == ()
    assert ended.start is not None and ended.start.harness == "echo"
    assert [m.parts[0].text.text for m in ended.inputs] == ["hi"]
    # The running turn keeps growing lists until its END.
    assert _kind(running.indexes) == ("list", [5, 6, 7])
    events += _turn("e2", "again")[3:]
    index.feed(events)
    assert _kind(running.indexes) == ("range", [5, 6, 7, 8, 9])
    assert [m.parts[0].text.text for m in running.inputs] == ["again"] and running.end_index == 9


def test_a_record_after_the_end_still_joins_its_turn() -> None:
    events = _turn("e1", "hi")
    events.append(K.Event(execution_id="e1", kind=K.EVENT_ERROR, error=K.Error(code=1, description="late")))
    index = ExecutionIndex()
    index.feed(events)
    (ex,) = index.order
    assert list(ex.indexes) == [0, 1, 2, 3, 4, 5]
    assert list(ex.error_indexes) == [5] and ex.end_index == 4 and ex.completed


def test_records_of_a_turn_that_do_not_follow_one_another_are_kept_as_a_tuple() -> None:
    # Two turns interleaved (a legacy journal's writer, or a recovery's records between).
    first, second = _turn("e1", "a"), _turn("e2", "b")
    events = first[:2] + second[:2] + first[2:] + second[2:]
    index = ExecutionIndex()
    index.feed(events)
    one, two = index.order
    assert _kind(one.indexes) == ("tuple", [0, 1, 4, 5, 6])
    assert _kind(two.indexes) == ("tuple", [2, 3, 7, 8, 9])
    assert _kind(one.input_indexes) == ("range", [1]) and [m.parts[0].text.text for m in two.inputs] == ["b"]
