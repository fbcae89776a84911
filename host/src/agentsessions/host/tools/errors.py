"""Typed errors of host-run tools: refused calls, missing executors, bad configuration."""

from __future__ import annotations

from agentsessions.sdk.errors import ToolCallRejectedError


class InvalidToolCallError(ToolCallRejectedError):
    """A tool call breaks a rule and is refused before its intent is journaled.

    The message names the field and the rule, e.g. ``tool_call.id: required ...``.
    """

    def __init__(self, field: str, rule: str) -> None:
        super().__init__(f"{field}: {rule}")
        self.field = field
        self.rule = rule


class InvalidToolArgumentsError(InvalidToolCallError):
    """Tool arguments are not JSON-shaped (non-finite or out-of-range numbers, empty values)."""


class MissingToolCallIdError(InvalidToolCallError):
    """A host-run call has no id, so its result could not be correlated."""


class MissingIdempotencyKeyError(InvalidToolCallError):
    """A host-run call has no idempotency key, so a re-drive could repeat its effect."""


class UnmediatedToolCallError(InvalidToolCallError):
    """The call's mediation does not ask the host to run it (UNSPECIFIED or IN_HARNESS_REPORTED)."""


class MissingToolExecutorError(Exception):
    """No configured executor serves the tool. Raised after intent; nothing ran."""

    def __init__(self, tool: str, known: list[str]) -> None:
        served = ", ".join(sorted(known)) or "none"
        super().__init__(f"no tool executor serves tool {tool!r} (served tools: {served})")
        self.tool = tool


class ToolConfigError(Exception):
    """A tool-executor flag or configuration file is malformed; the message names where."""


class DuplicateToolError(ToolConfigError):
    """Two executors offer a tool with the same name."""


class ToolExecutorStartError(Exception):
    """An executor could not start (e.g. an MCP server failed to launch or to initialize)."""
