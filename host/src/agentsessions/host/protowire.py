"""Where a protobuf message's wire bytes break the rules a parser enforces, named by field.

The protobuf runtime refuses undecodable bytes with one message for the whole request ("Error
parsing message with type ...: String field had bad UTF-8"); a client needs to know which field.
``fault`` walks the bytes against the message's descriptor the way the parser does (tags, wire
types, lengths, UTF-8 in string fields, nesting depth) and names the first field that breaks a
rule, as a path such as ``inputs[0].parts[1].text.text``. It is only asked about bytes the runtime
already refused, so it need not be fast; it never raises.

``varint`` is the encoding's one writer by hand: the length prefixes of the frames the host sends
pre-encoded (``ExecUpdate`` records, Start frames with their history).
"""

from __future__ import annotations

from typing import Final

from google.protobuf import descriptor as d

from agentsessions.sdk.structs import struct

__all__ = ["MAX_DEPTH", "Fault", "explain", "fault", "varint"]

# The protobuf runtime's default recursion limit (upb and the C++ parser): nested messages beyond
# it do not decode.
MAX_DEPTH: Final = 100
# Path segments shown before the rest of a deep path is elided.
_SHOWN_SEGMENTS: Final = 6

_VARINT, _I64, _LEN, _SGROUP, _EGROUP, _I32 = 0, 1, 2, 3, 4, 5
_F = d.FieldDescriptor
_WIRE_TYPE: Final = {
    _F.TYPE_DOUBLE: _I64,
    _F.TYPE_FIXED64: _I64,
    _F.TYPE_SFIXED64: _I64,
    _F.TYPE_FLOAT: _I32,
    _F.TYPE_FIXED32: _I32,
    _F.TYPE_SFIXED32: _I32,
    _F.TYPE_STRING: _LEN,
    _F.TYPE_BYTES: _LEN,
    _F.TYPE_MESSAGE: _LEN,
    _F.TYPE_GROUP: _SGROUP,
}


@struct(frozen=True)
class Fault:
    """The first rule the bytes break: ``path`` names the field ("" for the message itself)."""

    path: str
    rule: str


class _Broken(Exception):
    def __init__(self, path: list[str], rule: str) -> None:
        super().__init__(rule)
        self.path = list(path)
        self.rule = rule


def varint(value: int) -> bytes:
    """A non-negative integer as a protobuf varint (7 bits a byte, least significant first)."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def fault(descriptor: d.Descriptor, data: bytes, max_depth: int = MAX_DEPTH) -> Fault | None:
    """The first field of ``data`` (an encoded ``descriptor`` message) that breaks a wire rule,
    or None when the walk finds nothing wrong."""
    try:
        _Walk(bytes(data), max_depth).message(descriptor, 0, len(data), [], 1)
    except _Broken as broken:
        return Fault(_render(broken.path), broken.rule)
    except Exception:  # a descriptor shape the walk does not model: say nothing rather than guess
        return None
    return None


def explain(descriptor: d.Descriptor, data: bytes, parser_error: str) -> Fault:
    """Why bytes the protobuf runtime refused (with ``parser_error``) do not decode: the first
    faulty field, or, when the walk finds none, the runtime's own words."""
    found = fault(descriptor, data)
    if found is not None:
        return found
    return Fault("", f"does not decode as {descriptor.full_name}: {parser_error}")


def _render(path: list[str]) -> str:
    if len(path) > _SHOWN_SEGMENTS * 2:
        shown = path[:_SHOWN_SEGMENTS]
        hidden = sum(1 for segment in path[_SHOWN_SEGMENTS:] if not segment.startswith("["))
        return _join(shown) + f"...({hidden} more fields)"
    return _join(path)


def _join(path: list[str]) -> str:
    out = "request" if path and path[0].startswith("[") else ""
    for segment in path:
        out += segment if segment.startswith("[") or not out else "." + segment
    return out


class _Walk:
    def __init__(self, data: bytes, max_depth: int) -> None:
        self.data = data
        self.max_depth = max_depth

    def varint(self, at: int, end: int, path: list[str]) -> tuple[int, int]:
        value = 0
        for i in range(10):
            if at >= end:
                raise _Broken(path, "truncated: the message ends inside a varint")
            byte = self.data[at]
            at += 1
            value |= (byte & 0x7F) << (7 * i)
            if not byte & 0x80:
                return value, at
        raise _Broken(path, "malformed varint (more than 10 bytes)")

    def message(self, desc: d.Descriptor, at: int, end: int, path: list[str], depth: int) -> None:
        if depth > self.max_depth:
            raise _Broken(path, f"nested deeper than {self.max_depth} messages")
        counts: dict[int, int] = {}
        while at < end:
            tag, at = self.varint(at, end, path)
            number, wire = tag >> 3, tag & 7
            if number == 0:
                raise _Broken(path, "field number 0 is not a valid tag")
            field = desc.fields_by_number.get(number)
            if field is None:
                at = self.skip(wire, number, at, end, [*path, f"[field {number}]"], depth)
                continue
            index = counts.get(number, 0)
            counts[number] = index + 1
            here = [*path, field.name] + ([f"[{index}]"] if field.is_repeated else [])
            at = self.value(field, wire, at, end, here, depth)

    def value(
        self, field: d.FieldDescriptor, wire: int, at: int, end: int, path: list[str], depth: int
    ) -> int:
        expected = _WIRE_TYPE.get(field.type, _VARINT)
        if wire != expected:
            packable = field.is_repeated and expected != _LEN and wire == _LEN
            if not packable:
                # The parser keeps a field with the wrong wire type as an unknown field.
                return self.skip(wire, field.number, at, end, path, depth)
        if wire == _LEN:
            length, at = self.varint(at, end, path)
            stop = at + length
            if stop > end:
                raise _Broken(path, f"truncated: a length of {length} runs past the end of the message")
            if field.type == _F.TYPE_STRING:
                try:
                    self.data[at:stop].decode("utf-8")
                except UnicodeDecodeError:
                    raise _Broken(path, "invalid UTF-8 in a string field") from None
            elif field.type == _F.TYPE_MESSAGE:
                assert field.message_type is not None
                self.message(field.message_type, at, stop, path, depth + 1)
            elif field.type != _F.TYPE_BYTES:  # packed scalars
                self.packed(expected, at, stop, path)
            return stop
        if wire == _SGROUP:
            return self.group(field.number, at, end, path, depth)
        return self.fixed_or_varint(wire, at, end, path)

    def packed(self, wire: int, at: int, end: int, path: list[str]) -> None:
        while at < end:
            at = self.fixed_or_varint(wire, at, end, path)

    def fixed_or_varint(self, wire: int, at: int, end: int, path: list[str]) -> int:
        if wire == _VARINT:
            return self.varint(at, end, path)[1]
        size = 8 if wire == _I64 else 4
        if at + size > end:
            raise _Broken(path, f"truncated: the message ends inside a {size * 8}-bit value")
        return at + size

    def skip(self, wire: int, number: int, at: int, end: int, path: list[str], depth: int) -> int:
        if wire == _LEN:
            length, at = self.varint(at, end, path)
            if at + length > end:
                raise _Broken(path, f"truncated: a length of {length} runs past the end of the message")
            return at + length
        if wire == _SGROUP:
            return self.group(number, at, end, path, depth)
        if wire == _EGROUP:
            raise _Broken(path, "an end-group tag without its start")
        if wire in (_VARINT, _I64, _I32):
            return self.fixed_or_varint(wire, at, end, path)
        raise _Broken(path, f"wire type {wire} does not exist")

    def group(self, number: int, at: int, end: int, path: list[str], depth: int) -> int:
        if depth + 1 > self.max_depth:
            raise _Broken(path, f"nested deeper than {self.max_depth} messages")
        while at < end:
            tag, at = self.varint(at, end, path)
            inner, wire = tag >> 3, tag & 7
            if wire == _EGROUP:
                if inner != number:
                    raise _Broken(path, f"group {number} ends with the end tag of field {inner}")
                return at
            if inner == 0:
                raise _Broken(path, "field number 0 is not a valid tag")
            at = self.skip(wire, inner, at, end, path, depth + 1)
        raise _Broken(path, "truncated: a group has no end tag")
