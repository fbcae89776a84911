"""The wire ``Session`` of a controller view: the one place a session becomes a proto message."""

from __future__ import annotations

from agentsessions.host.controller.state import SessionView
from agentsessions.v1 import session_pb2

_COMPUTE = {
    "NONE": session_pb2.COMPUTE_NONE,
    "LIVE": session_pb2.COMPUTE_LIVE,
    "COLD": session_pb2.COMPUTE_COLD,
}


def session_proto(view: SessionView) -> session_pb2.Session:
    """The wire Session for a view (every response and Exec frame that carries one)."""
    row = view.row
    s = session_pb2.Session(
        harness=row.harness,
        model=row.model,
        exec_state=view.exec_state,  # type: ignore[arg-type]
        last_seq=row.last_seq,
        parent_uid=row.parent_uid,
        fork_seq=row.fork_seq,
        labels=dict(row.labels),
        annotations=dict(row.annotations),
    )
    s.metadata.project = row.project
    s.metadata.name = row.name
    s.metadata.uid = row.uid
    if row.create_time_ns:
        s.metadata.create_time.FromNanoseconds(row.create_time_ns)
    if row.update_time_ns:
        s.metadata.update_time.FromNanoseconds(row.update_time_ns)
    s.compute_state = _COMPUTE.get(row.compute_state, session_pb2.COMPUTE_NONE)
    if view.pending_approval is not None:
        s.pending_approval.CopyFrom(view.pending_approval)
    if row.origin is not None:
        s.origin.CopyFrom(row.origin)
    if row.identity is not None:
        s.identity.CopyFrom(row.identity)
    return s
