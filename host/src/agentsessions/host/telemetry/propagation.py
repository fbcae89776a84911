"""The trace context a turn hands to its harness: W3C ``traceparent`` (and ``tracestate``) as
``Harness.Connect`` call metadata, so the harness's spans join the turn's trace."""

from __future__ import annotations

from agentsessions.host.telemetry import switch


def outgoing_metadata() -> tuple[tuple[str, str], ...]:
    """The current trace context as gRPC metadata pairs (empty when nothing is being traced)."""
    if not switch.enabled():
        return ()  # nothing records, so there is no context to hand on
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return tuple(carrier.items())
