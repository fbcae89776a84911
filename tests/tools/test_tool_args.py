"""Tool-call checks made before intent: JSON-shaped arguments and host-run call rules."""

from __future__ import annotations

import math
from typing import Any

import pytest
from google.protobuf import struct_pb2

from agentsessions.host.tools import (
    InvalidToolArgumentsError,
    InvalidToolCallError,
    MissingIdempotencyKeyError,
    MissingToolCallIdError,
    UnmediatedToolCallError,
    check_json_value,
    python_to_struct,
    struct_to_python,
    validate_tool_args,
    validate_tool_call,
)
from agentsessions.sdk.errors import ToolCallRejectedError
from agentsessions.v1 import common_pb2

LIMIT = 2**53 - 1


def struct(value: dict[str, Any]) -> struct_pb2.Struct:
    # Struct.update accepts NaN and infinities, which is exactly what the checks must catch.
    s = struct_pb2.Struct()
    s.update(value)
    return s


def test_json_shaped_arguments_pass() -> None:
    validate_tool_args(
        struct(
            {
                "path": "a.txt",
                "n": LIMIT,
                "neg": -LIMIT,
                "ratio": 0.25,
                "flag": True,
                "none": None,
                "nested": {"list": [1, "two", [3.5, {"deep": False}]]},
            }
        )
    )
    validate_tool_args(None)
    validate_tool_args(struct_pb2.Struct())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"limits": [1, 2, math.nan]}, "args.limits[2]: NaN is not JSON-shaped"),
        ({"x": math.inf}, "args.x: +Infinity is not JSON-shaped"),
        ({"a": {"b": [-math.inf]}}, "args.a.b[0]: -Infinity is not JSON-shaped"),
        ({"big": float(2**53)}, "args.big: integral number 9007199254740992 is outside +-(2^53-1)"),
        ({"big": -1e300}, "args.big: integral number"),
        ({"odd key": math.nan}, "args['odd key']: NaN is not JSON-shaped"),
    ],
)
def test_non_json_numbers_are_refused_naming_path_and_rule(args: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidToolArgumentsError) as caught:
        validate_tool_args(struct(args))
    assert str(caught.value).startswith(message)


def test_value_without_kind_is_refused() -> None:
    s = struct_pb2.Struct()
    s.fields["empty"].CopyFrom(struct_pb2.Value())
    with pytest.raises(InvalidToolArgumentsError, match=r"^args\.empty: value has no kind set"):
        validate_tool_args(s)


def test_errors_are_sink_rejections_with_field_and_rule() -> None:
    with pytest.raises(ToolCallRejectedError) as caught:
        validate_tool_args(struct({"n": math.nan}))
    assert isinstance(caught.value, InvalidToolArgumentsError)
    assert caught.value.field == "args.n"
    assert caught.value.rule == "NaN is not JSON-shaped"


def call(**fields: Any) -> common_pb2.ToolCall:
    base: dict[str, Any] = {
        "id": "call-1",
        "tool": "write_file",
        "mediation": common_pb2.MEDIATION_CONTROLLER_MEDIATED,
        "idempotency_key": "key-1",
    }
    base.update(fields)
    return common_pb2.ToolCall(**base)


@pytest.mark.parametrize(
    "mediation", [common_pb2.MEDIATION_CONTROLLER_MEDIATED, common_pb2.MEDIATION_REQUIRES_APPROVAL]
)
def test_host_run_calls_with_id_and_key_pass(mediation: common_pb2.Mediation.ValueType) -> None:
    validate_tool_call(call(mediation=mediation, args=struct({"path": "x"})))


@pytest.mark.parametrize(
    "mediation", [common_pb2.MEDIATION_UNSPECIFIED, common_pb2.MEDIATION_IN_HARNESS_REPORTED]
)
def test_unmediated_calls_are_refused(mediation: common_pb2.Mediation.ValueType) -> None:
    with pytest.raises(UnmediatedToolCallError, match=r"^tool_call\.mediation: MEDIATION_"):
        validate_tool_call(call(mediation=mediation))


@pytest.mark.parametrize(
    "mediation", [common_pb2.MEDIATION_CONTROLLER_MEDIATED, common_pb2.MEDIATION_REQUIRES_APPROVAL]
)
def test_host_run_calls_need_a_key(mediation: common_pb2.Mediation.ValueType) -> None:
    with pytest.raises(MissingIdempotencyKeyError, match=r"^tool_call\.idempotency_key: required"):
        validate_tool_call(call(mediation=mediation, idempotency_key=""))


def test_host_run_calls_need_an_id_and_a_tool() -> None:
    with pytest.raises(MissingToolCallIdError, match=r"^tool_call\.id: required"):
        validate_tool_call(call(id=""))
    with pytest.raises(InvalidToolCallError, match=r"^tool_call\.tool: required"):
        validate_tool_call(call(tool=""))


def test_call_arguments_are_checked_under_the_call_path() -> None:
    with pytest.raises(InvalidToolArgumentsError, match=r"^tool_call\.args\.limits\[0\]: NaN"):
        validate_tool_call(call(args=struct({"limits": [math.nan]})))


def test_struct_to_python_gives_integers_back() -> None:
    plain = struct_to_python(struct({"n": 3, "x": 1.5, "list": [1, {"k": 2}], "none": None, "s": "t"}))
    assert plain == {"n": 3, "x": 1.5, "list": [1, {"k": 2}], "none": None, "s": "t"}
    assert isinstance(plain["n"], int)
    assert isinstance(plain["list"][1]["k"], int)
    assert struct_to_python(None) == {}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"x": math.nan}, "output.x: NaN is not JSON-shaped"),
        ({"x": 2**53}, "output.x: integer 9007199254740992 is outside +-(2^53-1)"),
        ({"x": {1: "a"}}, "output.x: object key 1 is not a string"),
        ({"x": [b"raw"]}, "output.x[0]: a bytes is not JSON-shaped"),
        ({"x": {"y": object()}}, "output.x.y: a object is not JSON-shaped"),
    ],
)
def test_python_outputs_are_checked(value: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidToolArgumentsError) as caught:
        python_to_struct(value)
    assert str(caught.value) == message


def test_cyclic_python_values_stop_at_the_nesting_limit() -> None:
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    with pytest.raises(InvalidToolArgumentsError, match="nesting deeper than"):
        check_json_value(cyclic, "output")


def test_python_to_struct_copies_tuples_and_mappings() -> None:
    s = python_to_struct({"t": (1, 2), "m": {"k": True}})
    assert struct_to_python(s) == {"t": [1, 2], "m": {"k": True}}
