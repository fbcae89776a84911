"""Recorded effects served back to a harness (replay and recovery), spelled once for the host's
sink and this SDK's scripted host (``agentsessions.sdk.testing``)."""

from __future__ import annotations

from agentsessions.v1 import common_pb2, harness_pb2

__all__ = ["recorded_completion"]


def recorded_completion(
    output: common_pb2.Event, usage: common_pb2.Event | None, model_call_id: str
) -> harness_pb2.ModelResult:
    """The answer to a model call whose completion the journal holds: the recorded OUTPUT's
    message under the harness's call id, with the USAGE journaled right after it, if any."""
    served = harness_pb2.ModelResult(message=output.message, model_call_id=model_call_id)
    if usage is not None:
        served.usage.CopyFrom(usage.usage)
    return served
