"""Journals dumped by the Go reference host as JSON (``eventlog.Record``, Go domain shape).

The journals under tests/fixtures/agentsessions-v0.1.2/ are arrays of
``{"Seq", "PrevHash", "Hash", "Fence", "Event"}`` where ``Event`` uses Go field names and domain
enum strings (``"Kind": "INPUT"``). ``load_records`` turns such a dump into wire ``Event``s the way
the Go host's domain-to-proto conversion does (null and zero values omitted, spec 3.3), so that the
stored ``Hash`` of every record recomputes with the spec 3.2 formula.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, cast

from google.protobuf import struct_pb2
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from agentsessions.host.journal.canon import normalize_event
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2

__all__ = ["GoJournalError", "GoRecord", "event_from_go", "load_records", "to_log_records"]

# Go's zero time.Time, which the domain uses for "no timestamp".
_GO_ZERO_TIME: Final = "0001-01-01T00:00:00Z"

# Go field names whose proto field is not simply the snake_case spelling, per message type.
_RENAMED: Final[Mapping[str, Mapping[str, str]]] = {
    "agentsessions.v1.Event": {
        "Timestamp": "ts",
        "ModelCall": "model",
        "ToolCall": "tool",
        "Err": "error",
    },
    "agentsessions.v1.ReasoningPart": {"Opaque": "opaque_bytes"},
}

# Go-side fields with no wire form: wire-only request fields the writer strips (spec 3.3) and the
# transient decision a Go ToolResult carries.
_DROPPED: Final[Mapping[str, frozenset[str]]] = {
    "agentsessions.v1.ModelCall": frozenset({"Messages", "Tools", "ToolChoice"}),
    "agentsessions.v1.ToolResult": frozenset({"Approval"}),
}

_WORD: Final = re.compile(r"[A-Z]+(?=[A-Z][a-z0-9]|$)|[A-Z]?[a-z0-9]+|[A-Z]+")


class GoJournalError(ValueError):
    """A Go journal dump that does not have the expected shape."""


@struct(frozen=True)
class GoRecord:
    """One record of a Go journal dump, its event converted to the wire message."""

    seq: int
    prev_hash: str
    hash: str
    fence: int
    event: common_pb2.Event


def _snake(go_name: str) -> str:
    """``ExecutionID`` -> ``execution_id``, ``SnapshotExternalURI`` -> ``snapshot_external_uri``."""
    return "_".join(w.lower() for w in _WORD.findall(go_name))


def _enum_number(fd: FieldDescriptor, value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise GoJournalError(f"{where}: expected an enum name or number, got {value!r}")
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        raise GoJournalError(f"{where}: expected an enum name or number, got {value!r}")
    if value == "":
        return 0
    enum = fd.enum_type
    if enum is None:
        raise GoJournalError(f"{where}: field {fd.name} has no enum type")
    by_name = enum.values_by_name
    if value in by_name:
        return int(by_name[value].number)
    # Domain strings drop the enum's common prefix: "INPUT" is EVENT_INPUT, "SUSPEND" is
    # LIFECYCLE_SUSPEND.
    names = list(by_name)
    prefix = min(names)
    for n in names:
        while not n.startswith(prefix):
            prefix = prefix[:-1]
    prefix = prefix[: prefix.rfind("_") + 1]
    if prefix + value in by_name:
        return int(by_name[prefix + value].number)
    raise GoJournalError(f"{where}: {value!r} is not a value of {enum.full_name}")


def _set_struct(target: struct_pb2.Struct, value: Any, where: str) -> None:
    if not isinstance(value, dict):
        raise GoJournalError(f"{where}: expected a JSON object, got {value!r}")
    target.Clear()
    target.update(value)


def _fill(msg: Message, go: Mapping[str, Any], where: str) -> None:
    desc = msg.DESCRIPTOR
    renamed = _RENAMED.get(desc.full_name, {})
    dropped = _DROPPED.get(desc.full_name, frozenset())
    for go_name, value in go.items():
        if go_name in dropped:
            continue
        proto_name = renamed.get(go_name) or _snake(go_name)
        fd = cast("FieldDescriptor | None", desc.fields_by_name.get(proto_name))
        if fd is None:
            raise GoJournalError(f"{where}.{go_name}: no field {proto_name!r} in {desc.full_name}")
        _set_field(msg, fd, value, f"{where}.{go_name}")


def _set_field(msg: Message, fd: FieldDescriptor, value: Any, where: str) -> None:
    if value is None:
        return  # nil pointer, slice or map: absent
    name = fd.name
    if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
        if not isinstance(value, dict):
            raise GoJournalError(f"{where}: expected a JSON object, got {value!r}")
        target_map = getattr(msg, name)
        for key, item in value.items():
            target_map[key] = item
        return
    if fd.is_repeated:
        if not isinstance(value, list):
            raise GoJournalError(f"{where}: expected a JSON array, got {value!r}")
        items = getattr(msg, name)
        for i, item in enumerate(value):
            if fd.type == FieldDescriptor.TYPE_MESSAGE:
                if not isinstance(item, dict):
                    raise GoJournalError(f"{where}[{i}]: expected a JSON object, got {item!r}")
                _fill(items.add(), item, f"{where}[{i}]")
            else:
                items.append(item)
        return
    if fd.message_type is not None:
        full_name = fd.message_type.full_name
        if full_name == "google.protobuf.Timestamp":
            if not isinstance(value, str):
                raise GoJournalError(f"{where}: expected an RFC 3339 time, got {value!r}")
            if value != _GO_ZERO_TIME:
                getattr(msg, name).FromJsonString(value)
            return
        if full_name == "google.protobuf.Struct":
            _set_struct(getattr(msg, name), value, where)
            return
        if not isinstance(value, dict):
            raise GoJournalError(f"{where}: expected a JSON object, got {value!r}")
        sub = getattr(msg, name)
        sub.SetInParent()  # a non-nil Go pointer is present even when every field is zero
        _fill(sub, value, where)
        return
    if fd.type == FieldDescriptor.TYPE_ENUM:
        setattr(msg, name, _enum_number(fd, value, where))
        return
    if fd.type == FieldDescriptor.TYPE_BYTES:
        if not isinstance(value, str):
            raise GoJournalError(f"{where}: expected base64 bytes, got {value!r}")
        decoded = base64.b64decode(value, validate=True)
        if decoded or fd.has_presence:
            setattr(msg, name, decoded)
        return
    # Scalars: Go zero values of fields without presence vanish on the wire anyway; explicit-presence
    # fields (ExecutionStart.input_count is a Go pointer) keep a present zero.
    setattr(msg, name, value)


def event_from_go(go_event: Mapping[str, Any]) -> common_pb2.Event:
    """The wire ``Event`` the Go host stores for a domain event dumped as JSON (normalized, spec 3.3)."""
    ev = common_pb2.Event()
    _fill(ev, go_event, "Event")
    return normalize_event(ev)


def _int(record: Mapping[str, Any], key: str, where: str) -> int:
    value = record.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise GoJournalError(f"{where}.{key}: expected an integer, got {value!r}")
    return value


def _str(record: Mapping[str, Any], key: str, where: str) -> str:
    value = record.get(key)
    if not isinstance(value, str):
        raise GoJournalError(f"{where}.{key}: expected a string, got {value!r}")
    return value


def load_records(source: str | Path | Sequence[Mapping[str, Any]]) -> list[GoRecord]:
    """Records of a Go journal dump: a path to the JSON file, or the already parsed array.

    Reading a file is blocking IO: call it off the event loop (``asyncio.to_thread``) in a server."""
    if isinstance(source, str | Path):
        data: Any = json.loads(Path(source).read_text(encoding="utf-8"))
    else:
        data = source
    if not isinstance(data, list):
        raise GoJournalError("a Go journal dump is a JSON array of records")
    records: list[GoRecord] = []
    for i, record in enumerate(data):
        where = f"record[{i}]"
        if not isinstance(record, dict):
            raise GoJournalError(f"{where}: expected a JSON object")
        go_event = record.get("Event")
        if not isinstance(go_event, dict):
            raise GoJournalError(f"{where}.Event: expected a JSON object")
        records.append(
            GoRecord(
                seq=_int(record, "Seq", where),
                prev_hash=_str(record, "PrevHash", where),
                hash=_str(record, "Hash", where),
                fence=_int(record, "Fence", where),
                event=event_from_go(go_event),
            )
        )
    return records


def to_log_records(records: Sequence[GoRecord]) -> list[common_pb2.LogRecord]:
    """The records as wire ``LogRecord``s, stored hashes verbatim."""
    return [
        common_pb2.LogRecord(
            seq=r.seq, prev_hash=r.prev_hash, content_hash=r.hash, fence=r.fence, event=r.event
        )
        for r in records
    ]
