"""The trace context a turn hands to its harness: W3C ``traceparent`` (and ``tracestate``) as
``Harness.Connect`` call metadata, so the harness's spans join the turn's trace."""

from __future__ import annotations

from opentelemetry import propagate


def outgoing_metadata() -> tuple[tuple[str, str], ...]:
    """The current trace context as gRPC metadata pairs (empty when nothing is being traced)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return tuple(carrier.items())
