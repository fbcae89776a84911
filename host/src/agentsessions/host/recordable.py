"""What a record may hold so the journal can hash it and every reader can decode it again.

Checked before anything is written: on a client's inputs by the service layer (INVALID_ARGUMENT
naming the field), and on every event the controller appends, whatever produced it (a harness
frame, a model answer, a tool result):

* **finite numbers**: a ``google.protobuf.Value`` number must be finite, since the chain hash is
  computed over JSON (spec 3.2), which has no NaN or Infinity;
* **bounded nesting**: ``Struct``/``ListValue`` nested at most :data:`MAX_STRUCT_DEPTH` levels.
  Each level is two or three protobuf messages on the wire, and a record travels inside other
  messages (``ExecUpdate``, ``LogRecord``, a harness's ``Start.history``), so a value the request
  parser still accepted could be one the protobuf runtime's 100-message limit refuses on the way
  back out;
* **token counts** of a ``Usage`` are not negative.

The record size limit is the host's (``agentsessions.host.limits``); :func:`fault` only reads
the message.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any, Final

from google.protobuf import descriptor as d
from google.protobuf import message, struct_pb2

from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2

__all__ = ["MAX_STRUCT_DEPTH", "Fault", "fault"]

MAX_STRUCT_DEPTH: Final = 20

_STRUCT: Final = struct_pb2.Struct.DESCRIPTOR.full_name
_VALUE: Final = struct_pb2.Value.DESCRIPTOR.full_name
_LIST: Final = struct_pb2.ListValue.DESCRIPTOR.full_name
_JSON_TYPES: Final = frozenset({_STRUCT, _VALUE, _LIST})
_USAGE: Final = common_pb2.Usage.DESCRIPTOR.full_name
_TOKEN_FIELDS: Final = ("input_tokens", "output_tokens", "reasoning_tokens")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@struct(frozen=True)
class Fault:
    """The first field that breaks a rule, as a path below the checked message."""

    path: str
    rule: str


class _Refused(Exception):
    def __init__(self, path: str, rule: str) -> None:
        super().__init__(rule)
        self.path = path
        self.rule = rule


def fault(msg: message.Message, path: str = "") -> Fault | None:
    """The first value of ``msg`` that cannot be journaled, or None."""
    if not _holds_checked(msg.DESCRIPTOR):
        return None
    try:
        _walk(msg, path, 0)
    except _Refused as refused:
        return Fault(refused.path, refused.rule)
    return None


@functools.cache
def _holds_checked(desc: d.Descriptor) -> bool:
    """Whether a message type can hold a JSON value or a Usage anywhere below it (cached per type,
    so the walk skips the many message types that cannot)."""
    seen: set[str] = set()
    pending = [desc]
    while pending:
        current = pending.pop()
        if current.full_name in seen:
            continue
        seen.add(current.full_name)
        if current.full_name in _JSON_TYPES or current.full_name == _USAGE:
            return True
        pending.extend(f.message_type for f in current.fields if f.message_type is not None)
    return False


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _walk(msg: message.Message, path: str, depth: int) -> None:
    name = msg.DESCRIPTOR.full_name
    if name in _JSON_TYPES:
        _json(msg, path, 0)
        return
    if name == _USAGE:
        for token_field in _TOKEN_FIELDS:
            count = getattr(msg, token_field)
            if count < 0:
                raise _Refused(_join(path, token_field), f"a token count must not be negative, got {count}")
        return
    for field, value in msg.ListFields():
        if field.message_type is None or not _holds_checked(field.message_type):
            continue
        here = _join(path, field.name)
        if field.message_type.GetOptions().map_entry:
            for key, item in value.items():
                if isinstance(item, message.Message):
                    _walk(item, f"{here}[{key!r}]", depth)
        elif field.is_repeated:
            for i, item in enumerate(value):
                _walk(item, f"{here}[{i}]", depth)
        else:
            _walk(value, here, depth)


def _json(msg: Any, path: str, level: int) -> None:
    """A Struct, ListValue or Value, ``level`` JSON containers deep."""
    if isinstance(msg, struct_pb2.Struct):
        if level >= MAX_STRUCT_DEPTH:
            raise _Refused(path, f"JSON values nest deeper than {MAX_STRUCT_DEPTH} levels")
        for key, value in msg.fields.items():
            _json(value, _key(path, key), level + 1)
    elif isinstance(msg, struct_pb2.ListValue):
        if level >= MAX_STRUCT_DEPTH:
            raise _Refused(path, f"JSON values nest deeper than {MAX_STRUCT_DEPTH} levels")
        for i, value in enumerate(msg.values):
            _json(value, f"{path}[{i}]", level + 1)
    else:
        kind = msg.WhichOneof("kind")
        if kind == "number_value":
            number = msg.number_value
            if math.isnan(number) or math.isinf(number):
                raise _Refused(path, f"{number} is not a JSON number (the journal hashes JSON)")
        elif kind == "struct_value":
            _json(msg.struct_value, path, level)
        elif kind == "list_value":
            _json(msg.list_value, path, level)


def _key(path: str, key: str) -> str:
    if _IDENTIFIER.match(key):
        return _join(path, key)
    return f"{path}[{key!r}]"
