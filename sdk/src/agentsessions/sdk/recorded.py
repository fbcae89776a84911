"""Recorded effects: an execution's journal read as the effects its harness's sink calls consume,
and what a recorded effect answers when it is served back (replay and recovery). Spelled once for
the host's sink and this SDK's scripted host (``agentsessions.sdk.testing``)."""

from __future__ import annotations

from collections.abc import Iterable

from agentsessions.sdk.extensions import RESULTS_PRINCIPAL
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2, harness_pb2

__all__ = ["Effect", "MalformedEffectsError", "pair_effects", "recorded_completion"]

K = common_pb2


class MalformedEffectsError(ValueError):
    """An execution's records do not pair into effects; the message names the record."""


@struct
class Effect:
    """One recorded effect of an execution, as the harness's sink call would consume it."""

    kind: str  # "model" | "output" | "tool" | "report"
    call: common_pb2.Event  # MODEL_CALL, OUTPUT, TOOL_CALL or TOOL_RESULT (report)
    reply: common_pb2.Event | None = None  # OUTPUT of a model call, TOOL_RESULT of a tool call
    approval_request: tuple[int, common_pb2.Event] | None = None  # (seq, APPROVAL_REQUEST)
    approval_result: tuple[int, common_pb2.Event] | None = None  # (seq, APPROVAL_RESULT)
    usage: common_pb2.Event | None = None  # the USAGE journaled right after a model call's OUTPUT


def pair_effects(records: Iterable[tuple[int, common_pb2.Event]]) -> tuple[list[Effect], int]:
    """One execution's records, ``(seq, event)`` in order, as its effect stream, and its number of
    USAGE records that are not a model call's.

    MODEL_CALL pairs with the OUTPUT that follows it; TOOL_CALL with its approval records and
    the TOOL_RESULT carrying its id; a lone OUTPUT is direct output and a lone TOOL_RESULT a
    harness report. USAGE is accounting, not an effect: the one right after a model call's OUTPUT
    is that call's (served with it), the others are counted; INPUT, ERROR and END are not effects.
    """
    effects: list[Effect] = []
    usage = 0
    open_tools: dict[str, Effect] = {}
    pending_model: Effect | None = None
    answered_model: Effect | None = None  # the model effect whose OUTPUT was the last record
    for seq, ev in records:
        kind = ev.kind
        if kind == K.EVENT_USAGE and answered_model is not None:
            answered_model.usage = ev
            answered_model = None
            continue
        answered_model = None
        if kind == K.EVENT_MODEL_CALL:
            pending_model = Effect("model", ev)
            effects.append(pending_model)
            continue
        if kind == K.EVENT_OUTPUT:
            if ev.actor.principal == RESULTS_PRINCIPAL:
                continue  # the host's settled structured result (docs/results.md), not an effect
            if pending_model is not None and pending_model.reply is None:
                pending_model.reply = ev
                answered_model = pending_model
            else:
                effects.append(Effect("output", ev))
            pending_model = None
            continue
        if kind in (K.EVENT_INPUT, K.EVENT_END, K.EVENT_ERROR, K.EVENT_EXECUTION_START):
            continue
        pending_model = None
        if kind == K.EVENT_USAGE:
            usage += 1
        elif kind == K.EVENT_TOOL_CALL:
            call_id = ev.tool.id
            if call_id in open_tools:
                raise MalformedEffectsError(f"record {seq}: tool call id {call_id!r} reused")
            eff = Effect("tool", ev)
            open_tools[call_id] = eff
            effects.append(eff)
        elif kind == K.EVENT_APPROVAL_REQUEST:
            eff_or_none = open_tools.get(ev.approval.tool_call_id)
            if eff_or_none is None or eff_or_none.approval_request is not None:
                raise MalformedEffectsError(f"record {seq}: approval request without its tool call")
            eff_or_none.approval_request = (seq, ev)
        elif kind == K.EVENT_APPROVAL_RESULT:
            eff_or_none = open_tools.get(ev.approval_result.tool_call_id)
            if eff_or_none is None or eff_or_none.approval_request is None:
                raise MalformedEffectsError(f"record {seq}: approval decision without a request")
            if eff_or_none.approval_result is None:
                eff_or_none.approval_result = (seq, ev)
        elif kind == K.EVENT_TOOL_RESULT:
            eff_or_none = open_tools.get(ev.result.id)
            if eff_or_none is not None and eff_or_none.reply is None:
                eff_or_none.reply = ev
                del open_tools[ev.result.id]
            else:
                effects.append(Effect("report", ev))
    return effects, usage


def recorded_completion(
    output: common_pb2.Event, usage: common_pb2.Event | None, model_call_id: str
) -> harness_pb2.ModelResult:
    """The answer to a model call whose completion the journal holds: the recorded OUTPUT's
    message under the harness's call id, with the USAGE journaled right after it, if any."""
    served = harness_pb2.ModelResult(message=output.message, model_call_id=model_call_id)
    if usage is not None:
        served.usage.CopyFrom(usage.usage)
    return served
