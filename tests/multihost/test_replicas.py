"""Several host processes on one PostgreSQL journal (spec 4.5 across hosts).

Two ``agentsessions serve`` replicas share a database and dial one harness process. The local
guard cannot see across processes; fences minted at the expected head plus CAS on every append
keep a single writer per session: of two racing turns exactly one proceeds, a turn running on one
replica is busy on the other (its lease), a replica that stops renewing its lease loses the turn to
the other and is fenced, and a session started on one replica continues on the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from agentsessions.client import SessionsClient
from agentsessions.ext.v1 import live_pb2
from agentsessions.host.journal import open_store
from agentsessions.v1 import common_pb2, session_pb2
from tests.support.host import text_input
from tests.support.host_process import HostProcess, repo_env
from tests.support.processes import HarnessProcess, harness_process, serve_argv

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]
K = common_pb2.EventKind


@pytest.fixture
async def slow_harness() -> AsyncIterator[HarnessProcess]:
    import os

    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = repo_env()["PYTHONPATH"]
    try:
        async with harness_process(serve_argv("tests.support.harnesses:SlowEchoHarness")) as proc:
            yield proc
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


@contextlib.asynccontextmanager
async def started(hosts: list[HostProcess], *, thaw: bool = False) -> AsyncIterator[None]:
    """The hosts started, and closed afterwards (``thaw``: a stopped one is continued first)."""
    try:
        for h in hosts:
            await h.start()
        yield
    finally:
        for h in hosts:
            if thaw and h.process is not None and h.process.returncode is None:
                h.process.send_signal(signal.SIGCONT)
            await h.close()


@pytest.fixture
async def replicas(
    pg_url: str, slow_harness: HarnessProcess, tmp_path: Path
) -> AsyncIterator[list[HostProcess]]:
    hosts = [
        HostProcess(pg_url, tmp_path, ["--harness", f"slow={slow_harness.address}"], name=name)
        for name in ("host-a", "host-b")
    ]
    async with started(hosts):
        yield hosts


def turn(uid: str, text: str, delay_s: float = 0.0) -> session_pb2.ExecRequest:
    return session_pb2.ExecRequest(
        session=uid, inputs=[text_input(text)], config=json.dumps({"delay_s": delay_s}).encode()
    )


async def run(host: HostProcess, request: session_pb2.ExecRequest) -> list[session_pb2.ExecUpdate]:
    return [u async for u in host.sessions.Exec(request)]


async def create(host: HostProcess) -> str:
    s = await host.sessions.CreateSession(
        session_pb2.CreateSessionRequest(session=session_pb2.Session(harness="slow"))
    )
    return str(s.metadata.uid)


async def test_session_started_on_one_replica_continues_on_the_other(
    replicas: list[HostProcess], pg_url: str
) -> None:
    a, b = replicas
    uid = await create(a)
    await run(a, turn(uid, "one"))
    got = await b.sessions.GetSession(session_pb2.GetSessionRequest(uid=uid))
    assert got.last_seq == 5
    updates = await run(b, turn(uid, "two"))
    assert [u.record.seq for u in updates if u.WhichOneof("update") == "record"] == [6, 7, 8, 9, 10]
    await b.sessions.Suspend(session_pb2.SuspendRequest(session=uid))
    resumed = await a.sessions.Resume(session_pb2.ResumeRequest(session=uid))
    assert resumed.compute_state == session_pb2.COMPUTE_LIVE
    store = await open_store(pg_url)
    try:
        assert await store.verify(uid) == 12
    finally:
        await store.close()


async def test_concurrent_exec_through_both_replicas_lets_exactly_one_proceed(
    replicas: list[HostProcess], pg_url: str
) -> None:
    a, b = replicas
    for attempt in range(3):
        uid = await create(a)
        outcomes = await asyncio.gather(
            run(a, turn(uid, f"a{attempt}", delay_s=0.5)),
            run(b, turn(uid, f"b{attempt}", delay_s=0.5)),
            return_exceptions=True,
        )
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        done = [o for o in outcomes if not isinstance(o, BaseException)]
        assert len(done) == 1 and len(failed) == 1, outcomes
        assert isinstance(failed[0], grpc.aio.AioRpcError) and failed[0].code() == grpc.StatusCode.ABORTED
        store = await open_store(pg_url)
        try:
            records = await store.read(uid)
            await store.verify(uid)
        finally:
            await store.close()
        ends = [r for r in records if r.event.kind == K.EVENT_END]
        assert len(ends) == 1


async def test_a_turn_running_on_one_replica_is_busy_on_the_other(replicas: list[HostProcess]) -> None:
    """The lease says who runs the turn: the other replica answers ABORTED, as the same host would,
    instead of superseding a live writer and leaving its execution without an END."""
    a, b = replicas
    uid = await create(a)
    slow = a.sessions.Exec(turn(uid, "slow", delay_s=3.0))
    first = [await slow.read() for _ in range(3)]  # session frame, EXECUTION_START, INPUT: durable
    assert first[1].record.event.kind == K.EVENT_EXECUTION_START
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await run(b, turn(uid, "takeover"))
    assert err.value.code() == grpc.StatusCode.ABORTED
    assert "busy with a turn that runs on host" in (err.value.details() or "")
    rest = []
    while (update := await slow.read()) != grpc.aio.EOF:
        rest.append(update)
    assert rest[-1].record.event.kind == K.EVENT_END


@pytest.fixture
async def short_lease_replicas(
    pg_url: str, slow_harness: HarnessProcess, tmp_path: Path
) -> AsyncIterator[list[HostProcess]]:
    args = ["--harness", f"slow={slow_harness.address}", "--lease-ttl", "1"]
    hosts = [HostProcess(pg_url, tmp_path, args, name=name) for name in ("host-a", "host-b")]
    async with started(hosts, thaw=True):
        yield hosts


async def test_a_frozen_writer_is_recovered_elsewhere_and_fenced(
    short_lease_replicas: list[HostProcess], pg_url: str
) -> None:
    """A replica that stops renewing its lease (frozen here with SIGSTOP) loses the turn: the other
    recovers it from the journal under a newer fence, and the frozen one, thawed, is refused."""
    a, _ = short_lease_replicas
    uid = await create(a)
    slow = a.sessions.Exec(turn(uid, "slow", delay_s=3.0))
    first = [await slow.read() for _ in range(3)]  # session frame, EXECUTION_START, INPUT: durable
    start = first[1].record
    assert start.event.kind == K.EVENT_EXECUTION_START
    assert a.process is not None
    a.process.send_signal(signal.SIGSTOP)
    store = await open_store(pg_url)
    try:
        async with asyncio.timeout(60):
            while True:  # B's recoverer takes the expired lease and finishes the turn
                records = await store.read(uid)
                if any(r.event.kind == K.EVENT_END for r in records):
                    break
                await asyncio.sleep(0.1)
        a.process.send_signal(signal.SIGCONT)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            while await slow.read() != grpc.aio.EOF:
                pass
        assert err.value.code() == grpc.StatusCode.ABORTED
        records = await store.read(uid)
        assert await store.verify(uid) == len(records)
    finally:
        await store.close()
    ends = [r for r in records if r.event.kind == K.EVENT_END]
    assert len(ends) == 1 and ends[0].event.execution_id == start.event.execution_id
    assert ends[0].event.end.state == "COMPLETED"
    texts = [p.text.text for r in records if r.event.kind == K.EVENT_OUTPUT for p in r.event.message.parts]
    assert texts == ["echo:slow"]
    assert records[-1].event.lifecycle.kind == common_pb2.Lifecycle.LIFECYCLE_RESUME
    assert ends[0].fence > start.fence  # B's incarnation superseded A's


async def test_a_watcher_on_one_replica_sees_the_turns_of_the_other(replicas: list[HostProcess]) -> None:
    """Replica B follows a session whose turns replica A runs (PostgreSQL LISTEN/NOTIFY tells B)."""
    a, b = replicas
    uid = await create(a)
    watched: list[live_pb2.WatchUpdate] = []
    opened = asyncio.Event()
    async with SessionsClient.connect(b.address) as watcher:

        async def follow() -> None:
            async for update in watcher.watch(uid):
                watched.append(update)
                opened.set()
                if update.HasField("record") and update.record.seq == 10:
                    return

        following = asyncio.create_task(follow())
        # B's watch is open (its first frame, the session as it is, has arrived) before A writes.
        async with asyncio.timeout(60):
            await opened.wait()
        await run(a, turn(uid, "one"))
        await run(a, turn(uid, "two", delay_s=0.2))
        async with asyncio.timeout(60):
            await following
    async with SessionsClient.connect(a.address) as client:
        journal = [r async for r in client.replay(uid)]
    assert [u.record for u in watched if u.HasField("record")] == journal
    states = [u.session.exec_state for u in watched if u.HasField("session")]
    assert states[0] == session_pb2.EXEC_PENDING and session_pb2.EXEC_RUNNING in states


async def test_a_turn_queued_on_one_replica_runs_after_the_turn_of_the_other(
    replicas: list[HostProcess],
) -> None:
    a, b = replicas
    uid = await create(a)
    slow = a.sessions.Exec(turn(uid, "first", delay_s=1.0))
    assert (await slow.read()).WhichOneof("update") == "session"
    assert (await slow.read()).record.event.kind == K.EVENT_EXECUTION_START
    async with SessionsClient.connect(b.address) as client:
        queued = await client.live.Submit(
            live_pb2.SubmitRequest(exec=turn(uid, "second"), on_busy=live_pb2.ON_BUSY_ENQUEUE)
        )
        assert queued.queued
        while await slow.read() != grpc.aio.EOF:
            pass
        ends = 0
        async with asyncio.timeout(60):
            async for update in client.watch(uid):
                if update.HasField("record") and update.record.event.kind == K.EVENT_END:
                    ends += 1
                    if ends == 2:
                        break
        journal = [r async for r in client.replay(uid)]
    inputs = [p.text.text for r in journal if r.event.kind == K.EVENT_INPUT for p in r.event.message.parts]
    assert inputs == ["first", "second"]
    starts = [r.event.execution_id for r in journal if r.event.kind == K.EVENT_EXECUTION_START]
    assert starts[1] == queued.queued_execution_id


async def test_an_idempotency_key_holds_across_replicas(replicas: list[HostProcess]) -> None:
    """A retry sent to the other replica does the work once: an Exec still running on A is streamed
    from B, live; a Fork made on A is returned by B."""
    a, b = replicas
    uid = await create(a)
    key = (("idempotency-key", "replicated-turn"),)
    original = a.sessions.Exec(turn(uid, "once", delay_s=1.0), metadata=key)
    assert (await original.read()).WhichOneof("update") == "session"
    assert (await original.read()).record.event.kind == K.EVENT_EXECUTION_START
    retried = [u async for u in b.sessions.Exec(turn(uid, "once", delay_s=1.0), metadata=key)]
    rest = []
    while (update := await original.read()) != grpc.aio.EOF:
        rest.append(update)
    records = [u.record for u in retried if u.WhichOneof("update") == "record"]
    assert [r.seq for r in records] == [1, 2, 3, 4, 5]
    assert records[-1].event.end.state == "COMPLETED"
    async with SessionsClient.connect(a.address) as client:
        assert [r async for r in client.replay(uid)] == records
        children = await client.fork(uid, count=2, idempotency_key="replicated-fork")
    async with SessionsClient.connect(b.address) as client:
        again = await client.fork(uid, count=2, idempotency_key="replicated-fork")
    assert [c.metadata.uid for c in again] == [c.metadata.uid for c in children]
