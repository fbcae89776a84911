"""Canonical form of journal records (spec 3.2) and the normalizations applied before storing (3.3).

The chain hash of a record is::

    lc_hex(SHA-256(JCS({"event": proto3-JSON(Event), "prev_hash": prev, "seq": str(seq)})))

where proto3-JSON is ``json_format.MessageToDict(ev, preserving_proto_field_name=True)`` and JCS is
RFC 8785. ``reference_canonical_json`` computes exactly that with the ``rfc8785`` package. The hot path
(``canonical_json``) walks the message directly and writes the same bytes several times faster; the
property tests in tests/journal/test_canon.py hold it byte-identical to the reference. Anything the
direct writer does not model (float32 fields, Any, wrappers, extensions, NaN/Infinity in a Struct)
falls back to the reference, so the two can differ only in speed.
"""

from __future__ import annotations

import base64
import hashlib
import json.encoder
import math
from collections.abc import Callable
from typing import Any, Final

import rfc8785
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from agentsessions.v1 import common_pb2

__all__ = [
    "canonical_event",
    "canonical_json",
    "chain_hash",
    "content_hash",
    "normalize_event",
    "reference_canonical_json",
    "reference_content_hash",
    "spec_digest",
]

# JSON string literal with RFC 8785 escaping: '"' and '\\' escaped, the control characters below
# U+0020 as \b \f \n \r \t or \u00xx (lowercase hex), everything else verbatim. The stdlib's
# non-ASCII encoder (C accelerated) escapes exactly that set.
_quote: Final[Callable[[str], str]] = json.encoder.encode_basestring

_T = FieldDescriptor
_INT64_TYPES: Final = frozenset(
    {_T.TYPE_INT64, _T.TYPE_UINT64, _T.TYPE_SINT64, _T.TYPE_FIXED64, _T.TYPE_SFIXED64}
)
_INT32_TYPES: Final = frozenset(
    {_T.TYPE_INT32, _T.TYPE_UINT32, _T.TYPE_SINT32, _T.TYPE_FIXED32, _T.TYPE_SFIXED32}
)
_TIME_TYPES: Final = frozenset({"google.protobuf.Timestamp", "google.protobuf.Duration"})
_TWO_53: Final = 2.0**53

_Out = list[str]
_Writer = Callable[[Any, _Out], None]


class _Unmodelled(Exception):
    """The direct writer does not model this value; the caller falls back to the reference."""


# -- reference path ---------------------------------------------------------------------------


def reference_canonical_json(msg: Message) -> bytes:
    """RFC 8785 JCS of proto3-JSON(msg), computed with ``json_format`` and the ``rfc8785`` package."""
    as_dict = json_format.MessageToDict(msg, preserving_proto_field_name=True)
    return rfc8785.dumps(as_dict)


# -- direct writer ----------------------------------------------------------------------------


def _es6_number(x: float) -> str:
    """ECMAScript Number::toString of a finite double, as RFC 8785 3.2.2.3 requires."""
    if x != x or x in (math.inf, -math.inf):
        raise _Unmodelled("NaN and Infinity have no JSON form")
    if x == 0:
        return "0"  # -0 serializes as 0
    if x.is_integer() and -_TWO_53 < x < _TWO_53:
        # Every integer below 2**53 is exact and its shortest round-trip digits are all of it.
        return str(int(x))
    sign = "-" if x < 0 else ""
    # repr gives the shortest digit string that round-trips (the ES6 choice of s, k and n).
    mantissa, _, exp = repr(abs(x)).partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = whole + frac
    point = len(whole) + (int(exp) if exp else 0)
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    digits = stripped.rstrip("0")
    k = len(digits)
    if k <= point <= 21:
        return sign + digits + "0" * (point - k)
    if 0 < point <= 21:
        return sign + digits[:point] + "." + digits[point:]
    if -6 < point <= 0:
        return sign + "0." + "0" * -point + digits
    e = point - 1
    exponent = ("e+" if e >= 0 else "e-") + str(abs(e))
    if k == 1:
        return sign + digits + exponent
    return sign + digits[0] + "." + digits[1:] + exponent


def _utf16_key(key: str) -> bytes:
    """Sort key ordering object members by UTF-16 code units (RFC 8785 3.2.3)."""
    return key.encode("utf-16-be")


def _write_value(value: Any, out: _Out) -> None:
    """google.protobuf.Value."""
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        out.append(_quote(value.string_value))
    elif kind == "number_value":
        out.append(_es6_number(value.number_value))
    elif kind == "struct_value":
        _write_struct(value.struct_value, out)
    elif kind == "bool_value":
        out.append("true" if value.bool_value else "false")
    elif kind == "list_value":
        _write_list_value(value.list_value, out)
    else:  # null_value, or no kind set (json_format renders both as null)
        out.append("null")


def _write_struct(struct: Any, out: _Out) -> None:
    fields = struct.fields
    if not fields:
        out.append("{}")
        return
    sep = "{"
    for key in sorted(fields, key=_utf16_key):
        out.append(sep)
        out.append(_quote(key))
        out.append(":")
        _write_value(fields[key], out)
        sep = ","
    out.append("}")


def _write_list_value(list_value: Any, out: _Out) -> None:
    values = list_value.values
    if not values:
        out.append("[]")
        return
    sep = "["
    for item in values:
        out.append(sep)
        _write_value(item, out)
        sep = ","
    out.append("]")


def _write_time(msg: Any, out: _Out) -> None:
    out.append(_quote(msg.ToJsonString()))


def _message_writer(full_name: str) -> _Writer:
    if full_name in _TIME_TYPES:
        return _write_time
    if full_name == "google.protobuf.Struct":
        return _write_struct
    if full_name == "google.protobuf.Value":
        return _write_value
    if full_name == "google.protobuf.ListValue":
        return _write_list_value
    if full_name.startswith("google.protobuf."):
        return _write_unmodelled  # Any, wrappers, FieldMask, Empty: rare, left to the reference
    return _write_message


def _write_unmodelled(value: Any, out: _Out) -> None:
    raise _Unmodelled(type(value).__name__)


def _write_string(value: str, out: _Out) -> None:
    out.append(_quote(value))


def _write_bytes(value: bytes, out: _Out) -> None:
    out.append('"' + base64.b64encode(value).decode("ascii") + '"')


def _write_bool(value: bool, out: _Out) -> None:
    out.append("true" if value else "false")


def _write_int(value: int, out: _Out) -> None:
    out.append(str(value))


def _write_int64(value: int, out: _Out) -> None:
    out.append('"' + str(value) + '"')


def _write_double(value: float, out: _Out) -> None:
    if value != value or value in (math.inf, -math.inf):
        raise _Unmodelled("non-finite double field")
    out.append(_es6_number(value))


def _enum_writer(fd: FieldDescriptor) -> _Writer:
    enum = fd.enum_type
    if enum is None or enum.full_name == "google.protobuf.NullValue":
        return _write_unmodelled
    names = {v.number: _quote(v.name) for v in enum.values}

    def write(value: int, out: _Out) -> None:
        # An open enum's unknown number is rendered as the number itself.
        out.append(names.get(value) or str(value))

    return write


def _scalar_writer(fd: FieldDescriptor) -> _Writer:
    t = fd.type
    if t == _T.TYPE_MESSAGE or t == _T.TYPE_GROUP:
        return _write_unmodelled if fd.message_type is None else _message_writer(fd.message_type.full_name)
    if t == _T.TYPE_STRING:
        return _write_string
    if t == _T.TYPE_BYTES:
        return _write_bytes
    if t == _T.TYPE_BOOL:
        return _write_bool
    if t == _T.TYPE_ENUM:
        return _enum_writer(fd)
    if t in _INT64_TYPES:
        return _write_int64
    if t in _INT32_TYPES:
        return _write_int
    if t == _T.TYPE_DOUBLE:
        return _write_double
    return _write_unmodelled  # float32 needs json_format's shortest-float rounding


def _map_writer(entry: Descriptor) -> _Writer:
    write_item = _scalar_writer(entry.fields_by_name["value"])

    def write(mapping: Any, out: _Out) -> None:
        keyed = []
        for key in mapping:
            name = ("true" if key else "false") if isinstance(key, bool) else str(key)
            keyed.append((_utf16_key(name), name, key))
        keyed.sort()
        sep = "{"
        for _, name, key in keyed:
            out.append(sep)
            out.append(_quote(name))
            out.append(":")
            write_item(mapping[key], out)
            sep = ","
        out.append("}")

    return write


def _repeated_writer(fd: FieldDescriptor) -> _Writer:
    write_item = _scalar_writer(fd)

    def write(items: Any, out: _Out) -> None:
        sep = "["
        for item in items:
            out.append(sep)
            write_item(item, out)
            sep = ","
        out.append("]")

    return write


# Per-field plan: the '"name":' member prefix and the value writer, built on first use.
_PLANS: dict[FieldDescriptor, tuple[str, _Writer]] = {}


def _plan(fd: FieldDescriptor) -> tuple[str, _Writer]:
    if fd.is_extension:
        writer: _Writer = _write_unmodelled
    elif fd.message_type is not None and fd.message_type.GetOptions().map_entry:
        writer = _map_writer(fd.message_type)
    elif fd.is_repeated:
        writer = _repeated_writer(fd)
    else:
        writer = _scalar_writer(fd)
    plan = (_quote(fd.name) + ":", writer)
    _PLANS[fd] = plan
    return plan


def _field_name(item: tuple[FieldDescriptor, Any]) -> str:
    return item[0].name


def _write_message(msg: Any, out: _Out) -> None:
    fields = msg.ListFields()
    if not fields:
        out.append("{}")
        return
    if len(fields) > 1:
        # Proto field names are ASCII identifiers: code point order is UTF-16 order.
        fields.sort(key=_field_name)
    sep = "{"
    plans = _PLANS
    for fd, value in fields:
        plan = plans.get(fd) or _plan(fd)
        out.append(sep)
        out.append(plan[0])
        plan[1](value, out)
        sep = ","
    out.append("}")


def canonical_json(msg: Message) -> bytes:
    """RFC 8785 JCS of proto3-JSON(msg); byte-identical to ``reference_canonical_json``."""
    out: _Out = []
    try:
        _message_writer(msg.DESCRIPTOR.full_name)(msg, out)
    except _Unmodelled:
        return reference_canonical_json(msg)
    return "".join(out).encode("utf-8")


# -- chain ------------------------------------------------------------------------------------


def canonical_event(ev: common_pb2.Event) -> bytes:
    """JCS of the event alone: the ``"event"`` member of the hashed envelope."""
    return canonical_json(ev)


def chain_hash(event_json: bytes, prev_hash: str, seq: int) -> str:
    """content_hash from an event's canonical bytes (see ``canonical_event``), prev hash and seq.

    The envelope's keys "event" < "prev_hash" < "seq" are already in JCS order, so the canonical
    envelope is assembled around the event bytes instead of re-canonicalizing them."""
    envelope = b"".join(
        (
            b'{"event":',
            event_json,
            b',"prev_hash":',
            _quote(prev_hash).encode("utf-8"),
            b',"seq":"',
            str(seq).encode("ascii"),
            b'"}',
        )
    )
    return hashlib.sha256(envelope).hexdigest()


def content_hash(ev: common_pb2.Event, prev_hash: str, seq: int) -> str:
    """Spec 3.2 content_hash of the (already normalized, as stored) event at ``seq`` after ``prev_hash``."""
    return chain_hash(canonical_json(ev), prev_hash, seq)


def reference_content_hash(ev: common_pb2.Event, prev_hash: str, seq: int) -> str:
    """content_hash computed entirely by json_format + rfc8785 (for tests and audits)."""
    envelope: dict[str, Any] = {
        "event": json_format.MessageToDict(ev, preserving_proto_field_name=True),
        "prev_hash": prev_hash,
        "seq": str(seq),
    }
    return hashlib.sha256(rfc8785.dumps(envelope)).hexdigest()


def spec_digest(msg: Message) -> str:
    """The HarnessRegistration spec digest: ``"sha256:" + lc_hex(SHA-256(JCS(proto3-JSON(msg))))``."""
    return "sha256:" + hashlib.sha256(canonical_json(msg)).hexdigest()


# -- normalization (spec 3.3) -----------------------------------------------------------------

_WIRE_ONLY_MODEL_FIELDS: Final = ("messages", "tools", "tool_choice")


def normalize_event(ev: common_pb2.Event) -> common_pb2.Event:
    """The event as the reference writer would store it (spec 3.3); never mutates ``ev``.

    * an all-empty ``actor`` is dropped;
    * ``ModelCall.messages``, ``tools`` and ``tool_choice`` are wire-only and stripped;
    * ``FilePart.source`` and ``ReasoningPart.opaque`` stay set only when their value is non-empty
      (in every part: message, tool result content, reasoning summaries).

    Returns ``ev`` itself when it is already normal, otherwise a normalized copy."""
    if not _fix_event(ev, mutate=False):
        return ev
    fixed = common_pb2.Event()
    fixed.CopyFrom(ev)
    _fix_event(fixed, mutate=True)
    return fixed


def _fix_event(ev: common_pb2.Event, *, mutate: bool) -> bool:
    """Whether ``ev`` needs normalizing; with ``mutate`` also normalizes it in place."""
    changed = False
    if ev.HasField("actor"):
        actor = ev.actor
        if not (actor.principal or actor.issuer or actor.subject):
            if not mutate:
                return True
            ev.ClearField("actor")
            changed = True
    body = ev.WhichOneof("body")
    if body == "message":
        changed = _fix_parts(ev.message.parts, mutate=mutate) or changed
    elif body == "result":
        changed = _fix_parts(ev.result.content, mutate=mutate) or changed
    elif body == "model":
        model = ev.model
        if len(model.messages) or len(model.tools) or model.HasField("tool_choice"):
            if not mutate:
                return True
            for name in _WIRE_ONLY_MODEL_FIELDS:
                model.ClearField(name)
            changed = True
    return changed


def _fix_parts(parts: Any, *, mutate: bool) -> bool:
    changed = False
    for part in parts:
        kind = part.WhichOneof("part")
        if kind == "file":
            source = part.file.WhichOneof("source")
            if (source == "bytes" and not part.file.bytes) or (source == "uri" and not part.file.uri):
                if not mutate:
                    return True
                part.file.ClearField("source")
                changed = True
        elif kind == "reasoning":
            reasoning = part.reasoning
            opaque = reasoning.WhichOneof("opaque")
            if (opaque == "opaque_bytes" and not reasoning.opaque_bytes) or (
                opaque == "opaque_uri" and not reasoning.opaque_uri
            ):
                if not mutate:
                    return True
                reasoning.ClearField("opaque")
                changed = True
            if _fix_parts(reasoning.summary, mutate=mutate):
                if not mutate:
                    return True
                changed = True
        elif kind == "tool_result" and _fix_parts(part.tool_result.content, mutate=mutate):
            if not mutate:
                return True
            changed = True
    return changed
