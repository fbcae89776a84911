"""Compaction: a session's history summarized at its head, so later turns start from the summary.

A compaction journals, in one append at the session's head, a host execution (EXECUTION_START
with harness :data:`COMPACTOR`, the summarizer's MODEL_CALL, its OUTPUT, its USAGE when the
provider reports one, ``END{COMPLETED}``) and then a ``LIFECYCLE_BASELINE`` marker whose
``detail`` is the summary. Nothing is deleted and the chain stays whole. From then on a turn's
``Start.history`` begins at the latest baseline before it (the baseline first, then what follows
it), live and when replay or recovery rebuild a Start, so both see the same history; a fork at a
seq before a baseline has no baseline in its prefix and starts from the whole history.

The summarizer is a host-side model call over the conversation since the previous baseline (that
baseline's summary first), made before anything is written: a crash during it leaves nothing,
and compaction happens again when it is asked for next. Replay does not re-run a compaction (its
effect is its record); it checks that its baseline carries the summary its OUTPUT holds.

Compaction runs on request (``SessionCompaction.Compact``) or, with ``--compact-above-events N``,
before a turn whose history would hold more than N events since the latest baseline, and with
``--compact-above-bytes N`` before one whose history would be more than N bytes of encoded events
(the sum of the events' protobuf sizes, the baseline included); with both, either triggers.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from agentsessions.host.callcontext import CallContext
from agentsessions.host.controller import sessions
from agentsessions.host.controller.baselines import is_baseline
from agentsessions.host.controller.errors import (
    ConcurrencyError,
    FailedPreconditionError,
    HarnessUnavailableError,
)
from agentsessions.host.controller.executions import Execution, latest_execution
from agentsessions.host.controller.inputhash import model_input_hash
from agentsessions.host.controller.journal_cache import Prefix
from agentsessions.host.controller.state import SessionView, open_gate
from agentsessions.host.journal.store import SessionRow
from agentsessions.host.models.provider import ModelError, ModelProvider
from agentsessions.sdk.extensions import COMPACTION_PRINCIPAL
from agentsessions.sdk.harness import conversation, message_text, text_message
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2

if TYPE_CHECKING:  # the Core holds the Compactor: no import cycle at run time
    from agentsessions.host.controller.core import Core

log = logging.getLogger("agentsessions.controller")

K = common_pb2
LK = common_pb2.Lifecycle

# The harness name and version a compaction's EXECUTION_START records (no harness runs it).
COMPACTOR: Final = "host:compaction"
COMPACTOR_VERSION: Final = "1"
INSTRUCTION: Final = (
    "You compact a conversation between a user and an assistant. Write a summary that lets the "
    "assistant continue the conversation without the earlier messages: the user's goals and "
    "requests, decisions made, facts and results established (tool results included), open "
    "questions and commitments. Write only the summary."
)
ASK: Final = "Summarize the conversation above."


@struct(frozen=True)
class CompactionSettings:
    """``above_events``: compact before a turn whose history since the latest baseline holds more
    events than this (0: never by itself); ``above_bytes``: ... or more bytes of encoded events
    (0: never by itself); ``model``: the summarizer model ("" the provider's)."""

    above_events: int = 0
    above_bytes: int = 0
    model: str = ""


@struct(frozen=True)
class Compacted:
    view: SessionView
    baseline: common_pb2.LogRecord
    summarized: int  # records the summary covers


class Compactor:
    """Summarizes sessions with the host's model provider, by its settings."""

    def __init__(self, model: ModelProvider | None, settings: CompactionSettings) -> None:
        self.model = model
        self.settings = settings


def history(core: Core, uid: str, events: Sequence[common_pb2.Event], end: int) -> Prefix:
    """A turn's Start.history: ``events[:end]`` from the latest baseline on, without a copy."""
    return Prefix(events, end, start=core.cache.baselines(uid, events).start(end))


async def compact(core: Core, call: CallContext, uid: str, expected_last_seq: int | None) -> Compacted:
    """SessionCompaction.Compact: summarize the session at its head, under its guard."""
    if core.compactor is None or core.compactor.model is None:
        raise FailedPreconditionError("this host has no model to summarize with (--model)")
    row = await sessions.row(core, call, uid)
    async with core.guards.hold(uid):
        events, executions = await sessions.read(core, row)
        head = len(events)
        if expected_last_seq is not None and expected_last_seq != head:
            raise ConcurrencyError(f"expected_last_seq {expected_last_seq} does not match head {head}")
        _check_settled(row, events, executions)
        start = core.cache.baselines(uid, events).start(head)
        if head == 0 or (is_baseline(events[start]) and start == head - 1):
            raise FailedPreconditionError(f"session {uid} has nothing to compact since its latest baseline")
        baseline = await _summarize(core, core.compactor, row, events, head)
        return Compacted(await sessions.look(core, call, uid), baseline, head - start)


async def before_turn(core: Core, row: SessionRow, events: Sequence[common_pb2.Event]) -> bool:
    """Compact before a new turn when the policy asks for it; whether it did. A failed summarizer
    call is logged and the turn goes on with its whole history."""
    compactor = core.compactor
    if compactor is None or compactor.model is None:
        return False
    above_events, above_bytes = compactor.settings.above_events, compactor.settings.above_bytes
    if above_events <= 0 and above_bytes <= 0:
        return False
    head = len(events)
    baselines = core.cache.baselines(row.uid, events)
    start = baselines.start(head)
    by_events = above_events > 0 and head - start > above_events
    if not by_events and not (above_bytes > 0 and baselines.encoded_bytes(start, head) > above_bytes):
        return False
    try:
        await _summarize(core, compactor, row, events, head)
    except (ModelError, FailedPreconditionError, HarnessUnavailableError) as exc:
        log.warning(
            "session %s: compaction before the turn failed, the turn keeps its history: %s", row.uid, exc
        )
        return False
    return True


def _check_settled(row: SessionRow, events: Sequence[common_pb2.Event], executions: list[Execution]) -> None:
    latest = latest_execution(executions)
    if open_gate(events, executions) is not None:
        raise FailedPreconditionError(f"session {row.uid} awaits an approval decision; compact it after")
    if latest is not None and not latest.completed:
        raise FailedPreconditionError(
            f"session {row.uid}: execution {latest.id} has no END (running, or cut short); "
            "compact it once the turn has ended"
        )


async def _summarize(
    core: Core, compactor: Compactor, row: SessionRow, events: Sequence[common_pb2.Event], head: int
) -> common_pb2.LogRecord:
    """The summarizer call, then the compaction's records and its baseline in one append at ``head``."""
    assert compactor.model is not None
    # The SDK's native types, loaded by the first compaction rather than at every start.
    from agentsessions.sdk import convert

    since = history(core, row.uid, events, head)
    try:
        messages = convert.messages_to_proto(conversation(since))
    except ValueError as exc:
        raise FailedPreconditionError(
            f"session {row.uid}: its conversation cannot be summarized: {exc}"
        ) from None
    call = K.ModelCall(
        model=compactor.settings.model,
        messages=[text_message("system", INSTRUCTION), *messages, text_message("user", ASK)],
    )
    try:
        result = await compactor.model.complete(call)
    except ModelError as exc:
        raise FailedPreconditionError(f"compaction: the summarizer model call failed: {exc}") from exc
    summary = message_text(result.message).strip()
    if not summary:
        raise FailedPreconditionError("compaction: the summarizer answered no text")
    execution_id = core.new_id()
    actor = K.IdentityRef(principal=COMPACTION_PRINCIPAL, subject="summarizer")
    batch = [
        K.Event(
            execution_id=execution_id,
            kind=K.EVENT_EXECUTION_START,
            execution_start=K.ExecutionStart(
                input_count=0, harness=COMPACTOR, harness_version=COMPACTOR_VERSION
            ),
        ),
        K.Event(
            execution_id=execution_id,
            kind=K.EVENT_MODEL_CALL,
            model=K.ModelCall(model=call.model, input_hash=model_input_hash(call), id=core.new_id()),
        ),
        K.Event(execution_id=execution_id, kind=K.EVENT_OUTPUT, message=result.message, actor=actor),
    ]
    if result.HasField("usage"):
        batch.append(K.Event(execution_id=execution_id, kind=K.EVENT_USAGE, usage=result.usage))
    batch += [
        K.Event(execution_id=execution_id, kind=K.EVENT_END, end=K.HarnessEnd(state="COMPLETED")),
        K.Event(kind=K.EVENT_LIFECYCLE, lifecycle=K.Lifecycle(kind=LK.LIFECYCLE_BASELINE, detail=summary)),
    ]
    records = await core.writer.append(row.uid, batch, head, 0, mint_fence=True)
    log.info("session %s: compacted %d records into a baseline at seq %d", row.uid, head, records[-1].seq)
    return records[-1]


def is_compaction(ex: Execution) -> bool:
    """An execution the host wrote to compact the session (replay checks it, runs no harness)."""
    return ex.start is not None and ex.start.harness == COMPACTOR


def replayed(events: Sequence[common_pb2.Event], ex: Execution) -> str | None:
    """How a compaction's records differ from what a compaction writes (None: they agree)."""
    mine = [events[i] for i in ex.indexes]
    outputs = [e for e in mine if e.kind == K.EVENT_OUTPUT]
    last = ex.indexes[-1] if ex.indexes else ex.first_index
    baseline = events[last + 1] if last + 1 < len(events) else None
    if len(outputs) != 1 or baseline is None or not is_baseline(baseline):
        return "a compaction must end with its summary OUTPUT, END, then its LIFECYCLE_BASELINE"
    if baseline.lifecycle.detail != message_text(outputs[0].message).strip():
        return "its LIFECYCLE_BASELINE does not carry the summary its OUTPUT holds"
    return None
