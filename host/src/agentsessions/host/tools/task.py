"""The ``task`` tool (subagents, docs/subagents.md): its name, its arguments and the one place a settled
child's final output becomes the parent's tool result.

A harness that lists a ToolSpec named ``task`` in its descriptor is offered it; its ``task`` calls go to
the host with mediation REQUIRES_APPROVAL (the host answers them after a decision of its own: the
child's end). The arguments are checked here, before anything runs, and a bad one is named in the
error result the call gets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from google.protobuf import json_format, struct_pb2

from agentsessions.host.controller.results import ResultSchemaError, check_schema
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2, harness_pb2

TASK_TOOL: Final = "task"
# The arguments a task call may carry, and what each must be.
TASK_ARGUMENTS: Final = {
    "prompt": "a non-empty string: the child's input",
    "harness": "a harness name: the child is a new session of that harness",
    "fork": "a boolean: the child is a fork of the parent, before the delegating turn",
    "result_schema": "an object (a JSON Schema): the data the child's result must match",
}
PROMPT_LIMIT: Final = 256 * 1024


class TaskArgumentError(ValueError):
    """A task call's argument breaks a rule; the message names the argument and the rule."""

    def __init__(self, argument: str, rule: str) -> None:
        super().__init__(f"task argument {argument!r} {rule}")
        self.argument = argument


@struct(frozen=True)
class TaskArgs:
    prompt: str
    harness: str = ""  # empty: the parent's harness (unless fork)
    fork: bool = False
    result_schema: dict[str, Any] | None = None


def offers_task(descriptor: harness_pb2.HarnessDescriptor | None) -> bool:
    """Whether the harness declared it wants the host's ``task`` tool."""
    return descriptor is not None and any(spec.name == TASK_TOOL for spec in descriptor.tools)


def is_task_call(call: common_pb2.ToolCall) -> bool:
    return call.tool == TASK_TOOL and call.mediation == common_pb2.MEDIATION_REQUIRES_APPROVAL


def struct_args(args: struct_pb2.Struct) -> dict[str, Any]:
    return json_format.MessageToDict(args)


def parse_task_args(args: Mapping[str, Any]) -> TaskArgs:
    """The task call's arguments, or TaskArgumentError naming the first one that breaks a rule."""
    unknown = sorted(set(args) - set(TASK_ARGUMENTS))
    if unknown:
        raise TaskArgumentError(
            unknown[0], f"is not an argument of task (it takes {', '.join(TASK_ARGUMENTS)})"
        )
    prompt = args.get("prompt")
    if prompt is None:
        raise TaskArgumentError("prompt", "is required: " + TASK_ARGUMENTS["prompt"])
    if not isinstance(prompt, str) or not prompt.strip():
        raise TaskArgumentError("prompt", "must be " + TASK_ARGUMENTS["prompt"])
    if len(prompt.encode()) > PROMPT_LIMIT:
        raise TaskArgumentError("prompt", f"must be at most {PROMPT_LIMIT} bytes")
    harness = args.get("harness", "")
    if not isinstance(harness, str):
        raise TaskArgumentError("harness", "must be " + TASK_ARGUMENTS["harness"])
    fork = args.get("fork", False)
    if not isinstance(fork, bool):
        raise TaskArgumentError("fork", "must be " + TASK_ARGUMENTS["fork"])
    if fork and harness:
        raise TaskArgumentError("harness", "cannot be combined with fork: a fork runs the parent's harness")
    schema = args.get("result_schema")
    if schema is not None:
        if not isinstance(schema, dict):
            raise TaskArgumentError("result_schema", "must be " + TASK_ARGUMENTS["result_schema"])
        try:
            schema = check_schema(schema)  # the rules a Submit's result_schema meets (docs/results.md)
        except ResultSchemaError as exc:
            raise TaskArgumentError("result_schema", str(exc)) from None
    return TaskArgs(prompt=prompt, harness=harness, fork=fork, result_schema=schema)


def result_parts(
    final: common_pb2.Message | None, result_schema: dict[str, Any] | None
) -> list[common_pb2.Part]:
    """What a child that completed gives its parent: its final output's parts.

    A child started with ``result_schema`` ran a turn bound to it (controller/results.py): it
    completed only with a result that validates, and its final output is that result as a data
    part; one that never validated ended FAILED and comes back as an error result instead.
    """
    del result_schema  # already enforced by the child's own turn
    return list(final.parts) if final is not None else []
