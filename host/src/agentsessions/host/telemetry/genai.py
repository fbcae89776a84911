"""Spans and metrics of turns, model calls, tool calls and journal appends.

A turn (one ``harness.run`` over an execution, live or recovered) is an ``invoke_agent <harness>``
span; the model calls it makes are ``chat <model>`` CLIENT spans and the host-run tool calls
``execute_tool <tool>`` spans (GenAI semantic conventions), and each journal append is a
``journal.append`` span, all children of the turn. Only names, ids, counts, token numbers, outcomes
and error types are recorded: never messages, completions, arguments or results.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Concatenate, ParamSpec, Protocol, TypeVar

from agentsessions.host.models.provider import DeltaCallback, ModelProvider
from agentsessions.host.telemetry import names, switch
from agentsessions.host.tools.profile import ToolProfile
from agentsessions.v1 import common_pb2, harness_pb2

if TYPE_CHECKING:
    from contextvars import Token

    from opentelemetry import metrics, trace
    from opentelemetry.context import Context


class _Instruments:
    """The tracer and the meters, made at the first use while telemetry is on: the API is imported
    then, so a host that exports nothing never loads it."""

    def __init__(self) -> None:
        from opentelemetry import context, metrics, trace

        self.trace = trace
        self.context = context
        self.tracer = trace.get_tracer(names.INSTRUMENTATION)
        meter = metrics.get_meter(names.INSTRUMENTATION)
        self.turns = meter.create_counter(names.TURNS, unit="{turn}", description="Turns run, by outcome.")
        self.append_duration = meter.create_histogram(
            names.JOURNAL_APPEND_DURATION, unit="s", description="Latency of durable journal appends."
        )
        self.operation_duration = meter.create_histogram(
            names.GEN_AI_CLIENT_OPERATION_DURATION,
            unit="s",
            description="Duration of model calls and tool calls.",
        )
        self.token_usage = meter.create_histogram(
            names.GEN_AI_CLIENT_TOKEN_USAGE,
            unit="{token}",
            description="Tokens per model call, when the provider says.",
        )


@functools.cache
def _otel() -> _Instruments:
    return _Instruments()


COMPLETED = "completed"
PARKED = "parked"
CANCELLED = "cancelled"
FAILED = "failed"


class _Named(Protocol):
    @property
    def name(self) -> str: ...


class _Started(Protocol):
    @property
    def execution_id(self) -> str: ...


_Self = TypeVar("_Self")
_Resolved = TypeVar("_Resolved", bound=_Named)
_Start = TypeVar("_Start", bound=_Started)
_Result = TypeVar("_Result")
_P = ParamSpec("_P")

Drive = Callable[Concatenate[_Self, str, _Resolved, _Start, _P], Awaitable[_Result]]


def traced_turn(
    *, cancelled: Callable[[BaseException], bool]
) -> Callable[[Drive[_Self, _Resolved, _Start, _P, _Result]], Drive[_Self, _Resolved, _Start, _P, _Result]]:
    """Decorate ``Driver.drive(self, uid, resolved, start, ...)`` (controller): a span per turn and the
    turns counter. The outcome is ``parked`` when it returns a value (the park's SUSPEND record),
    ``completed`` when it returns None, ``cancelled`` when ``cancelled(exc)``, else ``failed``."""

    def decorate(
        drive: Drive[_Self, _Resolved, _Start, _P, _Result],
    ) -> Drive[_Self, _Resolved, _Start, _P, _Result]:
        @functools.wraps(drive)
        async def traced(
            self: _Self, uid: str, resolved: _Resolved, start: _Start, /, *args: _P.args, **kwargs: _P.kwargs
        ) -> _Result:
            if not switch.enabled():
                return await drive(self, uid, resolved, start, *args, **kwargs)
            otel = _otel()
            attributes = {
                names.GEN_AI_OPERATION_NAME: names.INVOKE_AGENT,
                names.GEN_AI_AGENT_NAME: resolved.name,
                names.GEN_AI_CONVERSATION_ID: uid,
                names.SESSION: uid,
                names.EXECUTION_ID: start.execution_id,
            }
            # The turn's span is the current one while it runs: its model calls, tool calls and
            # appends nest under it, and the harness's trace context (Connect metadata) names it.
            span = otel.tracer.start_span(f"{names.INVOKE_AGENT} {resolved.name}", attributes=attributes)
            token = otel.context.attach(otel.trace.set_span_in_context(span))
            outcome = FAILED
            try:
                result = await drive(self, uid, resolved, start, *args, **kwargs)
                outcome = COMPLETED if result is None else PARKED
                return result
            except BaseException as exc:
                if cancelled(exc):
                    outcome = CANCELLED
                else:
                    span.set_attribute(names.ERROR_TYPE, type(exc).__name__)
                    span.set_status(otel.trace.Status(otel.trace.StatusCode.ERROR))
                raise
            finally:
                span.set_attribute(names.TURN_OUTCOME, outcome)
                otel.turns.add(1, {names.TURN_OUTCOME: outcome, names.GEN_AI_AGENT_NAME: resolved.name})
                otel.context.detach(token)
                span.end()

        return traced

    return decorate


class AppendSpan:
    """What a journal append reports back to its span: the records it wrote."""

    def __init__(self, span: trace.Span | None) -> None:
        self._span = span  # None: nothing records

    def wrote(self, records: list[common_pb2.LogRecord]) -> None:
        if records and self._span is not None:
            self._span.set_attribute(names.JOURNAL_LAST_SEQ, records[-1].seq)


class _Untraced(contextlib.AbstractContextManager[AppendSpan]):
    """``journal_append`` while telemetry is off: nothing to record."""

    def __init__(self) -> None:
        self._span = AppendSpan(None)

    def __enter__(self) -> AppendSpan:
        return self._span

    def __exit__(self, *exc_info: object) -> None:
        return None


_UNTRACED = _Untraced()


def journal_append(uid: str, count: int) -> contextlib.AbstractContextManager[AppendSpan]:
    """A ``journal.append`` span and the append latency around one durable append."""
    if not switch.enabled():
        return _UNTRACED
    return _Appending(uid, count)


class _Timed:
    """A span (INTERNAL unless ``kind`` says) whose failure is marked with its error type (never its
    message) and whose duration is recorded on ``duration`` with the ``measured`` attributes (plus
    the error type). With ``current`` it is the current span inside, so spans made there nest
    under it. (A class rather than generator-based context managers, the SDK's
    ``start_as_current_span`` and ``use_span`` among them: there are several a turn.)"""

    __slots__ = (
        "_current",
        "_duration",
        "_kind",
        "_measured",
        "_name",
        "_span",
        "_span_attributes",
        "_started",
        "_token",
    )

    def __init__(
        self,
        name: str,
        duration: metrics.Histogram,
        measured: dict[str, str | int],
        *,
        span_attributes: dict[str, str | int] | None = None,
        kind: trace.SpanKind | None = None,
        current: bool = True,
    ) -> None:
        self._name = name
        self._duration = duration
        self._measured = measured
        self._span_attributes = span_attributes
        self._kind = kind
        self._current = current
        self._started = 0.0
        self._token: Token[Context] | None = None

    def __enter__(self) -> trace.Span:
        otel = _otel()
        self._started = time.perf_counter()
        attributes = self._span_attributes if self._span_attributes is not None else self._measured
        kind = otel.trace.SpanKind.INTERNAL if self._kind is None else self._kind
        span = self._span = otel.tracer.start_span(self._name, kind=kind, attributes=attributes)
        if self._current:
            self._token = otel.context.attach(otel.trace.set_span_in_context(span))
        return span

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        span, otel = self._span, _otel()
        if exc is not None:
            self._measured[names.ERROR_TYPE] = type(exc).__name__
            span.set_attribute(names.ERROR_TYPE, type(exc).__name__)
            span.set_status(otel.trace.Status(otel.trace.StatusCode.ERROR))
        self._duration.record(time.perf_counter() - self._started, self._measured)
        if self._token is not None:
            otel.context.detach(self._token)
        span.end()


class _Appending(contextlib.AbstractContextManager[AppendSpan]):
    """``journal_append`` while telemetry is on. The span is not made current: nothing nests under
    an append, and attaching it would cost a context switch each way."""

    __slots__ = ("_timed",)

    def __init__(self, uid: str, count: int) -> None:
        attributes: dict[str, str | int] = {names.SESSION: uid, names.JOURNAL_RECORDS: count}
        self._timed = _Timed(
            "journal.append", _otel().append_duration, {}, span_attributes=attributes, current=False
        )

    def __enter__(self) -> AppendSpan:
        return AppendSpan(self._timed.__enter__())

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self._timed.__exit__(kind, exc, tb)


class TracedModel:
    """A :class:`ModelProvider` whose completions are ``chat`` spans with their duration and usage."""

    def __init__(self, provider: ModelProvider, *, provider_name: str, default_model: str = "") -> None:
        self._provider = provider
        self._provider_name = provider_name
        self._default_model = default_model

    async def complete(
        self, call: common_pb2.ModelCall, on_delta: DeltaCallback | None = None
    ) -> harness_pb2.ModelResult:
        if not switch.enabled():
            return await self._provider.complete(call, on_delta)
        model = call.model or self._default_model
        attributes: dict[str, str | int] = {
            names.GEN_AI_OPERATION_NAME: names.CHAT,
            names.GEN_AI_PROVIDER_NAME: self._provider_name,
        }
        if model:
            attributes[names.GEN_AI_REQUEST_MODEL] = model
        name = f"{names.CHAT} {model}".strip()
        otel = _otel()
        with _Timed(name, otel.operation_duration, attributes, kind=otel.trace.SpanKind.CLIENT) as span:
            result = await self._provider.complete(call, on_delta)
            if result.HasField("usage"):
                usage = result.usage
                span.set_attribute(names.GEN_AI_USAGE_INPUT_TOKENS, usage.input_tokens)
                span.set_attribute(names.GEN_AI_USAGE_OUTPUT_TOKENS, usage.output_tokens)
                for kind, tokens in (("input", usage.input_tokens), ("output", usage.output_tokens)):
                    otel.token_usage.record(tokens, {**attributes, names.GEN_AI_TOKEN_TYPE: kind})
            return result


class _ToolInvoker(Protocol):
    async def execute(self, session_uid: str, call: common_pb2.ToolCall) -> common_pb2.ToolResult: ...


class TracedTools:
    """A tool invoker whose executions are ``execute_tool`` spans with their duration."""

    def __init__(self, tools: _ToolInvoker) -> None:
        self._tools = tools

    async def profile(self, tool: str) -> ToolProfile | None:
        """The wrapped tools' profile of ``tool`` (what the mode check reads: controller/modes.py)."""
        described = getattr(self._tools, "profile", None)
        found = await described(tool) if callable(described) else None
        return found if isinstance(found, ToolProfile) else None

    async def execute(self, session_uid: str, call: common_pb2.ToolCall) -> common_pb2.ToolResult:
        if not switch.enabled():
            return await self._tools.execute(session_uid, call)
        attributes: dict[str, str | int] = {
            names.GEN_AI_OPERATION_NAME: names.EXECUTE_TOOL,
            names.GEN_AI_TOOL_NAME: call.tool,
        }
        spanned = {**attributes, names.GEN_AI_TOOL_CALL_ID: call.id, names.SESSION: session_uid}
        name = f"{names.EXECUTE_TOOL} {call.tool}"
        with _Timed(name, _otel().operation_duration, attributes, span_attributes=spanned) as span:
            result = await self._tools.execute(session_uid, call)
            span.set_attribute(names.TOOL_IS_ERROR, result.is_error)
            return result
