"""Tool-call checks made before intent is journaled, and JSON-shaped argument conversion.

Tool arguments must be JSON-shaped (spec 4.7): every number finite, every integral number
within +-(2^53-1) so it survives a round trip through any JSON reader, and every value one of
null, bool, number, string, list or object. Host-run calls must also name their mediation,
id and idempotency key (invariant I3). Each rule raises a typed error naming the path.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf import struct_pb2

from agentsessions.host.tools.errors import (
    InvalidToolArgumentsError,
    InvalidToolCallError,
    MissingIdempotencyKeyError,
    MissingToolCallIdError,
    UnmediatedToolCallError,
)
from agentsessions.v1 import common_pb2

MAX_SAFE_INTEGER = 2**53 - 1
# Deep enough for any real argument document; stops cyclic Python values from recursing forever.
MAX_NESTING = 100

_HOST_RUN = (common_pb2.MEDIATION_CONTROLLER_MEDIATED, common_pb2.MEDIATION_REQUIRES_APPROVAL)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _key_path(path: str, key: str) -> str:
    if _IDENTIFIER.match(key):
        return f"{path}.{key}"
    return f"{path}[{key!r}]"


def _refuse(path: str, rule: str) -> InvalidToolArgumentsError:
    return InvalidToolArgumentsError(path, rule)


def _check_number(value: float, path: str) -> None:
    if math.isnan(value):
        raise _refuse(path, "NaN is not JSON-shaped")
    if math.isinf(value):
        sign = "-" if value < 0 else "+"
        raise _refuse(path, f"{sign}Infinity is not JSON-shaped")
    if value.is_integer() and abs(value) > MAX_SAFE_INTEGER:
        raise _refuse(path, f"integral number {value:.0f} is outside +-(2^53-1)")


def _check_value(value: struct_pb2.Value, path: str, depth: int) -> None:
    if depth > MAX_NESTING:
        raise _refuse(path, f"nesting deeper than {MAX_NESTING} levels")
    kind = value.WhichOneof("kind")
    if kind is None:
        raise _refuse(path, "value has no kind set (not null, bool, number, string, list or object)")
    if kind == "number_value":
        _check_number(value.number_value, path)
    elif kind == "struct_value":
        _check_struct(value.struct_value, path, depth + 1)
    elif kind == "list_value":
        for index, item in enumerate(value.list_value.values):
            _check_value(item, f"{path}[{index}]", depth + 1)


def _check_struct(struct: struct_pb2.Struct, path: str, depth: int) -> None:
    for key in sorted(struct.fields):
        _check_value(struct.fields[key], _key_path(path, key), depth)


def validate_tool_args(args: struct_pb2.Struct | None, *, path: str = "args") -> None:
    """Raise InvalidToolArgumentsError unless ``args`` is JSON-shaped (None counts as empty)."""
    if args is not None:
        _check_struct(args, path, 0)


def validate_tool_call(call: common_pb2.ToolCall) -> None:
    """Refuse a call the host must not run, before its intent is journaled.

    Only CONTROLLER_MEDIATED and REQUIRES_APPROVAL calls are host-run; they need a tool
    name, an id (results correlate on it) and an idempotency key (re-drives dedup on it),
    and JSON-shaped arguments.
    """
    if call.mediation not in _HOST_RUN:
        name = _mediation_name(call.mediation)
        raise UnmediatedToolCallError(
            "tool_call.mediation",
            f"{name} calls are run by the harness and reported; the host runs only "
            "CONTROLLER_MEDIATED or REQUIRES_APPROVAL calls",
        )
    mediation = common_pb2.Mediation.Name(call.mediation)
    if not call.tool:
        raise InvalidToolCallError("tool_call.tool", f"required for {mediation} calls")
    if not call.id:
        raise MissingToolCallIdError(
            "tool_call.id", f"required for {mediation} calls so the result can be correlated"
        )
    if not call.idempotency_key:
        raise MissingIdempotencyKeyError(
            "tool_call.idempotency_key",
            f"required for {mediation} calls so a re-drive never repeats the effect",
        )
    validate_tool_args(call.args if call.HasField("args") else None, path="tool_call.args")


def _mediation_name(value: common_pb2.Mediation.ValueType) -> str:
    try:
        return common_pb2.Mediation.Name(value)
    except ValueError:
        return f"mediation {value}"


def struct_to_python(args: struct_pb2.Struct | None) -> dict[str, Any]:
    """Validated arguments as plain Python: integral numbers become ``int``."""
    validate_tool_args(args)
    if args is None:
        return {}
    return {key: _value_to_python(args.fields[key]) for key in args.fields}


def _value_to_python(value: struct_pb2.Value) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        number = value.number_value
        return int(number) if number.is_integer() else number
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "struct_value":
        fields = value.struct_value.fields
        return {key: _value_to_python(fields[key]) for key in fields}
    if kind == "list_value":
        return [_value_to_python(item) for item in value.list_value.values]
    return None


def check_json_value(value: object, path: str, depth: int = 0) -> None:
    """Raise InvalidToolArgumentsError unless a Python value is JSON-shaped."""
    if depth > MAX_NESTING:
        raise _refuse(path, f"nesting deeper than {MAX_NESTING} levels")
    if value is None or isinstance(value, bool | str):
        return
    if isinstance(value, int):
        if abs(value) > MAX_SAFE_INTEGER:
            raise _refuse(path, f"integer {value} is outside +-(2^53-1)")
        return
    if isinstance(value, float):
        _check_number(value, path)
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise _refuse(path, f"object key {key!r} is not a string")
            check_json_value(item, _key_path(path, key), depth + 1)
        return
    if isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        for index, item in enumerate(value):
            check_json_value(item, f"{path}[{index}]", depth + 1)
        return
    raise _refuse(path, f"a {type(value).__name__} is not JSON-shaped")


def python_to_struct(value: Mapping[str, Any], *, path: str = "output") -> struct_pb2.Struct:
    """A Struct from a JSON-shaped mapping (checked first, so nothing is silently coerced)."""
    check_json_value(value, path)
    struct = struct_pb2.Struct()
    struct.update(_plain(value))
    return struct


def _plain(value: Any) -> Any:
    # Struct.update only knows dict and list; other mappings and sequences are copied into them.
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [_plain(item) for item in value]
    return value
