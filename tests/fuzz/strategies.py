"""Hypothesis strategies for request bytes a client can put on the wire.

``messages(descriptor)`` draws any message of a type, field by field from its descriptor (every
scalar's extremes, unknown enum values, nested and repeated fields, maps, deep ``Struct`` values
with NaN and infinities); ``wire(descriptor, known)`` serializes one and sometimes breaks the bytes
the way a buggy or hostile client would (invalid UTF-8 in a string field, a truncated or corrupt
message, random bytes). ``known`` values (real session uids, execution ids) are mixed into string
fields so a fair share of calls reaches real sessions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from google.protobuf import descriptor as d
from google.protobuf import message, struct_pb2
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

INT64 = (-(2**63), 2**63 - 1)
INT32 = (-(2**31), 2**31 - 1)
UINT64 = (0, 2**64 - 1)
UINT32 = (0, 2**32 - 1)
MAX_DEPTH = 4
MAX_REPEATED = 3

_INTS = {
    d.FieldDescriptor.TYPE_INT64: INT64,
    d.FieldDescriptor.TYPE_SINT64: INT64,
    d.FieldDescriptor.TYPE_SFIXED64: INT64,
    d.FieldDescriptor.TYPE_INT32: INT32,
    d.FieldDescriptor.TYPE_SINT32: INT32,
    d.FieldDescriptor.TYPE_SFIXED32: INT32,
    d.FieldDescriptor.TYPE_UINT64: UINT64,
    d.FieldDescriptor.TYPE_FIXED64: UINT64,
    d.FieldDescriptor.TYPE_UINT32: UINT32,
    d.FieldDescriptor.TYPE_FIXED32: UINT32,
}

# Text that has broken parsers before: empty, NUL, separators, path tricks, very long, non-ASCII.
_TRICKY = st.sampled_from(
    ["", "\x00", " ", "..", "../x", "sess-", "-1", "9223372036854775808", "a" * 300, "é", "\u202e", "\ud7ff"]
)


def _integers(bounds: tuple[int, int]) -> st.SearchStrategy[int]:
    low, high = bounds
    return st.one_of(
        st.sampled_from([low, high, 0, -1, 1] if low < 0 else [high, 0, 1]), st.integers(low, high)
    )


def _text(known: Sequence[str]) -> st.SearchStrategy[str]:
    choices: list[st.SearchStrategy[str]] = [_TRICKY, st.text(max_size=40)]
    if known:
        choices.append(st.sampled_from(list(known)))
    return st.one_of(*choices)


def _json_number() -> st.SearchStrategy[float]:
    return st.one_of(
        st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 2.0**53, 2.0**53 + 2, 1e308]),
        st.floats(allow_nan=True, allow_infinity=True),
    )


def struct_values(depth: int = 0) -> st.SearchStrategy[Any]:
    """Python values for a Struct: nests deep (past what JSON encoders allow) and holds NaN/Inf."""
    leaves = st.one_of(st.none(), st.booleans(), _json_number(), st.text(max_size=10))
    if depth >= 40:
        return leaves
    return st.one_of(
        leaves,
        st.lists(st.deferred(lambda: struct_values(depth + 8)), max_size=2),
        st.dictionaries(st.text(max_size=5), st.deferred(lambda: struct_values(depth + 8)), max_size=2),
    )


def _fill_struct(target: message.Message, value: Any) -> None:
    if isinstance(target, struct_pb2.Struct):
        target.update(value if isinstance(value, dict) else {"v": value})
    elif isinstance(target, struct_pb2.Value):
        if isinstance(value, dict):
            target.struct_value.update(value)
        elif isinstance(value, list):
            target.list_value.extend(value)
        elif value is None:
            target.null_value = struct_pb2.NULL_VALUE
        elif isinstance(value, bool):
            target.bool_value = value
        elif isinstance(value, float):
            target.number_value = value
        else:
            target.string_value = str(value)


def messages(
    descriptor: d.Descriptor, known: Sequence[str] = (), depth: int = 0
) -> st.SearchStrategy[message.Message]:
    """Any message of ``descriptor``'s type (depth-bounded), built through the generated class."""
    cls = GetMessageClass(descriptor)

    if descriptor.full_name in ("google.protobuf.Struct", "google.protobuf.Value"):

        def build_struct(value: Any) -> message.Message:
            built = cls()
            _fill_struct(built, value)
            return built

        return st.builds(build_struct, struct_values())

    fields = [f for f in descriptor.fields if depth < MAX_DEPTH or f.type != d.FieldDescriptor.TYPE_MESSAGE]

    @st.composite
    def build(draw: st.DrawFn) -> message.Message:
        built = cls()
        for field in fields:
            if not draw(st.booleans()):
                continue
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                key_field = field.message_type.fields_by_name["key"]
                value_field = field.message_type.fields_by_name["value"]
                target = getattr(built, field.name)
                for _ in range(draw(st.integers(0, MAX_REPEATED))):
                    key = draw(_scalar(key_field, known))
                    if value_field.message_type is not None:
                        target[key].CopyFrom(draw(messages(value_field.message_type, known, depth + 1)))
                    else:
                        target[key] = draw(_scalar(value_field, known))
                continue
            repeated = field.is_repeated
            count = draw(st.integers(0, MAX_REPEATED)) if repeated else 1
            for _ in range(count):
                if field.message_type is not None:
                    value = draw(messages(field.message_type, known, depth + 1))
                    if repeated:
                        getattr(built, field.name).add().CopyFrom(value)
                    else:
                        getattr(built, field.name).CopyFrom(value)
                else:
                    scalar = draw(_scalar(field, known))
                    if repeated:
                        getattr(built, field.name).append(scalar)
                    else:
                        setattr(built, field.name, scalar)
        return built

    return build()


def _scalar(field: d.FieldDescriptor, known: Sequence[str]) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind in _INTS:
        return _integers(_INTS[kind])
    if kind == d.FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind in (d.FieldDescriptor.TYPE_DOUBLE, d.FieldDescriptor.TYPE_FLOAT):
        return _json_number() if kind == d.FieldDescriptor.TYPE_DOUBLE else st.floats(width=32)
    if kind == d.FieldDescriptor.TYPE_ENUM:
        # Known values and unknown ones (proto3 enums are open).
        assert field.enum_type is not None
        values = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(values), st.integers(-5, 1000))
    if kind == d.FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=40)
    return _text(known)


def _invalid_utf8(data: bytes, message_obj: message.Message) -> bytes:
    """The same message with one string field's bytes replaced by invalid UTF-8 (same length)."""
    for field, value in message_obj.ListFields():
        if field.type == d.FieldDescriptor.TYPE_STRING and not field.is_repeated:
            encoded = value.encode()
            if encoded and encoded in data:
                return data.replace(encoded, b"\xff" * len(encoded), 1)
    # No string set: prepend field 1 as a length-delimited invalid string (every request's field 1 is a string
    # or a message; either way the parser must refuse or skip it cleanly).
    return b"\x0a\x02\xc3\x28" + data


@st.composite
def wire(draw: st.DrawFn, descriptor: d.Descriptor, known: Sequence[str] = ()) -> bytes:
    """Request bytes: usually a well-formed message, sometimes broken on purpose."""
    built = draw(messages(descriptor, known))
    data = built.SerializeToString()
    mutation = draw(st.sampled_from(["none", "none", "none", "utf8", "truncate", "garbage", "flip"]))
    if mutation == "utf8":
        return _invalid_utf8(data, built)
    if mutation == "truncate" and data:
        return data[: draw(st.integers(0, len(data) - 1))]
    if mutation == "garbage":
        return draw(st.binary(min_size=1, max_size=64))
    if mutation == "flip" and data:
        at = draw(st.integers(0, len(data) - 1))
        return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]
    return data
