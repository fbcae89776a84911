"""Every store keeps each session's execution state in its row (issue #15 item 2), one suite run
against memory, SQLite and PostgreSQL: appends, fence mints, forks, imports and purges project
it in the same transaction, gets and pages read it back, and it survives a reopen."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from agentsessions.host.journal import execstate
from agentsessions.host.journal.execstate import ExecProjection, LatestExecution, OpenTool
from agentsessions.host.journal.store import JournalStore, SessionRow
from agentsessions.v1 import common_pb2
from tests.journal.test_store_conformance import Importer

if TYPE_CHECKING:
    from tests.journal.conftest import StoreFactory

K = common_pb2


def start(execution_id: str) -> common_pb2.Event:
    return common_pb2.Event(kind=K.EVENT_EXECUTION_START, execution_id=execution_id)


def gated_call(execution_id: str, tool: str) -> common_pb2.Event:
    return common_pb2.Event(
        kind=K.EVENT_TOOL_CALL,
        execution_id=execution_id,
        tool=common_pb2.ToolCall(
            id=tool, tool="rm", mediation=K.MEDIATION_REQUIRES_APPROVAL, idempotency_key="k"
        ),
    )


def request(execution_id: str, tool: str) -> common_pb2.Event:
    return common_pb2.Event(
        kind=K.EVENT_APPROVAL_REQUEST,
        execution_id=execution_id,
        approval=common_pb2.ApprovalRequest(tool_call_id=tool),
    )


def result(execution_id: str, tool: str) -> common_pb2.Event:
    return common_pb2.Event(
        kind=K.EVENT_TOOL_RESULT, execution_id=execution_id, result=common_pb2.ToolResult(id=tool)
    )


def end(execution_id: str, state: str = "COMPLETED") -> common_pb2.Event:
    return common_pb2.Event(
        kind=K.EVENT_END, execution_id=execution_id, end=common_pb2.HarnessEnd(state=state)
    )


def fork_marker() -> common_pb2.Event:
    return common_pb2.Event(
        kind=K.EVENT_LIFECYCLE, lifecycle=common_pb2.Lifecycle(kind=K.Lifecycle.LIFECYCLE_FORK)
    )


async def projection(store: JournalStore, uid: str) -> ExecProjection | None:
    row = await store.get_session(uid)
    assert row is not None
    return row.exec_projection


async def test_appends_project_the_latest_execution_into_the_row(store: JournalStore) -> None:
    await store.create_session(SessionRow(uid="s", project="p"))
    assert await projection(store, "s") == execstate.EMPTY
    await store.append("s", [start("x"), gated_call("x", "t1")], expected_head=0, fence=0, mint_fence=True)
    await store.append("s", [request("x", "t1")], expected_head=2, fence=1)
    parked = await projection(store, "s")
    assert parked is not None and parked.latest is not None
    assert parked.latest.gate() == OpenTool("t1", True, 3)
    # A page of rows carries the same state: no journal is read to list them.
    rows, _ = await store.list_sessions("p", 10, "")
    assert [r.exec_projection for r in rows] == [parked]
    await store.append("s", [result("x", "t1"), end("x")], expected_head=3, fence=1)
    assert await projection(store, "s") == execstate.fold(r.event for r in await store.read("s"))
    done = await projection(store, "s")
    assert done is not None and done.latest == LatestExecution("x", end_state="COMPLETED")
    # A fence mint (no records) leaves the state as it was.
    await store.new_fence("s", expected_head=5)
    assert await projection(store, "s") == done


async def test_the_projection_survives_a_reopen(store_factory: StoreFactory) -> None:
    store = await store_factory()
    await store.create_session(SessionRow(uid="s", project="p"))
    await store.append("s", [start("x"), gated_call("x", "t1"), request("x", "t1")], expected_head=0, fence=0)
    kept = await projection(store, "s")
    if not store_factory.shared:
        return
    await store.close()
    again = await store_factory()
    assert await projection(again, "s") == kept
    await again.append("s", [result("x", "t1"), end("x", "FAILED")], expected_head=3, fence=0)
    failed = await projection(again, "s")
    assert failed is not None and failed.latest is not None and failed.latest.end_state == "FAILED"


async def test_fork_children_project_their_parents_state_at_the_fork_point(store: JournalStore) -> None:
    await store.create_session(SessionRow(uid="parent", project="p"))
    await store.append(
        "parent", [start("x"), gated_call("x", "t1"), request("x", "t1")], expected_head=0, fence=0
    )
    # At the parent's head: the parked turn is inherited (the child has no gate of its own).
    await store.fork("parent", 3, [SessionRow(uid="at-head", project="p")], fork_marker())
    child = await projection(store, "at-head")
    assert child is not None and child.latest is not None
    assert child.latest.inherited and child.latest.gate() is None
    await store.append("parent", [result("x", "t1"), end("x"), start("y")], expected_head=3, fence=0)
    # Below the parent's head: the prefix is folded.
    await store.fork("parent", 5, [SessionRow(uid="mid", project="p")], fork_marker())
    mid = await projection(store, "mid")
    assert mid == execstate.fold([r.event for r in await store.read("parent", 1, 5)], fork_seq=5)
    assert mid is not None and mid.latest is not None and mid.latest.end_state == "COMPLETED"
    await store.fork("parent", 0, [SessionRow(uid="genesis", project="p")], fork_marker())
    assert await projection(store, "genesis") == execstate.EMPTY
    # A child's own turns project as usual.
    await store.append("mid", [start("z")], expected_head=6, fence=0)
    mine = await projection(store, "mid")
    assert mine is not None and mine.latest == LatestExecution("z")


async def test_imported_records_are_folded_whole(store: JournalStore) -> None:
    await store.create_session(SessionRow(uid="src", project="p"))
    records = await store.append(
        "src", [start("x"), gated_call("x", "t1"), request("x", "t1")], expected_head=0, fence=0
    )
    importer = cast(Importer, store)
    await importer.import_records(SessionRow(uid="copy", project="p"), records)
    assert await projection(store, "copy") == await projection(store, "src")


async def test_a_purge_resets_the_state(store: JournalStore) -> None:
    await store.create_session(SessionRow(uid="s", project="p"))
    await store.append("s", [start("x"), end("x")], expected_head=0, fence=0)
    await store.fork("s", 2, [SessionRow(uid="kid", project="p")], fork_marker())
    await store.delete_session("s", purge=True)
    kid = await projection(store, "kid")
    assert kid is not None and kid.latest is not None and kid.latest.end_state == "COMPLETED"
