"""A coding agent: a model loop over workspace tools, with the human gate the mode asks for.

Execution config (JSON object; every key optional when the harness was built with a default)::

    {"workspace": "/abs/path/to/repo",          # required here or as the constructor default
     "mode": "plan" | "ask-before" | "allow-edits" | "auto",   # default "ask-before"
     "system_prompt": "...",                    # replaces the built-in prompt
     "model": "...",                            # "" lets the host pick its configured model
     "max_steps": 20,                           # model calls per execution, 1..100
     "shell_timeout_s": 30}                     # upper bound for run_shell, (0, 600]

Tools and who runs them, per mode (spec 4.7 mediation tiers):

============  ==================  =======================  ==================
mode          read_file/list_dir  write_file/edit_file     run_shell
============  ==================  =======================  ==================
plan          harness, reported   not offered              not offered
ask-before    harness, reported   host, after approval     host, after approval
allow-edits   harness, reported   harness, reported        host, after approval
auto          harness, reported   harness, reported        harness, reported
============  ==================  =======================  ==================

"Harness, reported" calls run here and are journaled through ``sink.report`` before the model
sees their result. "Host, after approval" calls go through ``sink.tool_call`` with
REQUIRES_APPROVAL: the host journals the intent and parks the execution (the park propagates
out of ``run`` as ``ApprovalParkedError``); after a decision, recovery re-runs this loop, the
recorded model completions are served again, and the re-emitted call gets the host's receipt
(denied, or the result of the host's executor, ``agentsessions.harnesses.coding_tools``).

Replay safety: the harness is STATELESS_REPLAY. Every model call id, tool call id and
idempotency key is derived from the execution id and the step, so a re-run reproduces them
byte for byte. Reported tools re-run on replay and recovery (that is the tier's contract): reads
are harmless, but in ``allow-edits``/``auto`` a recovery repeats in-harness edits and shell
commands, and a result that differs from the journal (an edit whose text is gone) diverges.
Use ``ask-before`` where effects must happen exactly once; there the host's receipts dedup them.

Context sent to the model: the system prompt, then for earlier executions each INPUT message
and the text of each OUTPUT (tool plumbing of finished turns is dropped), then this
execution's inputs and its own tool exchanges.

Serve it on its own: ``python -m agentsessions.harnesses.coding --listen 127.0.0.1:50063``
(the workspace then comes from each execution's config).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format, struct_pb2

from agentsessions.harnesses.coding_tools import (
    DEFAULT_SHELL_TIMEOUT_S,
    MAX_SHELL_TIMEOUT_S,
    CodingToolError,
    Workspace,
    run_workspace_tool,
)
from agentsessions.sdk.cli import serve_main
from agentsessions.sdk.harness import EventSink, Start, message_text, text_message
from agentsessions.v1 import common_pb2, harness_pb2

MODES = ("plan", "ask-before", "allow-edits", "auto")
DEFAULT_MODE = "ask-before"
DEFAULT_MAX_STEPS = 20
MAX_STEPS_LIMIT = 100

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful coding agent working in a repository. Use the tools to inspect files "
    "before changing them, make the smallest change that does the job, and finish with a short "
    "summary of what you changed. Paths are relative to the repository root."
)

_REPORTED = common_pb2.MEDIATION_IN_HARNESS_REPORTED
_APPROVAL = common_pb2.MEDIATION_REQUIRES_APPROVAL

# Who runs each tool in each mode; a tool missing from a mode is not offered to the model.
_MEDIATION: dict[str, dict[str, common_pb2.Mediation.ValueType]] = {
    "plan": {"read_file": _REPORTED, "list_dir": _REPORTED},
    "ask-before": {
        "read_file": _REPORTED,
        "list_dir": _REPORTED,
        "write_file": _APPROVAL,
        "edit_file": _APPROVAL,
        "run_shell": _APPROVAL,
    },
    "allow-edits": {
        "read_file": _REPORTED,
        "list_dir": _REPORTED,
        "write_file": _REPORTED,
        "edit_file": _REPORTED,
        "run_shell": _APPROVAL,
    },
    "auto": {
        "read_file": _REPORTED,
        "list_dir": _REPORTED,
        "write_file": _REPORTED,
        "edit_file": _REPORTED,
        "run_shell": _REPORTED,
    },
}


def _schema(properties: dict[str, Any], required: Sequence[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required)}


_STRING = {"type": "string"}

# name -> (description, JSON Schema of the arguments)
_TOOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "read_file": (
        "Read a UTF-8 text file (at most 256 KiB; longer files are truncated).",
        _schema({"path": _STRING}, ["path"]),
    ),
    "list_dir": (
        "List a directory; subdirectories end with '/'.",
        _schema({"path": {"type": "string", "default": "."}}, []),
    ),
    "write_file": (
        "Create or overwrite a file with the given content.",
        _schema({"path": _STRING, "content": _STRING}, ["path", "content"]),
    ),
    "edit_file": (
        "Replace the one occurrence of old_string with new_string in a file.",
        _schema(
            {"path": _STRING, "old_string": _STRING, "new_string": _STRING},
            ["path", "old_string", "new_string"],
        ),
    ),
    "run_shell": (
        "Run a /bin/sh command in the repository root; output is capped and the run is time-bounded.",
        _schema({"command": _STRING, "timeout_s": {"type": "number"}}, ["command"]),
    ),
}


class CodingConfigError(ValueError):
    """The execution config is not a coding config; the message names the key and the rule."""


@dataclass(frozen=True)
class CodingConfig:
    """One execution's settings, after defaults."""

    workspace: str
    mode: str = DEFAULT_MODE
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    model: str = ""
    max_steps: int = DEFAULT_MAX_STEPS
    shell_timeout_s: float = DEFAULT_SHELL_TIMEOUT_S


def parse_config(raw: bytes, defaults: CodingConfig) -> CodingConfig:
    """Overlay an execution's JSON config on the harness defaults; raises CodingConfigError."""
    if not raw:
        document: dict[str, Any] = {}
    else:
        try:
            decoded = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CodingConfigError(f"coding config is not JSON: {exc}") from None
        if not isinstance(decoded, dict):
            raise CodingConfigError("coding config must be a JSON object")
        document = decoded
    known = {"workspace", "mode", "system_prompt", "model", "max_steps", "shell_timeout_s"}
    unknown = sorted(set(document) - known)
    if unknown:
        raise CodingConfigError(f"coding config: unknown key(s) {', '.join(map(repr, unknown))}")
    for key in ("workspace", "mode", "system_prompt", "model"):
        if key in document and not isinstance(document[key], str):
            raise CodingConfigError(f"coding config {key}: must be a string")
    config = CodingConfig(
        workspace=document.get("workspace", defaults.workspace),
        mode=document.get("mode", defaults.mode),
        system_prompt=document.get("system_prompt", defaults.system_prompt),
        model=document.get("model", defaults.model),
        max_steps=document.get("max_steps", defaults.max_steps),
        shell_timeout_s=document.get("shell_timeout_s", defaults.shell_timeout_s),
    )
    if not config.workspace:
        raise CodingConfigError("coding config workspace: required (no default workspace is configured)")
    if config.mode not in MODES:
        raise CodingConfigError(f"coding config mode: {config.mode!r} is not one of {', '.join(MODES)}")
    steps = config.max_steps
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS_LIMIT:
        raise CodingConfigError(f"coding config max_steps: must be an integer in 1..{MAX_STEPS_LIMIT}")
    timeout = config.shell_timeout_s
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or not 0 < timeout <= MAX_SHELL_TIMEOUT_S
    ):
        raise CodingConfigError(f"coding config shell_timeout_s: must be in (0, {MAX_SHELL_TIMEOUT_S:g}]")
    return config


def tool_definitions(mode: str) -> list[common_pb2.ToolDefinition]:
    """The tools offered to the model in ``mode``, in a fixed order."""
    definitions = []
    for name in _TOOLS:
        if name in _MEDIATION[mode]:
            description, schema = _TOOLS[name]
            input_schema = struct_pb2.Struct()
            input_schema.update(schema)
            definitions.append(
                common_pb2.ToolDefinition(name=name, description=description, input_schema=input_schema)
            )
    return definitions


def conversation(start: Start, system_prompt: str) -> list[common_pb2.Message]:
    """The context of the first model call of an execution."""
    messages: list[common_pb2.Message] = []
    if system_prompt:
        messages.append(text_message("system", system_prompt))
    for event in start.history:
        if not event.HasField("message"):
            continue
        if event.kind == common_pb2.EVENT_INPUT:
            messages.append(event.message)
        elif event.kind == common_pb2.EVENT_OUTPUT:
            text = message_text(event.message)
            if text:
                messages.append(text_message(event.message.role or "assistant", text))
    messages.extend(start.inputs)
    return messages


def model_call_id(execution_id: str, step: int) -> str:
    """A 16-hex model call id, the same on every run of the execution."""
    return hashlib.sha256(f"{execution_id}/model/{step}".encode()).hexdigest()[:16]


def tool_call_id(execution_id: str, step: int, index: int) -> str:
    """The journaled id of the index-th tool call the model proposed at ``step``."""
    return f"call-{execution_id}-{step}-{index}"


def idempotency_key(execution_id: str, step: int, index: int) -> str:
    """The host-side dedup key of that call (unique in the session: execution ids are)."""
    return f"coding-{execution_id}-{step}-{index}"


def _args_of(call: common_pb2.ToolCall) -> dict[str, Any]:
    return json_format.MessageToDict(call.args) if call.HasField("args") else {}


def _struct(value: Mapping[str, Any]) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(dict(value))
    return struct


class CodingHarness:
    """The coding agent. Constructor values are defaults an execution's config may override."""

    def __init__(
        self,
        *,
        workspace: str = "",
        mode: str = DEFAULT_MODE,
        model: str = "",
        system_prompt: str = DEFAULT_SYSTEM_PROMPT,
        max_steps: int = DEFAULT_MAX_STEPS,
        shell_timeout_s: float = DEFAULT_SHELL_TIMEOUT_S,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
        self._defaults = CodingConfig(
            workspace=workspace,
            mode=mode,
            system_prompt=system_prompt,
            model=model,
            max_steps=max_steps,
            shell_timeout_s=shell_timeout_s,
        )

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        # Mediation as the default mode runs each tool; a tool that mode withholds is listed as
        # REQUIRES_APPROVAL, the strictest tier another execution's mode may run it under.
        default = _MEDIATION[self._defaults.mode]
        tools = [
            harness_pb2.ToolSpec(
                name=name, description=_TOOLS[name][0], mediation=default.get(name, _APPROVAL)
            )
            for name in _TOOLS
        ]
        return harness_pb2.HarnessDescriptor(
            id="coding",
            version="1",
            models=[self._defaults.model] if self._defaults.model else [],
            tools=tools,
            capabilities=harness_pb2.Capabilities(resumability=harness_pb2.RESUMABILITY_STATELESS_REPLAY),
        )

    async def run(self, start: Start, sink: EventSink) -> None:
        config = parse_config(start.config, self._defaults)
        try:
            workspace = await asyncio.to_thread(Workspace.open, config.workspace)
        except CodingToolError as exc:
            raise CodingConfigError(f"coding config workspace: {exc}") from None
        await _AgentLoop(start, sink, config, workspace).run()


class _AgentLoop:
    """One execution: model, tools, model, ... until an answer without tool calls."""

    def __init__(self, start: Start, sink: EventSink, config: CodingConfig, workspace: Workspace) -> None:
        self._start = start
        self._sink = sink
        self._config = config
        self._workspace = workspace
        self._mediation = _MEDIATION[config.mode]
        self._tools = tool_definitions(config.mode)

    async def run(self) -> None:
        execution = self._start.execution_id
        messages = conversation(self._start, self._config.system_prompt)
        for step in range(self._config.max_steps):
            result = await self._sink.model(
                common_pb2.ModelCall(
                    model=self._config.model,
                    id=model_call_id(execution, step),
                    messages=messages,
                    tools=self._tools,
                    tool_choice=common_pb2.ToolChoice(mode=common_pb2.ToolChoice.MODE_AUTO),
                )
            )
            completion = common_pb2.Message()
            completion.CopyFrom(result.message)
            proposed = [part.tool_call for part in completion.parts if part.WhichOneof("part") == "tool_call"]
            if not proposed:
                return  # the completion is the answer, already journaled as OUTPUT
            for index, call in enumerate(proposed):
                if not call.id:
                    call.id = tool_call_id(execution, step, index)  # the model must see ids to match results
            messages.append(completion)
            for index, call in enumerate(proposed):
                outcome = await self._run_tool(step, index, call)
                answer = common_pb2.ToolResult(
                    id=call.id,
                    output=outcome.output,
                    content=outcome.content,
                    is_error=outcome.is_error,
                    error=outcome.error,
                )
                messages.append(common_pb2.Message(role="tool", parts=[common_pb2.Part(tool_result=answer)]))
        await self._sink.output(f"Stopped after {self._config.max_steps} model steps without a final answer.")

    async def _run_tool(self, step: int, index: int, proposed: common_pb2.ToolCall) -> common_pb2.ToolResult:
        execution = self._start.execution_id
        call_id = tool_call_id(execution, step, index)
        mediation = self._mediation.get(proposed.tool)
        args = _args_of(proposed)
        if mediation is None:
            offered = ", ".join(self._mediation)
            why = f"tool {proposed.tool!r} is not available in {self._config.mode} mode (tools: {offered})"
            refusal = common_pb2.ToolResult(id=call_id, is_error=True, error=why)
            await self._sink.report(refusal)
            return refusal
        if mediation == _APPROVAL:
            return await self._sink.tool_call(
                common_pb2.ToolCall(
                    id=call_id,
                    tool=proposed.tool,
                    args=_struct(self._host_args(proposed.tool, args)),
                    mediation=_APPROVAL,
                    idempotency_key=idempotency_key(execution, step, index),
                )
            )
        try:
            output = await run_workspace_tool(
                self._workspace, proposed.tool, args, shell_timeout_s=self._config.shell_timeout_s
            )
            result = common_pb2.ToolResult(id=call_id, output=_struct(output))
        except CodingToolError as exc:
            result = common_pb2.ToolResult(id=call_id, is_error=True, error=str(exc))
        await self._sink.report(result)
        return result

    def _host_args(self, tool: str, args: Mapping[str, Any]) -> dict[str, Any]:
        # The host's executor acts where this execution's config says, whatever the model wrote.
        host_args = dict(args)
        host_args["workspace"] = str(self._workspace.root)
        if tool == "run_shell":
            requested = host_args.get("timeout_s")
            bound = self._config.shell_timeout_s
            if (
                isinstance(requested, int | float)
                and not isinstance(requested, bool)
                and 0 < requested < bound
            ):
                bound = float(requested)
            host_args["timeout_s"] = bound
        return host_args


if __name__ == "__main__":
    sys.exit(serve_main(CodingHarness(), prog="python -m agentsessions.harnesses.coding"))
