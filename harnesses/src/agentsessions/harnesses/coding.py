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

The mode is the execution config's ``mode`` (else the harness's default) unless the host sets
one (``Execution.host_mode``: the session's ``agentsessions.io/mode``, docs/modes.md). Then the
host's mode is the mode, and every tool that changes something goes to the host as a
REQUIRES_APPROVAL call for the mode to decide: the descriptor declares each tool's class
(``[tool-class: ...]``, ``agentsessions.sdk.modes``), which hands those requests to the mode. In
``allow-edits`` the host approves edits by itself, in ``auto`` edits and shell commands (the
latter only where it runs them confined; elsewhere a person decides, the request saying why), in
``ask-before`` a person decides, and ``plan`` offers no such tool. Reads stay in the harness.

"Harness, reported" calls run here and are journaled (reported) before the model sees their
result. "Host, after approval" calls go to the host with REQUIRES_APPROVAL and a reason naming the
mode: the host journals the intent and parks the execution (the park propagates out of ``run``
as ``ApprovalParkedError``); after a decision, recovery re-runs this loop, the recorded model
completions are served again, and the re-emitted call gets the host's receipt (denied, or the
result of the host's executor, ``agentsessions.harnesses.coding_tools``).

Replay safety: the harness is STATELESS_REPLAY and written on the SDK's native API, so tool call
ids and idempotency keys are the SDK's deterministic ones (the model's own ids where it gave
them) and a re-run reproduces every call byte for byte. An in-harness tool within the recorded
effects of a replay or recovery is answered from the journal and does not run again, so even in
``allow-edits``/``auto`` an edit or shell command happens once (with a host that offers recorded
results: ``agentsessions.sdk.extensions``).

Context sent to the model: the system prompt, then the conversation the journal holds (earlier
executions' inputs, completions and tool exchanges: ``Start.conversation()``), then this
execution's inputs and its own tool exchanges. Version 2: version 1 kept only the text of
earlier outputs and derived its own tool ids, so its executions do not replay on this one.

Serve it on its own: ``python -m agentsessions.harnesses.coding --listen 127.0.0.1:50063``
(the workspace then comes from each execution's config).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from agentsessions.harnesses.coding_tools import (
    DEFAULT_SHELL_TIMEOUT_S,
    MAX_SHELL_TIMEOUT_S,
    CodingToolError,
    Workspace,
    run_workspace_tool,
)
from agentsessions.sdk import (
    Execution,
    HarnessDescriptor,
    Mediation,
    Message,
    NativeHarness,
    Start,
    ToolCall,
    ToolDefinition,
    ToolError,
    ToolFunction,
    ToolResult,
    ToolSpec,
)
from agentsessions.sdk.cli import serve_main
from agentsessions.sdk.modes import READ_ONLY, SUBPROCESS, WRITE, with_tool_classes
from agentsessions.sdk.structs import struct

MODES = ("plan", "ask-before", "allow-edits", "auto")
DEFAULT_MODE = "ask-before"
DEFAULT_MAX_STEPS = 20
MAX_STEPS_LIMIT = 100
VERSION = "2"

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful coding agent working in a repository. Use the tools to inspect files "
    "before changing them, make the smallest change that does the job, and finish with a short "
    "summary of what you changed. Paths are relative to the repository root."
)

_REPORTED = Mediation.IN_HARNESS_REPORTED
_APPROVAL = Mediation.REQUIRES_APPROVAL

# Who runs each tool in each mode; a tool missing from a mode is not offered to the model.
_MEDIATION: dict[str, dict[str, Mediation]] = {
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


# Who runs each tool under a host's mode: reads here, the rest by the host, as the mode decides.
_HOSTED: dict[str, dict[str, Mediation]] = {
    mode: _MEDIATION["ask-before"] if mode != "plan" else _MEDIATION["plan"] for mode in MODES
}

_CLASSES = {
    "read_file": READ_ONLY,
    "list_dir": READ_ONLY,
    "write_file": WRITE,
    "edit_file": WRITE,
    "run_shell": SUBPROCESS,
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


@struct(frozen=True)
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


def tool_definitions(mode: str) -> list[ToolDefinition]:
    """The tools offered to the model in ``mode``, in a fixed order."""
    return [
        ToolDefinition(name=name, description=description, schema=schema)
        for name, (description, schema) in _TOOLS.items()
        if name in _MEDIATION[mode]
    ]


def conversation(start: Start, system_prompt: str) -> list[Message]:
    """The context of the first model call of an execution."""
    return ([Message.system(system_prompt)] if system_prompt else []) + start.conversation()


class CodingHarness(NativeHarness):
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
        super().__init__()
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
        # Mediation as the default mode runs each tool; a tool that mode withholds is listed as
        # REQUIRES_APPROVAL, the strictest tier another execution's mode may run it under.
        default = _MEDIATION[mode]
        self.descriptor = HarnessDescriptor(
            id="coding",
            version=VERSION,
            models=(model,) if model else (),
            tools=tuple(
                ToolSpec(
                    name=name,
                    description=with_tool_classes(_TOOLS[name][0], [_CLASSES[name]]),
                    mediation=default.get(name, _APPROVAL),
                )
                for name in _TOOLS
            ),
        )

    async def execute(self, ex: Execution) -> None:
        config = parse_config(ex.start.config, self._defaults)
        if ex.host_mode:
            config = dataclasses.replace(config, mode=ex.host_mode)  # the host's mode is the mode
        try:
            workspace = await asyncio.to_thread(Workspace.open, config.workspace)
        except CodingToolError as exc:
            raise CodingConfigError(f"coding config workspace: {exc}") from None
        await _AgentLoop(ex, config, workspace).run()


class _AgentLoop:
    """One execution: model, tools, model, ... until an answer without tool calls."""

    def __init__(self, ex: Execution, config: CodingConfig, workspace: Workspace) -> None:
        self._ex = ex
        self._config = config
        self._workspace = workspace
        self._mediation = (_HOSTED if ex.host_mode else _MEDIATION)[config.mode]
        self._tools = tool_definitions(config.mode)

    async def run(self) -> None:
        ex = self._ex
        messages = conversation(ex.start, self._config.system_prompt)
        for _ in range(self._config.max_steps):
            result = await ex.model(messages, model=self._config.model, tools=self._tools, tool_choice="auto")
            if not result.tool_calls:
                return  # the completion is the answer, already journaled as OUTPUT
            messages.append(result.message)
            for call in result.tool_calls:
                messages.append(Message.tool(await self._run_tool(call)))
        await ex.output(f"Stopped after {self._config.max_steps} model steps without a final answer.")

    async def _run_tool(self, call: ToolCall) -> ToolResult:
        mediation = self._mediation.get(call.name)
        if mediation is None:
            offered = ", ".join(self._mediation)
            why = f"tool {call.name!r} is not available in {self._config.mode} mode (tools: {offered})"
            return await self._ex.call_tool(dataclasses.replace(call, mediation=_REPORTED), _refuse(why))
        if mediation == _APPROVAL:
            gated = dataclasses.replace(call, args=self._host_args(call.name, call.args), mediation=_APPROVAL)
            mode = self._config.mode
            why = (
                f"for the host's {mode} mode to decide"
                if self._ex.host_mode
                else f"needs approval in {mode} mode"
            )
            return await self._ex.call_tool(gated, reason=f"{call.name} {why}")
        return await self._ex.call_tool(
            dataclasses.replace(call, mediation=_REPORTED), self._workspace_tool(call.name)
        )

    def _workspace_tool(self, name: str) -> ToolFunction:
        async def run(args: dict[str, Any]) -> Any:
            try:
                return await run_workspace_tool(
                    self._workspace, name, args, shell_timeout_s=self._config.shell_timeout_s
                )
            except CodingToolError as exc:
                raise ToolError(str(exc)) from None

        return run

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


def _refuse(why: str) -> ToolFunction:
    def refuse(args: dict[str, Any]) -> Any:
        raise ToolError(why)

    return refuse


if __name__ == "__main__":
    sys.exit(serve_main(CodingHarness(), prog="python -m agentsessions.harnesses.coding"))
