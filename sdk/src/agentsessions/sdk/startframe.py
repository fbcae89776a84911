"""The Start frame, read without its history until the harness asks for it.

``Start.history`` holds every earlier event of the session (about five a turn), and parsing it
is most of a long session's per-turn cost on the harness side (0.4 ms for 4,000 events), even for
a harness that never looks at it. So the servicer parses a Start frame with a view message that
has every ``ControllerFrame``/``Start`` field but ``history``: the history stays unparsed bytes
(protobuf keeps fields a message does not declare), and :class:`LazyHistory` parses them as
``agentsessions.v1.Event``\\ s the first time the sequence is used.

The view messages are built here from the v1 descriptors (no generated code, nothing on the
wire): ``StartFrameView`` has the envelope (``session``, ``execution_id``) and ``start``;
``StartView`` has ``config``, ``inputs``, ``identity`` and ``resume_from_seq``, with the v1
message types, so ``inputs`` are ordinary ``agentsessions.v1.Message`` objects.

:class:`HeldHistories` keeps each session's history, still encoded, between its turns, for the
host's history-by-reference extension (``agentsessions.sdk.extensions``): a Start that names a
held base carries only the events after it, and the history is the held events, then those.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any, overload

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2, harness_pb2

_PACKAGE = "agentsessions.sdk.startframe"
_F = descriptor_pb2.FieldDescriptorProto


def _view_class() -> Any:
    pool = descriptor_pool.Default()
    name = f"{_PACKAGE}.StartFrameView"
    try:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
    except KeyError:
        pass
    file = descriptor_pb2.FileDescriptorProto(
        name="agentsessions/sdk/startframe.proto",
        package=_PACKAGE,
        syntax="proto3",
        dependency=[common_pb2.DESCRIPTOR.name, harness_pb2.DESCRIPTOR.name],
    )
    start_fields = harness_pb2.Start.DESCRIPTOR.fields_by_name
    frame_fields = harness_pb2.ControllerFrame.DESCRIPTOR.fields_by_name
    start = file.message_type.add(name="StartView")
    start.field.add(name="config", number=start_fields["config"].number, type=_F.TYPE_BYTES)
    start.field.add(
        name="inputs",
        number=start_fields["inputs"].number,
        type=_F.TYPE_MESSAGE,
        label=_F.LABEL_REPEATED,
        type_name="." + common_pb2.Message.DESCRIPTOR.full_name,
    )
    start.field.add(
        name="identity",
        number=start_fields["identity"].number,
        type=_F.TYPE_MESSAGE,
        type_name="." + harness_pb2.IdentityContext.DESCRIPTOR.full_name,
    )
    start.field.add(name="resume_from_seq", number=start_fields["resume_from_seq"].number, type=_F.TYPE_INT64)
    frame = file.message_type.add(name="StartFrameView")
    frame.field.add(name="session", number=frame_fields["session"].number, type=_F.TYPE_STRING)
    frame.field.add(name="execution_id", number=frame_fields["execution_id"].number, type=_F.TYPE_STRING)
    frame.field.add(
        name="start",
        number=frame_fields["start"].number,
        type=_F.TYPE_MESSAGE,
        type_name=f".{_PACKAGE}.StartView",
    )
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


_VIEW = _view_class()


def parse_start_frame(data: bytes) -> Any:
    """A first frame's bytes as a ``StartFrameView`` (``HasField("start")`` tells a Start frame)."""
    return _VIEW.FromString(data)


_DECLARED = ("config", "inputs", "identity", "resume_from_seq")


def history_fields(start_view: Any) -> bytes:
    """The encoded ``Start.history`` fields of a Start view (the fields it did not declare)."""
    rest = type(start_view)()
    rest.CopyFrom(start_view)
    for name in _DECLARED:
        rest.ClearField(name)
    return bytes(rest.SerializeToString())


@struct(frozen=True, eq=False)
class HeldHistory:
    """A session's history as one Start delivered it: the held history it extended (``base``),
    then this Start's own encoded events."""

    token: str  # the execution id of the Start
    base: HeldHistory | None
    encoded: bytes
    size: int  # bytes of the whole chain

    def chunks(self) -> list[bytes]:
        out: list[bytes] = []
        link: HeldHistory | None = self
        while link is not None:
            out.append(link.encoded)
            link = link.base
        out.reverse()
        return out


class HeldHistories:
    """The histories a harness process holds, one per session (the newest), at most ``max_bytes``
    of them: the sessions served least recently are dropped first."""

    def __init__(self, max_bytes: int = 64 * 1024 * 1024) -> None:
        self._max_bytes = max_bytes
        self._size = 0
        self._held: OrderedDict[str, HeldHistory] = OrderedDict()

    def take(
        self, session: str, execution_id: str, base: str, start_view: Any
    ) -> tuple[HeldHistory | None, bool]:
        """The history of a Start naming ``base`` ("" for none: it carries the whole history),
        and whether it is now held (None, False: ``base`` is not held here)."""
        parent: HeldHistory | None = None
        if base:
            parent = self._held.get(session)
            if parent is None or parent.token != base:
                return None, False
        encoded = history_fields(start_view)
        history = HeldHistory(execution_id, parent, encoded, len(encoded) + (parent.size if parent else 0))
        old = self._held.pop(session, None)
        if old is not None:
            self._size -= old.size
        if history.size > self._max_bytes:
            return history, False
        self._held[session] = history
        self._size += history.size
        while self._size > self._max_bytes:
            _, dropped = self._held.popitem(last=False)
            self._size -= dropped.size
        return history, True


class LazyHistory(Sequence[common_pb2.Event]):
    """``Start.history`` of a view (or of a held history), parsed on first use."""

    def __init__(self, start_view: Any = None, *, held: HeldHistory | None = None) -> None:
        self._view = start_view
        self._held = held
        self._events: Sequence[common_pb2.Event] | None = None

    def _parsed(self) -> Sequence[common_pb2.Event]:
        if self._events is None:
            if self._held is not None:
                encoded = b"".join(self._held.chunks())
            else:
                # The view re-serializes the fields it did not declare (the history) as it read them.
                encoded = self._view.SerializeToString()
            self._events = harness_pb2.Start.FromString(encoded).history
            self._view = self._held = None
        return self._events

    @overload
    def __getitem__(self, index: int) -> common_pb2.Event: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[common_pb2.Event]: ...

    def __getitem__(self, index: int | slice) -> common_pb2.Event | Sequence[common_pb2.Event]:
        return self._parsed()[index]

    def __len__(self) -> int:
        return len(self._parsed())

    def __iter__(self) -> Iterator[common_pb2.Event]:
        return iter(self._parsed())
