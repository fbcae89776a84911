"""Tool call ids and idempotency keys, derived so that every run of an execution makes the same ones.

Replay and recovery compare each re-issued tool call with the recorded intent (id, tool, args,
mediation, key), so an id must not depend on timing or randomness. The rules:

- A tool call a model proposed keeps the model's id when it has one that is new in the
  execution; otherwise (no id, or a provider that repeats ids across completions) it gets
  ``call_`` + 24 hex digits of SHA-256 over (execution id, the completion's ordinal among the
  execution's model calls, the call's position in the completion). The completion the harness
  receives already carries these ids, so the model sees the ids its results answer.
- A call the harness makes on its own (not from a completion) without an id gets ``call_d`` + 23
  hex digits over (execution id, how many such calls came before it).
- The idempotency key of a host-run call is ``ik_`` + 32 hex digits over (execution id, call id):
  unique in the session (execution ids are), the same on every re-drive.
"""

from __future__ import annotations

import hashlib

from agentsessions.sdk.structs import replace
from agentsessions.sdk.types import Message, ToolCall


def _digest(*fields: str | int, length: int) -> str:
    return hashlib.sha256("\x00".join(str(f) for f in fields).encode()).hexdigest()[:length]


def completion_call_id(execution_id: str, model_index: int, position: int) -> str:
    """The id of the ``position``-th tool call of the ``model_index``-th completion (fallback)."""
    return "call_" + _digest(execution_id, "model", model_index, position, length=24)


def direct_call_id(execution_id: str, ordinal: int) -> str:
    """The id of the ``ordinal``-th id-less call the harness made on its own."""
    return "call_d" + _digest(execution_id, "direct", ordinal, length=23)


def idempotency_key(execution_id: str, call_id: str) -> str:
    """The host-side dedup key of a host-run call."""
    return "ik_" + _digest(execution_id, call_id, length=32)


class CallIds:
    """The id state of one execution: which ids its completions used, how many model calls and
    id-less direct calls it made. Replaying the same sequence of calls gives the same ids."""

    def __init__(self, execution_id: str) -> None:
        self.execution_id = execution_id
        self.model_calls = 0
        self._used: set[str] = set()
        self._direct = 0

    def completion(self, message: Message) -> Message:
        """The completion of the next model call with its tool calls' ids settled."""
        index = self.model_calls
        self.model_calls += 1
        changed = False
        parts = list(message.parts)
        position = 0
        for i, part in enumerate(parts):
            if not isinstance(part, ToolCall):
                continue
            call_id = part.id
            if not call_id or call_id in self._used:
                call_id = completion_call_id(self.execution_id, index, position)
                parts[i] = replace(part, id=call_id)
                changed = True
            self._used.add(call_id)
            position += 1
        return Message(message.role, tuple(parts)) if changed else message

    def direct(self) -> str:
        """An id for a call the harness makes on its own without one."""
        call_id = direct_call_id(self.execution_id, self._direct)
        self._direct += 1
        return call_id
