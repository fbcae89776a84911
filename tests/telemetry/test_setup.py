"""``--otel-exporter``: the flag, and the providers each choice builds (console output, OTLP exporters)."""

from __future__ import annotations

import argparse
import io

import pytest
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

from agentsessions.host.config import ConfigError, HostConfig
from agentsessions.host.telemetry import setup


def test_otel_exporter_flag_and_environment() -> None:
    assert HostConfig().otel_exporter == "none"
    assert (
        HostConfig.from_sources(
            argparse.Namespace(), {"AGENTSESSIONS_OTEL_EXPORTER": "Console"}
        ).otel_exporter
        == "console"
    )
    flagged = HostConfig.from_sources(
        argparse.Namespace(otel_exporter="otlp"), {"AGENTSESSIONS_OTEL_EXPORTER": "console"}
    )
    assert flagged.otel_exporter == "otlp"
    with pytest.raises(ConfigError, match="--otel-exporter 'jaeger' is not one of none, console, otlp"):
        HostConfig(otel_exporter="jaeger")  # type: ignore[arg-type]


def test_none_installs_no_providers() -> None:
    built = setup.build("none")
    assert built.tracer_provider is None and built.meter_provider is None
    built.shutdown()


def test_console_exports_spans_named_for_the_service(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    out = io.StringIO()
    built = setup.build("console", out)
    assert built.tracer_provider is not None
    with built.tracer_provider.get_tracer("test").start_as_current_span("probe"):
        pass
    built.shutdown()
    text = out.getvalue()
    assert '"name": "probe"' in text
    assert '"service.name": "agentsessions-host"' in text


def test_otel_service_name_renames_the_service(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "host-eu-1")
    built = setup.build("console", io.StringIO())
    assert built.tracer_provider is not None
    assert built.tracer_provider.resource.attributes["service.name"] == "host-eu-1"
    built.shutdown()


def test_otlp_uses_the_otlp_grpc_exporters() -> None:
    spans, measurements = setup.exporters("otlp")
    assert isinstance(spans, OTLPSpanExporter)
    assert isinstance(measurements, OTLPMetricExporter)
    spans.shutdown()


@pytest.mark.parametrize(
    ("sampler", "argument", "exported"),
    [("always_off", None, 0), ("traceidratio", "0", 0), ("traceidratio", "1", 20), (None, None, 20)],
)
def test_the_standard_sampler_variables_decide_which_traces_are_kept(
    monkeypatch: pytest.MonkeyPatch, sampler: str | None, argument: str | None, exported: int
) -> None:
    for name, value in (("OTEL_TRACES_SAMPLER", sampler), ("OTEL_TRACES_SAMPLER_ARG", argument)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    out = io.StringIO()
    built = setup.build("console", out)
    assert built.tracer_provider is not None
    tracer = built.tracer_provider.get_tracer("test")
    for _ in range(20):
        with tracer.start_as_current_span("probe"), tracer.start_as_current_span("child"):
            pass
    built.shutdown()
    assert out.getvalue().count('"name": "probe"') == exported
    assert out.getvalue().count('"name": "child"') == exported
