"""The wire ``Session`` of a controller view: the one place a session becomes a proto message."""

from __future__ import annotations

from agentsessions.host.controller.state import SessionView
from agentsessions.host.journal.listed import make_room
from agentsessions.host.journal.store import KEPT_LISTED, SessionRow
from agentsessions.v1 import session_pb2

_NANOS = 1_000_000_000
_COMPUTE = {
    "NONE": session_pb2.COMPUTE_NONE,
    "LIVE": session_pb2.COMPUTE_LIVE,
    "COLD": session_pb2.COMPUTE_COLD,
}


def session_proto(view: SessionView) -> session_pb2.Session:
    """The wire Session for a view (every response and Exec frame that carries one)."""
    s = session_pb2.Session()
    fill_session(s, view)
    return s


def fill_session(s: session_pb2.Session, view: SessionView) -> None:
    """Write a view's Session into ``s``, an empty message (a listing's ``sessions.add()``: built
    in place, no copy on append)."""
    row = view.row
    # Plain field stores: a listing converts up to 500 of these, and the constructor's map
    # arguments and Timestamp.FromNanoseconds cost more than the rest of the message together.
    s.harness = row.harness
    s.model = row.model
    s.exec_state = view.exec_state  # type: ignore[assignment]
    s.compute_state = _COMPUTE.get(row.compute_state, session_pb2.COMPUTE_NONE)
    s.last_seq = row.last_seq
    s.parent_uid = row.parent_uid
    s.fork_seq = row.fork_seq
    # Item by item: a map's update() is the Python mixin's, twice the cost for a few entries.
    if row.labels:
        labels = s.labels
        for key, value in row.labels.items():
            labels[key] = value
    if row.annotations:
        annotations = s.annotations
        for key, value in row.annotations.items():
            annotations[key] = value
    meta = s.metadata
    meta.project = row.project
    meta.name = row.name
    meta.uid = row.uid
    if row.create_time_ns:
        meta.create_time.seconds, meta.create_time.nanos = divmod(row.create_time_ns, _NANOS)
    if row.update_time_ns:
        meta.update_time.seconds, meta.update_time.nanos = divmod(row.update_time_ns, _NANOS)
    if view.pending_approval is not None:
        s.pending_approval.CopyFrom(view.pending_approval)
    if row.origin is not None:
        s.origin.CopyFrom(row.origin)
    if row.identity is not None:
        s.identity.CopyFrom(row.identity)


class SessionWire:
    """Listed sessions as a page carries them (``ListSessionsResponse.sessions``: the field's tag,
    the Session's length, then ``session_proto(view)`` encoded), one a session, kept beside the row
    each was made from.

    A store that keeps a listed row decoded while it is unchanged gives the same :class:`SessionRow`
    object for it page after page (``journal.listed``); its Session's bytes are then the same too,
    as long as its derived state is (the view's ``exec_state``: whether a turn runs on this host;
    the pending approval follows from the row). A row made anew (a changed row, or a store that
    keeps none) is encoded anew and takes its session's place. Bounded: the oldest half goes when
    it fills."""

    def __init__(self, capacity: int = KEPT_LISTED) -> None:
        self.capacity = capacity  # sessions; 0: keep none
        self._kept: dict[str, tuple[SessionRow, int, bytes]] = {}
        self.encoded = 0  # Sessions encoded, not found here (stats, tests)

    def framed(self, views: list[SessionView]) -> list[bytes]:
        """Each view's Session as a page carries it, in order."""
        kept = self._kept
        found = []
        for view in views:
            row = view.row
            entry = kept.get(row.uid)
            if entry is not None and entry[0] is row and entry[1] == view.exec_state:
                found.append(entry[2])
                continue
            # A page of one: protobuf writes the field's tag and the Session's length itself.
            one = session_pb2.ListSessionsResponse()
            fill_session(one.sessions.add(), view)
            data = one.SerializeToString()
            self.encoded += 1
            found.append(data)
            if entry is None:
                make_room(kept, 1, self.capacity)
                if len(kept) >= self.capacity:
                    continue  # keeps none
            kept[row.uid] = (row, view.exec_state, data)
        return found

    def clear(self) -> None:
        self._kept.clear()
