"""The native values and their wire converters: exact round trips, JSON rules, clear refusals."""

from __future__ import annotations

import math

import pytest
from google.protobuf import struct_pb2

from agentsessions.sdk import (
    ConversionError,
    DataPart,
    FilePart,
    HarnessDescriptor,
    Mediation,
    Message,
    ModelCall,
    ModelResult,
    ReasoningPart,
    ResultCode,
    Resumability,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolChoiceMode,
    ToolDefinition,
    ToolResult,
    ToolSpec,
    Usage,
    convert,
)
from agentsessions.sdk.inputhash import model_input_hash
from agentsessions.v1 import common_pb2, harness_pb2


def every_part_kind() -> common_pb2.Message:
    struct = struct_pb2.Struct()
    struct.update({"n": 3, "x": 2.5, "nested": {"list": [1, "two", None, True]}})
    return common_pb2.Message(
        role="assistant",
        parts=[
            common_pb2.Part(text=common_pb2.TextPart(text="hello")),
            common_pb2.Part(file=common_pb2.FilePart(mime="image/png", bytes=b"\x89PNG", name="a.png")),
            common_pb2.Part(file=common_pb2.FilePart(mime="text/plain", uri="s3://b/k", digest="sha256:ab")),
            common_pb2.Part(file=common_pb2.FilePart(mime="application/x-empty", bytes=b"")),
            common_pb2.Part(data=common_pb2.DataPart(data=struct)),
            common_pb2.Part(data=common_pb2.DataPart()),
            common_pb2.Part(
                reasoning=common_pb2.ReasoningPart(
                    provider="openai",
                    model_id="o1",
                    opaque_bytes=b"\x00state",
                    summary=[common_pb2.Part(text=common_pb2.TextPart(text="thought"))],
                    item_id="rs_1",
                    ordinal=2,
                    validity_scope="acct",
                    opaque_digest="sha256:cd",
                )
            ),
            common_pb2.Part(reasoning=common_pb2.ReasoningPart(provider="x", opaque_uri="s3://r")),
            common_pb2.Part(
                tool_call=common_pb2.ToolCall(
                    id="c1",
                    tool="lookup",
                    args=struct,
                    mediation=common_pb2.MEDIATION_REQUIRES_APPROVAL,
                    idempotency_key="k1",
                )
            ),
            common_pb2.Part(tool_call=common_pb2.ToolCall(id="c2", tool="noargs")),
            common_pb2.Part(
                tool_result=common_pb2.ToolResult(
                    id="c1",
                    output=struct,
                    output_uri="s3://o",
                    output_digest="sha256:ef",
                    is_error=True,
                    error="boom",
                    content=[common_pb2.Part(text=common_pb2.TextPart(text="done"))],
                    code=common_pb2.ToolResult.EXECUTOR_ERROR,
                    approval_request_seq=4,
                    approval_decision_seq=5,
                )
            ),
            common_pb2.Part(tool_result=common_pb2.ToolResult(id="c2", output=struct_pb2.Struct())),
        ],
    )


def test_a_message_round_trips_exactly_through_its_native_twin() -> None:
    wire = every_part_kind()
    native = convert.message_from_proto(wire)
    assert convert.message_to_proto(native) == wire
    assert native.text() == "hello"
    call = native.tool_calls[0]
    assert call.args == {"n": 3, "x": 2.5, "nested": {"list": [1, "two", None, True]}}
    assert isinstance(call.args["n"], int) and isinstance(call.args["nested"]["list"][0], int)
    assert call.mediation == Mediation.REQUIRES_APPROVAL
    assert native.tool_results[0].code == ResultCode.EXECUTOR_ERROR
    assert native.tool_results[1].output == {}, "present-but-empty output stays present"


def test_the_model_input_hash_survives_the_round_trip() -> None:
    wire = common_pb2.ModelCall(
        model="m",
        params={"temperature": "0.2"},
        messages=[every_part_kind(), common_pb2.Message(role="user")],
        tools=[common_pb2.ToolDefinition(name="t", description="d")],
        tool_choice=common_pb2.ToolChoice(mode=common_pb2.ToolChoice.MODE_REQUIRED, name="t"),
    )
    again = convert.model_call_to_proto(convert.model_call_from_proto(wire))
    assert model_input_hash(again) == model_input_hash(wire)


def test_integers_stay_integers_and_floats_stay_floats() -> None:
    struct = convert.struct_from_dict({"count": 3, "ratio": 0.5, "big": 2**53 - 1, "neg": -(2**53 - 1)})
    back = convert.dict_from_struct(struct)
    assert back == {"count": 3, "ratio": 0.5, "big": 2**53 - 1, "neg": -(2**53 - 1)}
    assert type(back["count"]) is int and type(back["ratio"]) is float and type(back["big"]) is int


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"n": 2**53}, r"args\.n: integer 9007199254740992 is beyond \+-\(2\^53-1\)"),
        ({"n": -(2**60)}, "is beyond"),
        ({"deep": [{"x": 1e300}]}, r"args\.deep\[0\]\.x: integral number .* is beyond"),
        ({"n": math.nan}, r"args\.n: nan is not a finite number"),
        ({"n": math.inf}, "is not a finite number"),
        ({"when": object()}, r"args\.when: a object is not a JSON value"),
        ({"set": {1, 2}}, "a set is not a JSON value"),
        ({"m": {1: "x"}}, r"args\.m: key 1 is not a string"),
    ],
)
def test_values_a_struct_cannot_carry_exactly_are_refused_naming_the_path(
    value: dict[str, object], message: str
) -> None:
    with pytest.raises(ConversionError, match=message):
        convert.tool_call_to_proto(ToolCall(id="c", name="t", args=value))


def test_an_empty_args_dict_travels_as_no_args() -> None:
    assert not convert.tool_call_to_proto(ToolCall(id="c", name="t")).HasField("args")
    assert convert.tool_call_from_proto(common_pb2.ToolCall(id="c", tool="t")).args == {}


def test_model_calls_and_results_convert_both_ways() -> None:
    call = ModelCall(
        messages=[Message.system("s"), Message.user("u")],
        model="gpt",
        tools=[ToolDefinition("t", "does t", {"type": "object"})],
        tool_choice=ToolChoice(ToolChoiceMode.AUTO),
        params={"temperature": "0.2", "max_tokens": "64"},
    )
    wire = convert.model_call_to_proto(call, id="abc")
    assert wire.id == "abc" and dict(wire.params) == {"temperature": "0.2", "max_tokens": "64"}
    assert convert.model_call_from_proto(wire) == call
    result = ModelResult(Message.assistant("hi"), Usage("gpt", 3, 4, 1))
    assert convert.model_result_from_proto(convert.model_result_to_proto(result)) == result
    with pytest.raises(ConversionError, match="params are strings"):
        convert.model_call_to_proto(ModelCall(messages=(), params={"temperature": 0.2}))  # type: ignore[dict-item]


def test_a_descriptor_converts_to_the_wire_descriptor() -> None:
    native = HarnessDescriptor(
        id="h",
        version="2",
        models=("m",),
        tools=(ToolSpec("deploy", "ships it", Mediation.REQUIRES_APPROVAL),),
        resumability=Resumability.STATELESS_REPLAY,
        fork_safe=True,
        streaming=True,
    )
    wire = convert.descriptor_to_proto(native)
    assert wire == harness_pb2.HarnessDescriptor(
        id="h",
        version="2",
        models=["m"],
        tools=[
            harness_pb2.ToolSpec(
                name="deploy", description="ships it", mediation=common_pb2.MEDIATION_REQUIRES_APPROVAL
            )
        ],
        capabilities=harness_pb2.Capabilities(
            resumability=harness_pb2.RESUMABILITY_STATELESS_REPLAY, fork_safe=True, streaming=True
        ),
    )
    assert convert.descriptor_from_proto(wire) == native
    assert native.mediation("deploy") == Mediation.REQUIRES_APPROVAL and native.mediation("other") is None


def test_native_helpers_build_the_obvious_values() -> None:
    assert Message.user("hi") == Message("user", (TextPart("hi"),))
    assert Message("assistant", [TextPart("a"), TextPart("b")]).text() == "ab", "lists become tuples"
    ok = ToolResult.ok("c", {"n": 1}, text="fine")
    assert (ok.output, ok.text(), ok.is_error) == ({"n": 1}, "fine", False)
    failed = ToolResult.failure("c", "nope")
    assert (failed.is_error, failed.error) == (True, "nope")
    assert DataPart({"a": 1}) != DataPart(None)
    assert FilePart(mime="x", data=b"") != FilePart(mime="x")
    with pytest.raises(ConversionError, match="data or a uri, not both"):
        convert.message_to_proto(Message("user", (FilePart(data=b"x", uri="u"),)))
    with pytest.raises(ConversionError, match="opaque bytes or an opaque uri"):
        convert.message_to_proto(Message("user", (ReasoningPart(opaque=b"x", opaque_uri="u"),)))
    with pytest.raises(ConversionError, match=r"expected an agentsessions\.sdk Message"):
        convert.messages_to_proto([common_pb2.Message()])  # type: ignore[list-item]


def test_unknown_wire_values_are_named() -> None:
    with pytest.raises(ConversionError, match="tool call mediation 9"):
        convert.tool_call_from_proto(common_pb2.ToolCall(id="c", mediation=9))  # type: ignore[arg-type]
    with pytest.raises(ConversionError, match="part is empty"):
        convert.message_from_proto(common_pb2.Message(role="user", parts=[common_pb2.Part()]))
