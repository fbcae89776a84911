"""Native values <-> ``agentsessions.v1`` messages: the only place harness values meet protobuf.

Every ``*_to_proto`` / ``*_from_proto`` pair is exact: converting a wire message to its native
twin and back gives an equal message (tool arguments excepted: an empty ``args`` travels as no
arguments). JSON values go through ``google.protobuf.Struct`` with the contract's rules (tool
args "must be JSON-shaped: finite numbers, integers within +-(2^53-1)"): violations raise
:class:`ConversionError`, naming the path, before anything is sent.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import TypeVar

# The JSON-value half lives in jsonvalues (no harness types there); its names stay importable here.
from agentsessions.sdk.jsonvalues import MAX_SAFE_INTEGER as MAX_SAFE_INTEGER
from agentsessions.sdk.jsonvalues import ConversionError as ConversionError
from agentsessions.sdk.jsonvalues import check_json as check_json
from agentsessions.sdk.jsonvalues import dict_from_struct as dict_from_struct
from agentsessions.sdk.jsonvalues import struct_from_dict as struct_from_dict
from agentsessions.sdk.types import (
    ApprovalDecision,
    DataPart,
    FilePart,
    HarnessDescriptor,
    Mediation,
    Message,
    ModelCall,
    ModelResult,
    Part,
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
)
from agentsessions.v1 import common_pb2, harness_pb2

_E = TypeVar("_E", bound=enum.IntEnum)


def _enum(kind: type[_E], value: int, what: str) -> _E:
    try:
        return kind(value)
    except ValueError:
        raise ConversionError(f"{what} {value} is not a value this SDK knows") from None


# -- parts and messages -----------------------------------------------------------------------------


def part_to_proto(part: Part, path: str = "part") -> common_pb2.Part:
    if isinstance(part, TextPart):
        return common_pb2.Part(text=common_pb2.TextPart(text=part.text))
    if isinstance(part, ToolCall):
        return common_pb2.Part(tool_call=tool_call_to_proto(part, path))
    if isinstance(part, ToolResult):
        return common_pb2.Part(tool_result=tool_result_to_proto(part, path))
    if isinstance(part, FilePart):
        if part.data is not None and part.uri:
            raise ConversionError(f"{path}: a file part has data or a uri, not both")
        file = common_pb2.FilePart(mime=part.mime, name=part.name, digest=part.digest)
        if part.data is not None:
            file.bytes = part.data
        elif part.uri:
            file.uri = part.uri
        return common_pb2.Part(file=file)
    if isinstance(part, DataPart):
        data = common_pb2.DataPart()
        if part.data is not None:
            data.data.CopyFrom(struct_from_dict(part.data, f"{path}.data"))
        return common_pb2.Part(data=data)
    if isinstance(part, ReasoningPart):
        if part.opaque is not None and part.opaque_uri:
            raise ConversionError(f"{path}: a reasoning part has opaque bytes or an opaque uri, not both")
        reasoning = common_pb2.ReasoningPart(
            provider=part.provider,
            model_id=part.model_id,
            summary=[part_to_proto(p, f"{path}.summary[{i}]") for i, p in enumerate(part.summary)],
            item_id=part.item_id,
            ordinal=part.ordinal,
            validity_scope=part.validity_scope,
            opaque_digest=part.opaque_digest,
        )
        if part.opaque is not None:
            reasoning.opaque_bytes = part.opaque
        elif part.opaque_uri:
            reasoning.opaque_uri = part.opaque_uri
        return common_pb2.Part(reasoning=reasoning)
    raise ConversionError(f"{path}: a {type(part).__name__} is not a message part")


def part_from_proto(part: common_pb2.Part) -> Part:
    kind = part.WhichOneof("part")
    if kind == "text":
        return TextPart(part.text.text)
    if kind == "tool_call":
        return tool_call_from_proto(part.tool_call)
    if kind == "tool_result":
        return tool_result_from_proto(part.tool_result)
    if kind == "file":
        f = part.file
        source = f.WhichOneof("source")
        return FilePart(
            mime=f.mime,
            data=f.bytes if source == "bytes" else None,
            uri=f.uri if source == "uri" else "",
            name=f.name,
            digest=f.digest,
        )
    if kind == "data":
        return DataPart(dict_from_struct(part.data.data) if part.data.HasField("data") else None)
    if kind == "reasoning":
        r = part.reasoning
        opaque = r.WhichOneof("opaque")
        return ReasoningPart(
            provider=r.provider,
            model_id=r.model_id,
            opaque=r.opaque_bytes if opaque == "opaque_bytes" else None,
            opaque_uri=r.opaque_uri if opaque == "opaque_uri" else "",
            summary=tuple(part_from_proto(p) for p in r.summary),
            item_id=r.item_id,
            ordinal=r.ordinal,
            validity_scope=r.validity_scope,
            opaque_digest=r.opaque_digest,
        )
    raise ConversionError("a message part is empty (no kind is set)")


def message_to_proto(message: Message, path: str = "message") -> common_pb2.Message:
    if not isinstance(message, Message):
        raise ConversionError(
            f"{path}: expected an agentsessions.sdk Message, got a {type(message).__name__}"
        )
    # Text-only messages are most of any conversation: skip the generic part dispatch.
    parts = [
        common_pb2.Part(text=common_pb2.TextPart(text=p.text))
        if type(p) is TextPart
        else part_to_proto(p, f"{path}.parts[{i}]")
        for i, p in enumerate(message.parts)
    ]
    return common_pb2.Message(role=message.role, parts=parts)


def message_from_proto(message: common_pb2.Message) -> Message:
    return Message(message.role, tuple(part_from_proto(p) for p in message.parts))


def messages_to_proto(messages: Iterable[Message], path: str = "messages") -> list[common_pb2.Message]:
    return [message_to_proto(m, f"{path}[{i}]") for i, m in enumerate(messages)]


def messages_from_proto(messages: Iterable[common_pb2.Message]) -> list[Message]:
    return [message_from_proto(m) for m in messages]


# -- tools ------------------------------------------------------------------------------------------


def tool_call_to_proto(call: ToolCall, path: str = "tool_call") -> common_pb2.ToolCall:
    wire = common_pb2.ToolCall(
        id=call.id,
        tool=call.name,
        mediation=common_pb2.Mediation.ValueType(int(call.mediation)),
        idempotency_key=call.idempotency_key,
    )
    if call.args:
        wire.args.CopyFrom(struct_from_dict(call.args, f"{path}.args"))
    return wire


def tool_call_from_proto(call: common_pb2.ToolCall) -> ToolCall:
    return ToolCall(
        id=call.id,
        name=call.tool,
        args=dict_from_struct(call.args) if call.HasField("args") else {},
        mediation=_enum(Mediation, call.mediation, "tool call mediation"),
        idempotency_key=call.idempotency_key,
    )


def tool_result_to_proto(result: ToolResult, path: str = "tool_result") -> common_pb2.ToolResult:
    wire = common_pb2.ToolResult(
        id=result.id,
        output_uri=result.output_uri,
        output_digest=result.output_digest,
        is_error=result.is_error,
        error=result.error,
        content=[part_to_proto(p, f"{path}.content[{i}]") for i, p in enumerate(result.content)],
        code=common_pb2.ToolResult.Code.ValueType(int(result.code)),
        approval_request_seq=result.approval_request_seq,
        approval_decision_seq=result.approval_decision_seq,
    )
    if result.output is not None:
        wire.output.CopyFrom(struct_from_dict(result.output, f"{path}.output"))
    return wire


def tool_result_from_proto(
    result: common_pb2.ToolResult, decision: common_pb2.ApprovalResult | None = None
) -> ToolResult:
    return ToolResult(
        id=result.id,
        output=dict_from_struct(result.output) if result.HasField("output") else None,
        content=tuple(part_from_proto(p) for p in result.content),
        is_error=result.is_error,
        error=result.error,
        output_uri=result.output_uri,
        output_digest=result.output_digest,
        code=_enum(ResultCode, result.code, "tool result code"),
        approval_request_seq=result.approval_request_seq,
        approval_decision_seq=result.approval_decision_seq,
        decision=approval_decision_from_proto(decision) if decision is not None else None,
    )


def approval_decision_from_proto(decision: common_pb2.ApprovalResult) -> ApprovalDecision:
    return ApprovalDecision(
        approved=decision.approved, reason=decision.reason, request_seq=decision.request_seq
    )


def tool_definition_to_proto(tool: ToolDefinition, path: str = "tool") -> common_pb2.ToolDefinition:
    wire = common_pb2.ToolDefinition(name=tool.name, description=tool.description)
    if tool.schema is not None:
        wire.input_schema.CopyFrom(struct_from_dict(tool.schema, f"{path}.schema"))
    return wire


def tool_definition_from_proto(tool: common_pb2.ToolDefinition) -> ToolDefinition:
    schema = dict_from_struct(tool.input_schema) if tool.HasField("input_schema") else None
    return ToolDefinition(name=tool.name, description=tool.description, schema=schema)


def tool_choice_to_proto(choice: ToolChoice) -> common_pb2.ToolChoice:
    return common_pb2.ToolChoice(
        mode=common_pb2.ToolChoice.Mode.ValueType(int(choice.mode)), name=choice.name
    )


def tool_choice_from_proto(choice: common_pb2.ToolChoice) -> ToolChoice:
    return ToolChoice(mode=_enum(ToolChoiceMode, choice.mode, "tool choice mode"), name=choice.name)


# -- model calls and results --------------------------------------------------------------------------


def usage_to_proto(usage: Usage) -> common_pb2.Usage:
    return common_pb2.Usage(
        model=usage.model,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        reasoning_tokens=usage.reasoning_tokens,
    )


def usage_from_proto(usage: common_pb2.Usage) -> Usage:
    return Usage(
        model=usage.model,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        reasoning_tokens=usage.reasoning_tokens,
    )


def model_call_to_proto(call: ModelCall, *, id: str = "") -> common_pb2.ModelCall:
    wire = common_pb2.ModelCall(
        model=call.model,
        id=id,
        messages=messages_to_proto(call.messages),
        tools=[tool_definition_to_proto(t, f"tools[{i}]") for i, t in enumerate(call.tools)],
    )
    if call.params:
        for key, value in call.params.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ConversionError(
                    f"params.{key}: params are strings (a value's JSON text), got {value!r}"
                )
        wire.params.update(call.params)
    if call.tool_choice is not None:
        wire.tool_choice.CopyFrom(tool_choice_to_proto(call.tool_choice))
    return wire


def model_call_from_proto(call: common_pb2.ModelCall) -> ModelCall:
    return ModelCall(
        messages=tuple(message_from_proto(m) for m in call.messages),
        model=call.model,
        tools=tuple(tool_definition_from_proto(t) for t in call.tools),
        tool_choice=tool_choice_from_proto(call.tool_choice) if call.HasField("tool_choice") else None,
        params=dict(call.params),
    )


def model_result_to_proto(result: ModelResult) -> harness_pb2.ModelResult:
    wire = harness_pb2.ModelResult(message=message_to_proto(result.message))
    if result.usage is not None:
        wire.usage.CopyFrom(usage_to_proto(result.usage))
    return wire


def model_result_from_proto(result: harness_pb2.ModelResult) -> ModelResult:
    usage = usage_from_proto(result.usage) if result.HasField("usage") else None
    return ModelResult(message=message_from_proto(result.message), usage=usage)


# -- descriptors ----------------------------------------------------------------------------------------


def descriptor_to_proto(descriptor: HarnessDescriptor) -> harness_pb2.HarnessDescriptor:
    return harness_pb2.HarnessDescriptor(
        id=descriptor.id,
        version=descriptor.version,
        models=list(descriptor.models),
        tools=[
            harness_pb2.ToolSpec(
                name=t.name,
                description=t.description,
                mediation=common_pb2.Mediation.ValueType(int(t.mediation)),
            )
            for t in descriptor.tools
        ],
        capabilities=harness_pb2.Capabilities(
            resumability=harness_pb2.Resumability.ValueType(int(descriptor.resumability)),
            fork_safe=descriptor.fork_safe,
            requires_gpu=descriptor.requires_gpu,
            streaming=descriptor.streaming,
            reasoning_replay=descriptor.reasoning_replay,
        ),
    )


def descriptor_from_proto(descriptor: harness_pb2.HarnessDescriptor) -> HarnessDescriptor:
    caps = descriptor.capabilities
    return HarnessDescriptor(
        id=descriptor.id,
        version=descriptor.version,
        models=tuple(descriptor.models),
        tools=tuple(
            ToolSpec(
                name=t.name,
                description=t.description,
                mediation=_enum(Mediation, t.mediation, "tool mediation"),
            )
            for t in descriptor.tools
        ),
        resumability=_enum(Resumability, caps.resumability, "resumability"),
        fork_safe=caps.fork_safe,
        requires_gpu=caps.requires_gpu,
        streaming=caps.streaming,
        reasoning_replay=caps.reasoning_replay,
    )
