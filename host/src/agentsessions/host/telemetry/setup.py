"""Installing the OpenTelemetry SDK for ``--otel-exporter``: none, console, or otlp.

``none`` installs nothing (instrumentation stays on the API's no-op providers, unless the process
installed its own). ``console`` writes spans and metrics to stdout. ``otlp`` exports over OTLP/gRPC
to ``OTEL_EXPORTER_OTLP_ENDPOINT`` (default ``localhost:4317``; the exporter reads the other
``OTEL_EXPORTER_OTLP_*`` variables too) and needs ``opentelemetry-exporter-otlp-proto-grpc`` (the
host's ``otlp`` extra). The service is named ``agentsessions-host`` unless ``OTEL_SERVICE_NAME`` says
otherwise. Providers are process-wide: install once, at startup, and shut down at exit (flushes).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, TextIO

from agentsessions.host.telemetry import switch
from agentsessions.sdk.structs import struct

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

SERVICE_NAME = "agentsessions-host"


class TelemetryError(RuntimeError):
    """The chosen exporter cannot be used (for example, its package is not installed)."""


@struct
class Installed:
    """The installed providers; ``shutdown`` flushes and stops them."""

    tracer_provider: TracerProvider | None = None
    meter_provider: MeterProvider | None = None

    def shutdown(self) -> None:
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()


def exporters(kind: str, stream: TextIO | None = None) -> tuple[SpanExporter, MetricExporter]:
    """The span and metric exporters for ``kind`` (console or otlp)."""
    # The SDK loads only when an exporter is asked for: a host without one never imports it.
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    if kind == "console":
        out = stream or sys.stdout
        return ConsoleSpanExporter(out=out), ConsoleMetricExporter(out=out)
    if kind == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise TelemetryError(
                "--otel-exporter otlp needs opentelemetry-exporter-otlp-proto-grpc "
                "(pip install 'agentsessions-host[otlp]')"
            ) from exc
        return OTLPSpanExporter(), OTLPMetricExporter()
    raise TelemetryError(f"no exporter named {kind!r}")


def build(kind: str, stream: TextIO | None = None) -> Installed:
    """Providers exporting to ``kind``, not yet installed (``none``: no providers)."""
    if kind == "none":
        return Installed()
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import SERVICE_NAME as SERVICE_NAME_KEY
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    span_exporter, metric_exporter = exporters(kind, stream)
    # OTEL_RESOURCE_ATTRIBUTES adds attributes; OTEL_SERVICE_NAME, when set, renames the service.
    resource = Resource.create({SERVICE_NAME_KEY: os.environ.get("OTEL_SERVICE_NAME") or SERVICE_NAME})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
    readers: list[MetricReader] = [PeriodicExportingMetricReader(metric_exporter)]
    return Installed(tracer_provider, MeterProvider(resource=resource, metric_readers=readers))


def install(kind: str, stream: TextIO | None = None) -> Installed:
    """Build the providers for ``kind`` and make them the process's global providers."""
    installed = build(kind, stream)
    if installed.tracer_provider is not None:
        from opentelemetry import trace

        trace.set_tracer_provider(installed.tracer_provider)
    if installed.meter_provider is not None:
        from opentelemetry import metrics

        metrics.set_meter_provider(installed.meter_provider)
    switch.refresh()
    return installed
