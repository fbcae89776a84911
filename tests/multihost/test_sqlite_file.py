"""Two host processes on one SQLite file (docs/replicas.md: safe, if single-host by design).

Each host answers a session's row from what its own writer last committed only while the file's WAL
index says nobody else has committed since, so a session that alternates between the two hosts
turn by turn, as fast as they go, never meets a row the other host has moved on from (which would
be refused ``ABORTED`` at the append's compare-and-set).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentsessions.host.journal import open_store
from agentsessions.v1 import common_pb2, session_pb2
from tests.support.host import text_input
from tests.support.host_process import HostProcess

pytestmark = pytest.mark.e2e


@pytest.fixture
async def two_hosts(tmp_path: Path) -> AsyncIterator[tuple[HostProcess, HostProcess]]:
    journal = tmp_path / "journal.db"
    hosts = (HostProcess(journal, tmp_path, name="host-a"), HostProcess(journal, tmp_path, name="host-b"))
    async with contextlib.AsyncExitStack() as stack:
        for host in hosts:
            await host.start()
            stack.push_async_callback(host.close)
        yield hosts


async def test_a_session_alternating_between_two_hosts_on_one_file_is_never_refused(
    two_hosts: tuple[HostProcess, HostProcess],
) -> None:
    a, b = two_hosts
    created = await a.sessions.CreateSession(session_pb2.CreateSessionRequest(session=session_pb2.Session()))
    uid = created.metadata.uid
    seqs: list[int] = []
    for turn in range(8):
        host = (a, b)[turn % 2]
        request = session_pb2.ExecRequest(session=uid, inputs=[text_input(f"turn {turn}")])
        updates = [u async for u in host.sessions.Exec(request)]
        seqs += [u.record.seq for u in updates if u.WhichOneof("update") == "record"]
        ends = [u.record.event for u in updates if u.record.event.kind == common_pb2.EVENT_END]
        assert [e.end.state for e in ends] == ["COMPLETED"], (turn, host.name)
    assert seqs == list(range(1, len(seqs) + 1))
    store = await open_store(str(a.journal))
    try:
        assert await store.verify(uid) == len(seqs)
    finally:
        await store.close()
