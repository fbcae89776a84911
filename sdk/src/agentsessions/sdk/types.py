"""The contract's values in native Python: what harness code reads and builds.

Each class is the native twin of the ``agentsessions.v1`` message of the same name: small frozen
dataclasses whose structured fields (tool arguments, outputs, schemas) are plain ``dict`` values
of JSON; sequence fields accept any sequence (a list is fine) and hold a tuple. Protobuf appears
only at the wire: :mod:`agentsessions.sdk.convert` turns these into ``*_pb2`` messages and back,
exactly (a round trip gives the same message, so the model-input hash a replay checks does not
move).

Numbers in ``dict`` fields follow JSON: an integer stays an ``int`` through the wire's
``google.protobuf.Struct`` (``3`` comes back as ``3``, not ``3.0``; a float with an integral value,
``3.0``, comes back as ``3`` too, as JSON cannot tell them apart), and an integer beyond
+-(2^53-1), which a Struct cannot hold exactly, is refused before anything is sent.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import field
from typing import Any

from agentsessions.sdk.structs import struct


class Mediation(enum.IntEnum):
    """Who runs a tool call, and whether a human must agree first (``agentsessions.v1.Mediation``)."""

    UNSPECIFIED = 0
    IN_HARNESS_REPORTED = 1  # the harness runs it and reports the result
    CONTROLLER_MEDIATED = 2  # the host runs it, at most once per idempotency key
    REQUIRES_APPROVAL = 3  # the host runs it after a recorded human decision


class Resumability(enum.IntEnum):
    """How a harness's state survives an interruption (``agentsessions.v1.Resumability``)."""

    UNSPECIFIED = 0
    STATELESS_REPLAY = 1
    REQUIRES_MEMORY_SNAPSHOT = 2


class ToolChoiceMode(enum.IntEnum):
    """``agentsessions.v1.ToolChoice.Mode``."""

    UNSPECIFIED = 0
    AUTO = 1
    NONE = 2
    REQUIRED = 3


class ResultCode(enum.IntEnum):
    """Host-owned reasons a call produced an error receipt (``agentsessions.v1.ToolResult.Code``)."""

    UNSPECIFIED = 0
    APPROVAL_DENIED = 1
    EXECUTOR_ERROR = 2


def _tuple(value: Iterable[Any]) -> tuple[Any, ...]:
    return value if isinstance(value, tuple) else tuple(value)


@struct(frozen=True, slots=True)
class TextPart:
    """Plain text."""

    text: str


@struct(frozen=True, slots=True)
class FilePart:
    """A file, inline (``data``) or by reference (``uri``); at most one of the two."""

    mime: str = ""
    data: bytes | None = None
    uri: str = ""
    name: str = ""
    digest: str = ""


@struct(frozen=True, slots=True)
class DataPart:
    """JSON-shaped structured data (None: the part carries no object)."""

    data: dict[str, Any] | None = None


@struct(frozen=True, slots=True)
class ReasoningPart:
    """Provider reasoning, kept verbatim so it can be handed back on later calls."""

    provider: str = ""
    model_id: str = ""
    opaque: bytes | None = None
    opaque_uri: str = ""
    summary: Sequence[Part] = ()
    item_id: str = ""
    ordinal: int = 0
    validity_scope: str = ""
    opaque_digest: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "summary", _tuple(self.summary))


@struct(frozen=True, slots=True)
class ToolCall:
    """A tool invocation: proposed by a model (a part of its completion) or made by the harness.

    ``args`` is a dict of JSON values; an empty dict travels as no arguments. ``mediation`` and
    ``idempotency_key`` matter only when the call is made (:meth:`Execution.call_tool` fills them
    in from the tool's declared mediation and the execution when left empty).
    """

    id: str
    name: str
    args: dict[str, Any] = field(default_factory=dict)
    mediation: Mediation = Mediation.UNSPECIFIED
    idempotency_key: str = ""


@struct(frozen=True, slots=True)
class ApprovalDecision:
    """The recorded decision behind an approval receipt (transport only: never reported back)."""

    approved: bool
    reason: str = ""
    request_seq: int = 0


@struct(frozen=True, slots=True)
class ToolResult:
    """The outcome of a tool call. ``output`` is structured output (None: none), ``content`` the
    output as parts. The receipt fields (``code``, ``approval_*_seq``) are host-owned: a harness
    never sets them. ``decision`` is the approval decision a receipt settles, when there was one."""

    id: str
    output: dict[str, Any] | None = None
    content: Sequence[Part] = ()
    is_error: bool = False
    error: str = ""
    output_uri: str = ""
    output_digest: str = ""
    code: ResultCode = ResultCode.UNSPECIFIED
    approval_request_seq: int = 0
    approval_decision_seq: int = 0
    decision: ApprovalDecision | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "content", _tuple(self.content))

    @classmethod
    def ok(cls, id: str, output: Mapping[str, Any] | None = None, *, text: str = "") -> ToolResult:
        """A successful result with structured ``output`` and/or ``text`` content."""
        return cls(
            id=id,
            output=dict(output) if output is not None else None,
            content=(TextPart(text),) if text else (),
        )

    @classmethod
    def failure(cls, id: str, error: str) -> ToolResult:
        """A failed result carrying ``error``."""
        return cls(id=id, is_error=True, error=error)

    @property
    def denied(self) -> bool:
        """Whether an approval decision denied the call (nothing ran)."""
        return self.code == ResultCode.APPROVAL_DENIED

    def text(self) -> str:
        """The concatenation of the content's text parts."""
        return "".join(p.text for p in self.content if isinstance(p, TextPart))


Part = TextPart | FilePart | DataPart | ReasoningPart | ToolCall | ToolResult


@struct(frozen=True, slots=True)
class Message:
    """A message in a conversation: a role ("user", "assistant", "system" or "tool") and parts."""

    role: str
    parts: Sequence[Part] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "parts", _tuple(self.parts))

    @classmethod
    def user(cls, text: str) -> Message:
        return cls("user", (TextPart(text),))

    @classmethod
    def assistant(cls, text: str) -> Message:
        return cls("assistant", (TextPart(text),))

    @classmethod
    def system(cls, text: str) -> Message:
        return cls("system", (TextPart(text),))

    @classmethod
    def tool(cls, *results: ToolResult) -> Message:
        """A role "tool" message answering tool calls with their results."""
        return cls("tool", results)

    def text(self) -> str:
        """The concatenation of the text parts."""
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The tool calls among the parts, in order."""
        return tuple(p for p in self.parts if isinstance(p, ToolCall))

    @property
    def tool_results(self) -> tuple[ToolResult, ...]:
        """The tool results among the parts, in order."""
        return tuple(p for p in self.parts if isinstance(p, ToolResult))


@struct(frozen=True, slots=True)
class ToolDefinition:
    """A tool offered to the model: its name, description and JSON Schema of the arguments."""

    name: str
    description: str = ""
    schema: dict[str, Any] | None = None


@struct(frozen=True, slots=True)
class ToolChoice:
    """How the model may use the tools; ``name`` picks one tool (with REQUIRED)."""

    mode: ToolChoiceMode = ToolChoiceMode.UNSPECIFIED
    name: str = ""


@struct(frozen=True, slots=True)
class Usage:
    """Token accounting for model work."""

    model: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0


@struct(frozen=True, slots=True)
class ModelCall:
    """A model request as the harness builds it. ``params`` are provider parameters as strings
    (the chat-completions convention: a body field's name and its JSON text, ``{"temperature":
    "0.2"}``); they are journaled and reach the provider."""

    messages: Sequence[Message]
    model: str = ""
    tools: Sequence[ToolDefinition] = ()
    tool_choice: ToolChoice | None = None
    params: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "messages", _tuple(self.messages))
        object.__setattr__(self, "tools", _tuple(self.tools))


@struct(frozen=True, slots=True)
class ModelResult:
    """A completion: the assistant message (journaled as OUTPUT) and its usage, when known."""

    message: Message
    usage: Usage | None = None

    def text(self) -> str:
        return self.message.text()

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        return self.message.tool_calls


@struct(frozen=True, slots=True)
class ToolSpec:
    """A tool the harness may call, and who runs it."""

    name: str
    description: str = ""
    mediation: Mediation = Mediation.IN_HARNESS_REPORTED


@struct(frozen=True, slots=True)
class HarnessDescriptor:
    """What a harness says about itself (``agentsessions.v1.HarnessDescriptor`` with its
    ``Capabilities`` flattened). ``version`` is recorded with every execution and checked on
    recovery: bump it when a change would make old executions replay differently."""

    id: str
    version: str
    models: Sequence[str] = ()
    tools: Sequence[ToolSpec] = ()
    resumability: Resumability = Resumability.STATELESS_REPLAY
    fork_safe: bool = False
    requires_gpu: bool = False
    streaming: bool = False
    reasoning_replay: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "models", _tuple(self.models))
        object.__setattr__(self, "tools", _tuple(self.tools))

    def mediation(self, tool: str) -> Mediation | None:
        """The declared mediation of ``tool`` (None when the descriptor does not list it)."""
        for spec in self.tools:
            if spec.name == tool:
                return spec.mediation
        return None
