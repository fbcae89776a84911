"""A schema-bound turn across ``kill -9`` with real processes: the host (SQLite journal, automatic
recovery on), the gated chat harness in its own process (``tests.support.describe_gate``), the
model a scripted chat-completions endpoint in this process (so it outlives the host).

The turn's first answer does not validate, so the host ends it and admits a corrective turn in one
append. The host is killed right after that append, while it Describes the harness to drive the
corrective turn (the harness holds that Describe), and started again on the same journal. Nobody
calls anything but Watch, Replay and GetSession: the recoverer finishes the corrective turn (its
lease was written with its EXECUTION_START), which settles with the valid answer.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agentsessions.client import SessionsClient
from agentsessions.host.controller import results
from agentsessions.host.journal.sqlite import SqliteStore
from agentsessions.sdk import convert
from agentsessions.sdk.extensions import RESULTS_PRINCIPAL
from agentsessions.v1 import common_pb2, session_pb2
from tests.chaos.scenario import WAIT_LIMIT_S, ExecInFlight, of_kind, verify_journal_file, wait_until
from tests.support import describe_gate
from tests.support.host_process import HarnessProcess, HostProcess
from tests.support.scripted_endpoint import Reply, ScriptedEndpoint, scripted_endpoint

pytestmark = pytest.mark.e2e

K = common_pb2.EventKind
LK = common_pb2.Lifecycle.Kind
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}


class ResultsWorld:
    def __init__(self, tmp: Path, sockets: Path, model: ScriptedEndpoint) -> None:
        self.journal = tmp / "journal.db"
        self.model = model
        self.gate = tmp / "chat"
        self.gate.mkdir()
        self.harness = HarnessProcess(
            "tests.support.describe_gate:GatedChat", f"unix:{sockets / 'chat'}.sock", self.gate
        )
        args = [
            "--harness",
            f"gated={self.harness.address}",
            "--model",
            "scripted",
            "--model-base-url",
            model.base_url,
            "--harness-describe-max-age",
            "0",  # every drive Describes the harness: the gate sees each one
            "--recover-backoff",
            "0.1",
        ]
        self.host = HostProcess(self.journal, tmp, args)

    async def records(self, uid: str) -> list[common_pb2.LogRecord]:
        call = self.host.sessions.Replay(session_pb2.ReplayRequest(session=uid), timeout=WAIT_LIMIT_S)
        return [record async for record in call]

    async def until_ends(self, uid: str, count: int) -> list[common_pb2.LogRecord]:
        """Watch the session until it holds ``count`` ENDs; its whole journal then."""
        seen = await self.records(uid)
        ends = len(of_kind(seen, K.EVENT_END))
        if ends < count:
            async with SessionsClient.connect(self.host.address) as client:
                try:
                    async with asyncio.timeout(WAIT_LIMIT_S):
                        async for update in client.watch(uid, after_seq=seen[-1].seq if seen else 0):
                            if update.HasField("record") and update.record.event.kind == K.EVENT_END:
                                ends += 1
                                if ends == count:
                                    break
                except TimeoutError:
                    raise AssertionError(
                        f"session {uid} holds {ends} END(s) after {WAIT_LIMIT_S} s, not {count}:\n"
                        + "\n".join(K.Name(r.event.kind) for r in await self.records(uid))
                    ) from None
        return await self.records(uid)

    async def journal_records(self, uid: str) -> list[common_pb2.LogRecord]:
        """The session's records, read from the journal itself (the host stopped)."""
        store = await SqliteStore.open(self.journal)
        try:
            return list(await store.read(uid))
        finally:
            await store.close()

    async def verify(self) -> None:
        done = await verify_journal_file(self.journal)
        assert done.returncode == 0, done.stderr


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with scripted_endpoint() as served:
        yield served


@pytest.fixture
async def world(tmp_path: Path, endpoint: ScriptedEndpoint) -> AsyncIterator[ResultsWorld]:
    sockets = Path(tempfile.mkdtemp(prefix="asc-", dir="/tmp"))  # unix socket paths stay short
    made = ResultsWorld(tmp_path, sockets, endpoint)
    try:
        await asyncio.gather(made.harness.start(), made.host.start())
        yield made
    finally:
        await made.host.close()
        await made.harness.close()
        shutil.rmtree(sockets, ignore_errors=True)


async def test_killed_right_after_admitting_a_corrective_turn_the_recoverer_finishes_it(
    world: ResultsWorld,
) -> None:
    world.model.script(Reply.completion("Lyon, I think"), Reply.completion('{"city": "Lyon"}'))
    (world.gate / describe_gate.ARM).touch()  # the first turn's end arms the gate on the next Describe
    request = session_pb2.ExecRequest(
        harness="gated",
        inputs=[
            common_pb2.Message(
                role="user", parts=[common_pb2.Part(text=common_pb2.TextPart(text="Which city?"))]
            )
        ],
    )
    metadata = ((results.METADATA_KEY, json.dumps(SCHEMA)),)
    turn = ExecInFlight(world.host.sessions.Exec(request, metadata=metadata))
    await wait_until(
        "the corrective turn's Describe at the gate",
        lambda: describe_gate.held(world.gate) == 1 and bool(turn.updates),
    )
    uid = turn.session
    before = await world.records(uid)
    # Standing at the gate: the first turn ended and the corrective one was admitted, nothing more.
    assert [K.Name(r.event.kind) for r in before[-3:]] == [
        "EVENT_END",
        "EVENT_EXECUTION_START",
        "EVENT_INPUT",
    ]
    corrective = before[-1].event.execution_id
    assert len(world.model.received) == 1

    await world.host.kill()
    await turn.status()
    (world.gate / describe_gate.HOLD).unlink()
    await world.host.start()

    await world.until_ends(uid, 2)
    session = await world.host.sessions.GetSession(session_pb2.GetSessionRequest(uid=uid))
    assert session.exec_state == session_pb2.EXEC_COMPLETED
    assert await world.host.stop() == 0  # drained: everything it wrote is in the journal now
    await world.verify()
    records = await world.journal_records(uid)
    ends = of_kind(records, K.EVENT_END)
    assert [(e.event.execution_id == corrective, e.event.end.state) for e in ends] == [
        (False, "COMPLETED"),
        (True, "COMPLETED"),
    ]
    assert len(of_kind(records, K.EVENT_EXECUTION_START)) == 2
    settled = [r for r in of_kind(records, K.EVENT_OUTPUT) if r.event.actor.principal == RESULTS_PRINCIPAL]
    assert [convert.dict_from_struct(r.event.message.parts[0].data.data) for r in settled] == [
        {"city": "Lyon"}
    ]
    assert settled[0].event.execution_id == corrective
    resumes = [
        r
        for r in records
        if r.event.kind == K.EVENT_LIFECYCLE and r.event.lifecycle.kind == LK.LIFECYCLE_RESUME
    ]
    assert len(resumes) == 1 and resumes[0].seq == records[-1].seq  # recovered once, by the recoverer
    assert len(world.model.received) == 2  # the first answer, then the corrective turn's one
