"""LiveSessions against real ``agentsessions serve`` processes and a harness process.

A watcher disconnected and reconnected 20 times (with the last seq it saw) while a multi-turn
session runs reconstructs exactly the journal; a watcher reconnecting to a restarted host misses
nothing; queued turns survive a kill -9 of the host and run in order afterwards; a keyed Exec
retried against a restarted host streams the same execution.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentsessions.client import SessionsClient
from agentsessions.ext.v1 import live_pb2
from agentsessions.v1 import common_pb2, session_pb2
from tests.support.host_process import HostProcess, repo_env
from tests.support.processes import HarnessProcess, harness_process, serve_argv

pytestmark = pytest.mark.e2e

K = common_pb2.EventKind
WAIT_S = 60.0
TURNS = 8


@pytest.fixture
async def slow_harness() -> AsyncIterator[HarnessProcess]:
    async with harness_process(serve_argv("tests.support.harnesses:SlowEchoHarness"), env=repo_env()) as proc:
        yield proc


@pytest.fixture
async def host(tmp_path: Path, slow_harness: HarnessProcess) -> AsyncIterator[HostProcess]:
    process = HostProcess(tmp_path / "journal.db", tmp_path, ["--harness", f"slow={slow_harness.address}"])
    await process.start()
    try:
        yield process
    finally:
        await process.close()


def slow_turn(uid: str, text: str, delay_s: float) -> session_pb2.ExecRequest:
    return session_pb2.ExecRequest(
        session=uid,
        inputs=[
            common_pb2.Message(role="user", parts=[common_pb2.Part(text=common_pb2.TextPart(text=text))])
        ],
        config=json.dumps({"delay_s": delay_s}).encode(),
    )


async def records_from(
    client: SessionsClient, uid: str, after: int, count: int
) -> list[common_pb2.LogRecord]:
    """Open a watch after ``after``, take ``count`` records, and hang up."""
    taken: list[common_pb2.LogRecord] = []
    async for update in client.watch(uid, after_seq=after, reconnect=False):
        if update.HasField("record"):
            taken.append(update.record)
            if len(taken) == count:
                break
    return taken


async def test_a_watcher_reconnected_20_times_during_a_multi_turn_session_sees_the_journal_exactly(
    host: HostProcess,
) -> None:
    async with SessionsClient.connect(host.address) as client:
        uid = (await client.create_session(harness="slow")).metadata.uid

        async def drive() -> None:
            for n in range(TURNS):
                async for _ in client.stub.Exec(slow_turn(uid, f"turn {n}", 0.05)):
                    pass

        driver = asyncio.create_task(drive())
        seen: list[common_pb2.LogRecord] = []
        async with asyncio.timeout(WAIT_S):
            for reconnect in range(20):
                after = seen[-1].seq if seen else 0
                seen += await records_from(client, uid, after, 1 + reconnect % 2)
            await driver
            total = TURNS * 5
            seen += await records_from(client, uid, seen[-1].seq, total - len(seen))
        journal = [r async for r in client.replay(uid)]
    assert len(journal) == TURNS * 5
    assert seen == journal  # every record once, in order, hashes as stored


async def test_a_watcher_reconnecting_to_a_restarted_host_misses_nothing(host: HostProcess) -> None:
    async with SessionsClient.connect(host.address) as client:
        uid = (await client.create_session(harness="slow")).metadata.uid
        for n in range(2):
            async for _ in client.stub.Exec(slow_turn(uid, f"turn {n}", 0.0)):
                pass
        seen = await records_from(client, uid, 0, 7)
    await host.kill()
    await host.start()
    async with SessionsClient.connect(host.address) as client:
        async for _ in client.stub.Exec(slow_turn(uid, "after the restart", 0.0)):
            pass
        seen += await records_from(client, uid, seen[-1].seq, 15 - len(seen))
        journal = [r async for r in client.replay(uid)]
    assert seen == journal


async def test_queued_turns_survive_a_kill_of_the_host_and_run_in_order(host: HostProcess) -> None:
    async with SessionsClient.connect(host.address) as client:
        uid = (await client.create_session(harness="slow")).metadata.uid
        first = await client.live.Submit(live_pb2.SubmitRequest(exec=slow_turn(uid, "long", 3.0)))
        queued = [
            await client.live.Submit(
                live_pb2.SubmitRequest(exec=slow_turn(uid, text, 0.0), on_busy=live_pb2.ON_BUSY_ENQUEUE)
            )
            for text in ("second", "third")
        ]
        assert all(q.queued for q in queued)
    await host.kill()
    await host.start()  # the long turn is recovered (and re-run), then the queue drains
    async with SessionsClient.connect(host.address) as client:
        ends: list[common_pb2.LogRecord] = []
        async with asyncio.timeout(WAIT_S * 2):
            async for update in client.watch(uid):
                if update.HasField("record") and update.record.event.kind == K.EVENT_END:
                    ends.append(update.record)
                    if len(ends) == 3:
                        break
        journal = [r async for r in client.replay(uid)]
    starts = [r.event.execution_id for r in journal if r.event.kind == K.EVENT_EXECUTION_START]
    assert starts == [first.execution_id, *(q.queued_execution_id for q in queued)]
    inputs = [
        "".join(p.text.text for p in r.event.message.parts) for r in journal if r.event.kind == K.EVENT_INPUT
    ]
    assert inputs == ["long", "second", "third"]
    assert [e.event.end.state for e in ends] == ["COMPLETED"] * 3
    assert [e.event.execution_id for e in ends] == starts


async def test_a_turn_cut_by_a_drain_is_finished_by_the_next_start(
    tmp_path: Path, slow_harness: HarnessProcess
) -> None:
    host = HostProcess(
        tmp_path / "journal.db",
        tmp_path,
        ["--harness", f"slow={slow_harness.address}", "--drain-grace", "0.2"],
    )
    await host.start()
    try:
        async with SessionsClient.connect(host.address) as client:
            uid = (await client.create_session(harness="slow")).metadata.uid
            await client.live.Submit(live_pb2.SubmitRequest(exec=slow_turn(uid, "long", 3.0)))
        assert await host.stop() == 0  # SIGTERM: the drain does not wait three seconds
        await host.start()
        async with SessionsClient.connect(host.address) as client:
            async with asyncio.timeout(WAIT_S):
                async for update in client.watch(uid):
                    if update.HasField("record") and update.record.event.kind == K.EVENT_END:
                        break
            journal = [r async for r in client.replay(uid)]
    finally:
        await host.close()
    kinds = [K.Name(r.event.kind) for r in journal]
    errors = [r.event.error.description for r in journal if r.event.kind == K.EVENT_ERROR]
    assert errors == ["the host shut down during the turn; another attempt recovers it"], kinds
    (end,) = [r for r in journal if r.event.kind == K.EVENT_END]
    assert end.event.end.state == "COMPLETED"
    outputs = [
        "".join(p.text.text for p in r.event.message.parts) for r in journal if r.event.kind == K.EVENT_OUTPUT
    ]
    assert outputs == ["echo:long"]
