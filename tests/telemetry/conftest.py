"""Telemetry test fixtures: the SDK's in-memory span exporter and metric reader, installed as the
process's global providers once (OpenTelemetry allows that once per process) and recording only
while a test that asks for ``telemetry`` runs."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricsData
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class _Switch(SpanProcessor):
    """Forwards finished spans only while on, so other tests' spans are not kept."""

    def __init__(self, inner: SpanProcessor) -> None:
        self.inner = inner
        self.on = False

    def on_start(self, span: Span, parent_context: otel_context.Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        if self.on:
            self.inner.on_end(span)

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


@dataclass
class Telemetry:
    spans: InMemorySpanExporter
    reader: InMemoryMetricReader

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def metrics(self) -> MetricsData:
        """What was measured so far (cumulative; empty before the first measurement)."""
        return self.reader.get_metrics_data() or MetricsData(resource_metrics=[])


_installed: tuple[_Switch, Telemetry] | None = None


def _install() -> tuple[_Switch, Telemetry]:
    global _installed
    if _installed is None:
        exporter = InMemorySpanExporter()
        switch = _Switch(SimpleSpanProcessor(exporter))
        provider = TracerProvider()
        provider.add_span_processor(switch)
        reader = InMemoryMetricReader()
        trace.set_tracer_provider(provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        assert trace.get_tracer_provider() is provider, "another tracer provider was installed first"
        _installed = (switch, Telemetry(exporter, reader))
    return _installed


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    switch, recorded = _install()
    recorded.spans.clear()
    recorded.reader.get_metrics_data()  # start from what this test adds (cumulative points grow)
    switch.on = True
    try:
        yield recorded
    finally:
        switch.on = False
        recorded.spans.clear()
