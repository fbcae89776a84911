"""Joining the host's trace from a harness, when OpenTelemetry is installed (it is optional here).

The host sends its turn's W3C trace context (``traceparent``) as ``Harness.Connect`` metadata.
:func:`start_run` opens a SERVER span ``agentsessions.v1.Harness/Connect`` as its child and returns
the context the harness's ``run`` task starts in, so spans the harness makes itself nest under the
turn. Without the ``opentelemetry-api`` package (the thin SDK does not require it) nothing is traced.
Spans carry ids and outcomes only, never inputs or outputs. The API is imported only once something
in the process installed a tracer provider (which imports it), so an untraced process never loads it.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
from collections.abc import Callable, Iterable
from typing import Any

from agentsessions.sdk.errors import ApprovalParkedError

CONNECT = "agentsessions.v1.Harness/Connect"

Finish = Callable[["asyncio.Task[Any]"], None]


def _ignore(task: asyncio.Task[Any]) -> None:
    return None


def start_run(
    metadata: Iterable[tuple[str, str | bytes]] | None, session: str, execution_id: str
) -> tuple[contextvars.Context | None, Finish]:
    """The context to create the run task in (None: the current one) and the done-callback that
    ends its span with the run's outcome."""
    trace: Any = sys.modules.get("opentelemetry.trace")  # installing a provider imports it
    if trace is None or isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return None, _ignore
    from opentelemetry import context as otel_context
    from opentelemetry import propagate

    carrier = {key: value for key, value in metadata or () if isinstance(value, str)}
    parent = propagate.extract(carrier)
    span = trace.get_tracer("agentsessions.sdk").start_span(
        CONNECT,
        context=parent,
        kind=trace.SpanKind.SERVER,
        attributes={
            "rpc.system.name": "grpc",
            "rpc.method": CONNECT,
            "agentsessions.session": session,
            "agentsessions.execution_id": execution_id,
        },
    )
    run_context = contextvars.copy_context()
    run_context.run(otel_context.attach, trace.set_span_in_context(span, parent))

    def finish(task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            span.set_attribute("agentsessions.run.outcome", "cancelled")
        elif isinstance(task.exception(), ApprovalParkedError):
            span.set_attribute("agentsessions.run.outcome", "parked")
        elif (error := task.exception()) is not None:
            # Only the type: a message may quote what the harness was working on.
            span.set_attribute("agentsessions.run.outcome", type(error).__name__)
            span.set_attribute("error.type", type(error).__name__)
        else:
            span.set_attribute("agentsessions.run.outcome", "returned")
        span.end()

    return run_context, finish
