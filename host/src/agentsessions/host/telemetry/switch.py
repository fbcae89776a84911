"""Whether anything records telemetry in this process, so the hot paths can skip it cheaply.

Through the API's proxies a no-op span still costs microseconds (a provider lookup, a context
attach), several times per turn. Telemetry is on once a tracer provider is installed: by
``setup.install`` (``--otel-exporter``), or by an application that embeds the host, noticed when
``build_app`` calls :func:`refresh`. The API itself is imported only by whoever records: a host that
exports nothing never loads it (start-up, bench/startup.py).
"""

from __future__ import annotations

import sys

_enabled = False


def enabled() -> bool:
    return _enabled


def refresh() -> bool:
    """Look again at the global tracer provider; returns whether telemetry is on."""
    global _enabled
    trace = sys.modules.get("opentelemetry.trace")
    # Installing a tracer provider imports the API's trace module: without it nobody installed one.
    _enabled = trace is not None and not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    return _enabled
