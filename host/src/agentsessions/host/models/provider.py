"""The model provider seam: the host, never the harness, calls models."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from agentsessions.v1 import common_pb2, harness_pb2

# Receives each streamed text chunk of the completion, in order.
DeltaCallback = Callable[[str], Awaitable[None]]


class ModelError(Exception):
    """The provider failed to produce a completion."""


class ModelProvider(Protocol):
    """Produces a completion for a (wire) ModelCall carrying messages, tools and tool_choice."""

    async def complete(
        self, call: common_pb2.ModelCall, on_delta: DeltaCallback | None = None
    ) -> harness_pb2.ModelResult:
        """The full completion message (and usage when known). Streams chunks to on_delta."""
        ...
