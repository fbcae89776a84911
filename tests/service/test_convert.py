"""The wire Session of a view (service/convert.py): every field the row and view carry."""

from __future__ import annotations

from google.protobuf import timestamp_pb2

from agentsessions.host.controller.state import SessionView
from agentsessions.host.journal.store import SessionRow
from agentsessions.host.service.convert import session_proto
from agentsessions.v1 import common_pb2, session_pb2


def _time(ns: int) -> timestamp_pb2.Timestamp:
    out = timestamp_pb2.Timestamp()
    out.FromNanoseconds(ns)
    return out


def test_every_field_of_a_row_and_its_view_reaches_the_session() -> None:
    row = SessionRow(
        uid="sess-1",
        project="p",
        name="n",
        harness="h",
        model="m",
        labels={"team": "x", "ü": "ß"},
        annotations={"note": "y"},
        origin=common_pb2.Origin(source="cli"),
        identity=common_pb2.IdentityRef(principal="alice"),
        parent_uid="sess-0",
        fork_seq=3,
        create_time_ns=1_700_000_000_123_456_789,
        update_time_ns=1_700_000_001_000_000_000,
        compute_state="COLD",
        last_seq=7,
    )
    gate = common_pb2.ApprovalRef(execution_id="e", tool_call_id="t", request_seq=4)
    got = session_proto(SessionView(row, session_pb2.EXEC_AWAITING, pending_approval=gate))
    want = session_pb2.Session(
        metadata=common_pb2.ResourceMetadata(
            project="p",
            name="n",
            uid="sess-1",
            create_time=_time(row.create_time_ns),
            update_time=_time(row.update_time_ns),
        ),
        harness="h",
        model="m",
        exec_state=session_pb2.EXEC_AWAITING,
        compute_state=session_pb2.COMPUTE_COLD,
        pending_approval=gate,
        last_seq=7,
        parent_uid="sess-0",
        fork_seq=3,
        identity=row.identity,
        origin=row.origin,
        labels=row.labels,
        annotations=row.annotations,
    )
    assert got == want
    assert got.SerializeToString(deterministic=True) == want.SerializeToString(deterministic=True)


def test_a_bare_row_sets_nothing_it_does_not_have() -> None:
    got = session_proto(
        SessionView(SessionRow(uid="u", project="p", compute_state="?"), session_pb2.EXEC_PENDING)
    )
    assert not got.metadata.HasField("create_time") and not got.metadata.HasField("update_time")
    assert (
        not got.HasField("origin") and not got.HasField("identity") and not got.HasField("pending_approval")
    )
    assert (dict(got.labels), dict(got.annotations), got.compute_state) == ({}, {}, session_pb2.COMPUTE_NONE)
