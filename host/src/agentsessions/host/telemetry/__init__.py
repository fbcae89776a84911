"""OpenTelemetry traces and metrics for the host (``--otel-exporter``; docs/telemetry.md).

Instrumentation uses the OpenTelemetry API only, so it costs next to nothing until a provider is
installed (``setup.install``, or an application embedding the host installing its own). Spans and
metrics carry names, ids, counts, codes and durations, never payloads: no inputs, completions,
tool arguments or results, and no error messages (only error types).

``rpc``: a SERVER span and ``rpc.server.call.duration`` per RPC; ``genai``: a span per turn, child
spans for model calls and tool calls (GenAI semantic conventions), journal append spans, and their
metrics; ``propagation``: the W3C trace context handed to harnesses over ``Harness.Connect``.

The API is imported by what records, when it first records (``rpc`` when imported: it is served
only while telemetry is on), so a host that exports nothing starts without it.
"""

from typing import TYPE_CHECKING, Any

from agentsessions.host.telemetry.genai import TracedModel, TracedTools, journal_append, traced_turn
from agentsessions.host.telemetry.propagation import outgoing_metadata
from agentsessions.host.telemetry.setup import SERVICE_NAME, Installed, install

if TYPE_CHECKING:
    from agentsessions.host.telemetry.rpc import TelemetryInterceptor


def __getattr__(name: str) -> Any:
    if name == "TelemetryInterceptor":
        from agentsessions.host.telemetry.rpc import TelemetryInterceptor

        return TelemetryInterceptor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SERVICE_NAME",
    "Installed",
    "TelemetryInterceptor",
    "TracedModel",
    "TracedTools",
    "install",
    "journal_append",
    "outgoing_metadata",
    "traced_turn",
]
