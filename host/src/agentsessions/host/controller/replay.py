"""Reading a session back: its records as stored (Sessions.Replay), and controller replay, which
re-runs every completed execution against its recorded effects with zero model calls and nothing
written (spec 4.3); a divergence raises ReplayDivergedError."""

from __future__ import annotations

from collections.abc import AsyncIterator

from agentsessions.host.callcontext import CallContext
from agentsessions.host.controller import compaction, results, sessions
from agentsessions.host.controller.core import Core
from agentsessions.host.controller.errors import ReplayDivergedError
from agentsessions.host.controller.reconstruct import reconstruct
from agentsessions.host.controller.sinks import Recorded
from agentsessions.host.controller.state import was_cancelled
from agentsessions.host.journal import MAX_SEQ
from agentsessions.sdk.harness import message_text
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2

# Records read from the store per page while streaming a session's journal.
RECORDS_PAGE = 1000


@struct
class ReplayReport:
    """What a controller replay re-executed: ``model_calls`` (sent to the provider) must be 0 (I1);
    ``served_model_calls`` were answered from the journal."""

    executions: int
    outputs: list[str]
    model_calls: int
    served_model_calls: int = 0


async def records(
    core: Core, call: CallContext, uid: str, from_seq: int, to_seq: int
) -> AsyncIterator[common_pb2.LogRecord]:
    """The stored records ``from_seq..to_seq`` (0: to the head), verbatim, read in pages; none for
    a session without a visible row."""
    if not await sessions.visible(core, call, uid):
        return
    seq = max(from_seq, 1)
    last = to_seq if to_seq > 0 else MAX_SEQ
    while seq <= last:
        upper = min(seq + RECORDS_PAGE - 1, last)
        page = await core.store.read(uid, seq, upper)
        async for rec in core.reads.stream(page):  # yields to turns under load (pacing.py)
            yield rec
        if len(page) < upper - seq + 1:
            return
        seq = upper + 1


async def replay(core: Core, call: CallContext, uid: str) -> ReplayReport:
    """Re-run every completed execution against its recorded effects: zero model calls, nothing
    written; divergence raises ReplayDivergedError."""
    row = await sessions.row(core, call, uid)
    events, executions = await sessions.read(core, row)
    # A cancelled execution stopped wherever the Cancel found it: there is nothing to re-run.
    completed = [
        ex
        for ex in executions
        if ex.completed and not (ex.legacy and not ex.inputs) and not was_cancelled(events, ex)
    ]
    for ex in completed:
        if compaction.is_compaction(ex):  # its effect is its record: checked, never re-run
            differs = compaction.replayed(events, ex)
            if differs is not None:
                raise ReplayDivergedError(f"execution {ex.id}: compaction: {differs}")
    completed = [ex for ex in completed if not compaction.is_compaction(ex)]
    plans = [await reconstruct(core.catalog, row, ex, events) for ex in completed]
    outputs: list[str] = []
    calls = 0
    served = 0
    for ex, (start, resolved, _) in zip(completed, plans, strict=True):
        recorded = Recorded.of(events, ex)
        sink = core.sinks.replay(row, start.execution_id, recorded)
        try:
            await resolved.harness.run(start, sink)
        except ReplayDivergedError:
            raise
        except Exception as exc:
            raise ReplayDivergedError(f"execution {ex.id}: harness failed on replay: {exc}") from exc
        finally:
            sink.close()
        if sink.unconsumed():
            raise ReplayDivergedError(
                f"execution {ex.id}: harness left {sink.unconsumed()} recorded effects unconsumed"
            )
        differs = results.replayed([events[i] for i in ex.indexes]) if ex.id else None
        if differs is not None:
            raise ReplayDivergedError(f"execution {ex.id}: result schema: {differs}")
        calls += sink.counters.model_calls
        for eff in recorded.effects:
            if eff.kind == "model":
                served += 1
                if eff.reply is not None:
                    outputs.append(message_text(eff.reply.message))
            elif eff.kind == "output":
                outputs.append(message_text(eff.call.message))
    return ReplayReport(len(completed), outputs, calls, served)
