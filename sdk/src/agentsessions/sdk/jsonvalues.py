"""JSON values in ``google.protobuf.Struct``, with the contract's rules.

Tool arguments, data parts and result schemas travel as Structs; the contract wants them
"JSON-shaped: finite numbers, integers within +-(2^53-1)". :func:`check_json` says whether a value
is, naming the path of the first one that is not (:class:`ConversionError`); the two conversions
check on the way in and give integral numbers back as ``int``. No harness types here: the host
reads and writes Structs through this module without loading them (``agentsessions.sdk.convert``
re-exports every name).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from google.protobuf import struct_pb2

__all__ = ["MAX_SAFE_INTEGER", "ConversionError", "check_json", "dict_from_struct", "struct_from_dict"]

# The largest integer a double (and so a Struct number) holds exactly, as the contract bounds it.
MAX_SAFE_INTEGER = 2**53 - 1


class ConversionError(ValueError):
    """A value cannot be carried by the contract's wire form; the message names where and why."""


def check_json(value: object, path: str = "value") -> None:
    """Raise ConversionError unless ``value`` is JSON the wire can carry exactly."""
    if value is None or isinstance(value, (bool, str)):
        return
    if isinstance(value, int):
        if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return
        raise ConversionError(
            f"{path}: integer {value} is beyond +-(2^53-1), which a protobuf Struct cannot hold exactly "
            "(send it as a string)"
        )
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConversionError(f"{path}: {value} is not a finite number (JSON has no NaN or Infinity)")
        if value.is_integer() and abs(value) > MAX_SAFE_INTEGER:
            raise ConversionError(f"{path}: integral number {value:.0f} is beyond +-(2^53-1)")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConversionError(f"{path}: key {key!r} is not a string (JSON object keys are strings)")
            check_json(item, f"{path}.{key}")
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            check_json(item, f"{path}[{index}]")
        return
    raise ConversionError(f"{path}: a {type(value).__name__} is not a JSON value")


def struct_from_dict(value: Mapping[str, Any], path: str = "value") -> struct_pb2.Struct:
    """A Struct holding ``value`` (checked with :func:`check_json`)."""
    if not isinstance(value, Mapping):
        raise ConversionError(f"{path}: expected a JSON object, got a {type(value).__name__}")
    check_json(value, path)
    struct = struct_pb2.Struct()
    struct.update(value)
    return struct


def dict_from_struct(struct: struct_pb2.Struct) -> dict[str, Any]:
    """The dict a Struct holds; integral numbers within +-(2^53-1) come back as ``int``."""
    return {key: _python(item) for key, item in struct.fields.items()}


def _python(value: struct_pb2.Value) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        number = value.number_value
        if number.is_integer() and -MAX_SAFE_INTEGER <= number <= MAX_SAFE_INTEGER:
            return int(number)
        return number
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "struct_value":
        return dict_from_struct(value.struct_value)
    if kind == "list_value":
        return [_python(item) for item in value.list_value.values]
    return None
