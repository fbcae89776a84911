"""The Start of a recorded execution, rebuilt from the journal (inputs, config, cursor, the history
before it), and the harness it ran on, checked against what the journal recorded (name, version)
and placed; shared by recovery and controller replay."""

from __future__ import annotations

from collections.abc import Sequence

from agentsessions.host.controller.baselines import history_start
from agentsessions.host.controller.errors import (
    FailedPreconditionError,
    HarnessMismatchError,
    IncompleteInvocationError,
    InvalidArgumentError,
    InvalidExecutionLogError,
)
from agentsessions.host.controller.executions import Execution, legacy_execution_id
from agentsessions.host.controller.harnesses import HarnessCatalog, ResolvedHarness, describe_placed
from agentsessions.host.controller.journal_cache import Prefix
from agentsessions.host.journal import canon
from agentsessions.host.journal.store import SessionRow
from agentsessions.sdk.harness import Start
from agentsessions.v1 import common_pb2, harness_pb2


async def reconstruct(
    catalog: HarnessCatalog, row: SessionRow, ex: Execution, events: Sequence[common_pb2.Event]
) -> tuple[Start, ResolvedHarness, harness_pb2.HarnessDescriptor]:
    """The journal's Start for ``ex``, and its recorded harness (described, placed, checked) with
    the descriptor it reported."""
    inputs = ex.inputs  # read from the records each time it is asked
    if ex.legacy:
        if not inputs:
            raise InvalidExecutionLogError("legacy turn has no INPUT to resume from")
        first = ex.first_index
        content = canon.content_hash(events[first], "", first + 1)
        resolved = await catalog.resolve(row.harness)
        desc = await describe_placed(resolved)
        start = Start(
            session=row.uid,
            execution_id=legacy_execution_id(row.uid, first + 1, content),
            inputs=[inputs[-1]],
            history=Prefix(events, first),
        )
        return start, resolved, desc
    es = ex.start
    if es is None:
        raise InvalidExecutionLogError(f"execution {ex.id} has no EXECUTION_START")
    if not es.HasField("input_count") or es.input_count < 0:
        raise InvalidExecutionLogError(f"execution {ex.id}: EXECUTION_START lacks a valid input_count")
    if es.input_count != len(inputs) or any(not m.parts and not m.role for m in inputs):
        raise IncompleteInvocationError(
            f"execution {ex.id} committed {len(inputs)} of {es.input_count} inputs; "
            "call Exec again with all inputs"
        )
    try:
        resolved = await catalog.resolve(es.harness or row.harness)
    except InvalidArgumentError as exc:
        raise FailedPreconditionError(
            f"execution {ex.id} ran on harness {es.harness!r}, which this host does not serve"
        ) from exc
    desc = await describe_placed(resolved)
    if es.harness_version and desc.version != es.harness_version:
        raise HarnessMismatchError(
            f"execution {ex.id} ran on {es.harness!r} version {es.harness_version!r}; "
            f"the served harness reports version {desc.version!r}"
        )
    start = Start(
        session=row.uid,
        execution_id=ex.id,
        inputs=inputs,
        history=Prefix(events, ex.first_index, start=history_start(events, ex.first_index)),
        config=es.config,
        resume_from_seq=es.resume_from_seq,
    )
    return start, resolved, desc
